"""The job summary: what a user (and a regulator) wants to see at the end of ``retrain``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from insitu.federated.documents.summary import BINARY_METRIC_NAMES
from insitu.federated.exchange import Exchange
from insitu.federated.paths import EVALUATION, PREPARE_STATS, async_update, update
from insitu.job import JobSpec

if TYPE_CHECKING:
    from insitu.federated.coordinator import RoundsOutcome


def job_summary(
    job_id: str,
    conf: JobSpec,
    prepare: dict[str, dict[str, Any]],
    rounds: list[dict[str, Any]],
    site_metrics: dict[str, dict[str, float]],
    global_metrics: dict[str, float],
    registration: dict[str, Any],
    ledger: dict[str, dict[str, int]],
    started: datetime,
    identities: dict[str, dict[str, Any]] | None = None,
    withheld: dict[str, list[str]] | None = None,
    selection: RoundsOutcome | None = None,
    alerts: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A JSON-able summary. ``ledger`` is the exchange's bytes per writer and kind; ``withheld`` names, per
    statistic or plot, the sites the row floor left out of it."""
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
        "config_hash": conf.config_hash,
        "rounds": len(rounds),
        "rounds_detail": [{"round": r["round"], "sites": r["sites"], "missing": r["missing"],
                           "rejected": r.get("rejected", {}), "seconds": r.get("seconds")} for r in rounds],
        "sites": sites,
        "global_metrics": global_metrics,
        "bytes_crossed": crossed,
        "bytes_crossed_by_writer": ledger,
        "raw_bytes": sum(v["raw_bytes"] for v in sites.values()),
        "model": registration,
        "ran_as": identities or {},
        "started": started.isoformat(),
        "finished": datetime.now(UTC).isoformat(),
        "withheld": {k: sorted(v) for k, v in (withheld or {}).items() if v},
        "task": conf.training.task.name,
        "selected_round": selection.selected if selection else len(rounds),
        "selection": selection.reason if selection else "the last round",
        "stopped_early": bool(selection and selection.stopped_early),
        "validation": [{"round": h.round, "value": h.value, "sites": h.sites} for h in selection.selection.history]
        if selection else [],
        "metric_names": list(conf.task.summary_metrics),
        # Sites whose reported numbers were refused or disagreed with the other sites' (insitu.federated.claims,
        # insitu.federated.consensus): named, with why, for whoever reads the job's outcome.
        "suspects": {s: list(why) for s, why in selection.selection.suspects.items()} if selection else {},
        "alerts": alerts or [],  # paused pools, forced site runs (insitu.governance.run_alerts)
    }


def withheld_by_floor(evaluated: dict[str, dict[str, Any]], model: str) -> dict[str, list[str]]:
    """Which sites the row floor left out of the job's test metrics and (binary task) of its PR curve."""
    out = {"test metrics": sorted(s for s, m in evaluated.items() if "withheld" in m.get(model, {}))}
    if any(m.get(model, {}).get("task", "binary") == "binary" for m in evaluated.values()):
        out["PR curve"] = sorted(s for s, m in evaluated.items() if "hist_pos" not in m.get(model, {}))
    return out


def withheld_line(summary: dict[str, Any]) -> str | None:
    """One sentence for the CLI, or None when no site was left out."""
    parts = [f"{what}: {', '.join(sites)}" for what, sites in summary.get("withheld", {}).items() if sites]
    return ("left out by the row floor (too few rows to publish) — " + "; ".join(parts)) if parts else None


def collect_identities(
    ex: Exchange, coordinator: dict[str, str], sites: list[str], eval_sites: list[str], n_rounds: int
) -> dict[str, dict[str, Any]]:
    """Which identity ran each step, as each site recorded it in what it published (prepare, last round
    trained, evaluate); the coordinator's own for plan, aggregation and registration."""
    out: dict[str, dict[str, Any]] = {"coordinator": {"plan, aggregate, register": coordinator}}
    for s in sites:
        steps: dict[str, Any] = {"prepare": ex.get_json(PREPARE_STATS, writer=s).get("ran_as")}
        trained = [r for r in range(n_rounds) if ex.exists(update(r).manifest, writer=s)]
        if trained:
            steps["train"] = ex.get_json(update(trained[-1]).manifest, writer=s).get("ran_as")
        elif ex.exists(async_update(0).manifest, writer=s):
            # an async job's updates are numbered by the site, not by round: its last one
            last = 0
            while ex.exists(async_update(last + 1).manifest, writer=s):
                last += 1
            steps["train"] = ex.get_json(async_update(last).manifest, writer=s).get("ran_as")
        if s in eval_sites:
            steps["evaluate"] = ex.get_json(EVALUATION, writer=s).get("ran_as")
        out[s] = steps
    return out


