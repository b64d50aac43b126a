"""The job summary: what a user (and a regulator) wants to see at the end of ``retrain``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from insitu.config import Conf


def job_summary(
    job_id: str,
    conf: Conf,
    prepare: dict[str, dict[str, Any]],
    rounds: list[dict[str, Any]],
    site_metrics: dict[str, dict[str, float]],
    global_metrics: dict[str, float],
    registration: dict[str, Any],
    ledger: dict[str, dict[str, int]],
    started: datetime,
) -> dict[str, Any]:
    """A JSON-able summary. ``ledger`` is the exchange's bytes per writer and kind."""
    sites = {}
    for s, p in prepare.items():
        sites[s] = {
            "rows_read": p["rows_read"],
            "rows_prepared": p["rows_prepared"],
            "rows_quarantined": p["rows_quarantined"],
            "shards_unreadable": p["shards_unreadable"],
            "split_counts": p["split_counts"],
            "raw_bytes": p.get("raw_bytes", 0),
            "rounds_contributed": sum(1 for r in rounds if s in r["sites"]),
            "metrics": site_metrics.get(s, {}),
            "bytes_to_exchange": ledger.get(s, {}),
        }
    crossed = sum(sum(k.values()) for k in ledger.values())
    return {
        "job_id": job_id,
        "dataset": conf.dataset_name,
        "config_hash": conf.config_hash(),
        "rounds": len(rounds),
        "rounds_detail": [{"round": r["round"], "sites": r["sites"], "missing": r["missing"]} for r in rounds],
        "sites": sites,
        "global_metrics": global_metrics,
        "bytes_crossed": crossed,
        "bytes_crossed_by_writer": ledger,
        "raw_bytes": sum(v["raw_bytes"] for v in sites.values()),
        "model": registration,
        "started": started.isoformat(),
        "finished": datetime.now(UTC).isoformat(),
    }


def summary_markdown(s: dict[str, Any]) -> str:
    lines = [
        f"## insitu job `{s['job_id']}`",
        "",
        f"Model **{s['model']['model_name']}** version **{s['model']['version']}** → alias "
        f"`{s['model']['alias']}`; {s['rounds']} federated rounds; config `{s['config_hash']}`.",
        "",
        f"Gate: **{'passed' if s['model'].get('gate', {}).get('passed') else 'failed'}** — "
        f"{s['model'].get('gate', {}).get('reason', 'n/a')}",
        "",
        "| site | rows prepared | quarantined | unreadable shards | rounds | PR-AUC | ROC-AUC | test rows "
        "| bytes to exchange |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for name, v in s["sites"].items():
        m = v["metrics"]
        lines.append(
            f"| {name} | {v['rows_prepared']} | {v['rows_quarantined']} | {', '.join(v['shards_unreadable']) or '-'} "
            f"| {v['rounds_contributed']} | {m.get('pr_auc', float('nan')):.4f} | {m.get('roc_auc', float('nan')):.4f} "
            f"| {int(m.get('count', 0))} | {sum(v['bytes_to_exchange'].values())} |"
        )
    g = s["global_metrics"]
    lines += [
        f"| **global** | | | | | **{g.get('pr_auc', float('nan')):.4f}** | **{g.get('roc_auc', float('nan')):.4f}** "
        f"| {int(g.get('count', 0))} | {s['bytes_crossed']} |",
        "",
        f"Bytes that crossed a border: **{s['bytes_crossed']:,}** (weights, updates, statistics, metrics); "
        f"the raw data would have been **{s['raw_bytes']:,}** bytes. No row left its site.",
    ]
    return "\n".join(lines)