# What the summary names each task's metrics; a metric without an entry is shown by its own name.
METRIC_TITLES = {"roc_auc": "ROC-AUC", "pr_auc": "PR-AUC", "loss": "test loss", "macro_f1": "macro-F1",
                 "log_loss": "log-loss", "rmse": "RMSE", "mae": "MAE", "r2": "R²"}
BINARY_METRICS = BINARY_METRIC_NAMES  # what a summary written before tasks named their metrics shows


def summary_columns(s: dict[str, Any]) -> list[str]:
    """The per-site table's column titles: the job's task's metrics between the data and the bytes."""
    metrics = [METRIC_TITLES.get(m, m) for m in s.get("metric_names", BINARY_METRICS)]
    return ["site", "rows prepared", "quarantined", "unreadable shards", "rounds", *metrics, "test rows",
            "bytes to exchange", "raw bytes (stayed)"]


def summary_rows(s: dict[str, Any]) -> list[list[str]]:
    """The per-site table (and its global row) as text cells, in :func:`summary_columns` order."""
    names = s.get("metric_names", BINARY_METRICS)

    def f4(m: dict[str, float], k: str) -> str:
        return f"{m.get(k, float('nan')):.4f}"

    rows = []
    for name, v in s["sites"].items():
        m = v["metrics"]
        rows.append([name, f"{v['rows_prepared']:,}", f"{v['rows_quarantined']:,}",
                     ", ".join(v["shards_unreadable"]) or "-", str(v["rounds_contributed"]),
                     *(f4(m, k) for k in names), f"{int(m.get('count', 0)):,}",
                     f"{sum(v['bytes_to_exchange'].values()):,}", f"{v['raw_bytes']:,}"])
    g = s["global_metrics"]
    coord = sum(s["bytes_crossed_by_writer"].get("coordinator", {}).values())
    rows.append(["global", "", "", "", "", *(f4(g, k) for k in names), f"{int(g.get('count', 0)):,}",
                 f"{s['bytes_crossed']:,} (coordinator {coord:,})", f"{s['raw_bytes']:,}"])
    return rows


def identity_lines(s: dict[str, Any]) -> list[str]:
    """One line per actor: its steps and the identity (OS user, pool) each ran as."""
    order = ["plan, aggregate, register", "prepare", "train", "evaluate"]  # the job's order (JSON sorts keys)
    lines = []
    ran_as = s.get("ran_as", {})
    for actor in sorted(ran_as, key=lambda a: (a != "coordinator", a)):
        steps = ran_as[actor]
        parts = [f"{step} as {who['os_user']} on pool {who['pool']}" if who else f"{step}: not recorded"
                 for step, who in sorted(steps.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 9)]
        lines.append(f"{actor}: " + "; ".join(parts))
    return lines


def summary_markdown(s: dict[str, Any]) -> str:
    gate = s["model"].get("gate", {})
    lines = [
        f"## insitu job `{s['job_id']}`",
        "",
        f"Model **{s['model']['model_name']}** version **{s['model']['version']}** → alias "
        f"`{s['model']['alias']}`; {s['rounds']} federated rounds"
        f"{' (stopped early)' if s.get('stopped_early') else ''}; registered global model "
        f"{s.get('selected_round', s['rounds'])}: {s.get('selection', 'the last round')}; config `{s['config_hash']}`.",
        "",
        f"Gate: **{'passed' if gate.get('passed') else 'failed'}** — {gate.get('reason', 'n/a')}",
        "",
        "| " + " | ".join(summary_columns(s)) + " |",
        "|---|" + "---:|" * (len(summary_columns(s)) - 1),
        *("| " + " | ".join(r) + " |" for r in summary_rows(s)),
        "",
        f"Bytes that crossed a border: **{s['bytes_crossed']:,}** (weights, updates, statistics, metrics); "
        f"the raw data would have been **{s['raw_bytes']:,}** bytes. No row left its site.",
        "",
        "Who ran each step (from each site's own identity file):",
        "",
        *(f"- {line}" for line in identity_lines(s)),
    ]
    if (line := withheld_line(s)) is not None:
        lines += ["", line]
    if s.get("suspects"):
        lines += ["", "Sites whose reported numbers were refused or disagreed with the others:", "",
                  *(f"- {site}: {'; '.join(why)}" for site, why in sorted(s["suspects"].items()))]
    if s.get("alerts"):  # denial of service seen during the job: someone with the Prefect credential
        lines += ["", "**Alerts** (audited by the coordinator):", "",
                  *(f"- `{a['kind']}` {a['site']} ({a['phase']}): {a['detail']}" for a in s["alerts"])]
    return "\n".join(lines)
