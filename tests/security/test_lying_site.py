"""A site that lies about its numbers, on the real platform: it cannot buy weight, kill the job or pick the round.

The attacker is code running as site apac during a real job, with apac's own exchange keys (IAM lets a site
write anything under its own prefix): as soon as apac has published an update, it rewrites the manifest to claim
10^15 training rows (FedAvg weighs by it; the sum once overflowed the coordinator's own manifest and killed the
job), and rewrites its validation of the global model: round 0 with PR-AUC 1.0 over 10^12 rows (out of range),
round 1 with PR-AUC 1.0 over exactly its committed validation rows (in range: only a robust combination stops
it). The honest sites eu and us are slowed by their own operators so that apac's rewrite lands before the
coordinator reads the round.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
import s3fs
from platform_helpers import (
    EXCHANGE,
    coordinator_exchange,
    e2e_name,
    job_events,
    job_summary,
    shipped_training,
    slow_sites,
    start_retrain,
    wait_for_flow_run,
    write_training,
)

from deployments.platform import Platform

pytestmark = pytest.mark.e2e

LIAR = "apac"
ROUNDS = 2


def _liar_hook(platform: Platform, job: str, stop: threading.Event, done: dict[str, Any]) -> None:
    """What apac's own code does: rewrite its update manifest and validations as they appear (apac's keys)."""
    fs = s3fs.S3FileSystem(**platform.storage_options("exchange", LIAR))
    root = f"{EXCHANGE}/jobs/{job}"
    committed = None
    for rnd in range(ROUNDS):
        manifest = f"{root}/update/{LIAR}/round-{rnd:04d}.manifest.json"
        while not stop.is_set():
            fs.invalidate_cache()
            if fs.exists(manifest):
                break
            time.sleep(0.1)
        if stop.is_set():
            return
        if committed is None:
            committed = json.loads(fs.cat(f"{root}/stats/{LIAR}/prepare.json"))["split_counts"]
        fake = {"task": "binary", "roc_auc": 1.0, "pr_auc": 1.0, "loss": 0.0, "positive_rate": 0.5}
        if rnd == 0:  # weight: claim 10^15 rows; metrics: 10^12 rows, out of range
            man = json.loads(fs.cat(manifest))
            fs.pipe(manifest, json.dumps({**man, "n_samples": 10**15}).encode())
            fake["count"] = 1e12
        else:  # in range: exactly the validation rows apac committed to
            fake["count"] = float(committed["val"])
        doc = {"site": LIAR, "round": rnd, "metrics": fake}
        fs.pipe(f"{root}/metrics/{LIAR}/validation-round-{rnd:04d}.json", json.dumps(doc).encode())
        done[rnd] = time.monotonic()
    done["committed"] = committed


def test_a_lying_site_is_refused_audited_and_named_and_the_job_goes_on(deployed: Platform, shared_conf: Any,
                                                                        signer: Any) -> None:
    name, job = e2e_name("liar"), e2e_name("liar-job")
    cfg = shipped_training(deployed.conf_dir, "fraud")
    cfg.pop("aggregator", None)  # the default: median for the demo's 3 sites
    cfg.update(rounds=ROUNDS, strategy="single", ranks_per_site=1, registry={"model_name": name},
               federation={"min_sites": 2, "round_deadline_s": 120})
    write_training(shared_conf, name, cfg)
    stop, done = threading.Event(), {}
    hook = threading.Thread(target=_liar_hook, args=(deployed, job, stop, done), daemon=True)
    with slow_sites(deployed, job, {"eu": 6.0, "us": 6.0}):
        hook.start()
        try:
            run_id = start_retrain({"training": name, "dataset": "fraud", "job_id": job,
                                    "request": signer(name, job)})
            run = wait_for_flow_run(run_id, timeout=900)
        finally:
            stop.set()
            hook.join(timeout=10)
    assert 0 in done and 1 in done, f"the liar never got to lie: {done}"
    # The job does not die: the liar's update is refused for round 0, the round goes on with the honest sites.
    assert run.state is not None and run.state.is_completed(), f"retrain ended {run.state_name}"
    summary = job_summary(deployed, job)
    first, second = summary["rounds_detail"]
    assert first["sites"] == ["eu", "us"] and "integrity.n-samples" in first["rejected"][LIAR]
    assert LIAR in second["sites"]  # its honest update of round 1 counts

    # The refusal is on the coordinator's audit log: site, round, the rows claimed and committed, the rule.
    committed = done["committed"]
    (refused,) = job_events(deployed, "coordinator", job, "update.refused")
    f = refused["fields"]
    assert (f["site"], f["round"], f["rule"]) == (LIAR, 0, "integrity.n-samples")
    assert f["claimed"] == 1e15 and f["committed"] == committed["train"]
    metrics_refused = job_events(deployed, "coordinator", job, "metrics.refused")
    assert any(e["fields"]["site"] == LIAR and e["fields"]["rule"] == "integrity.metrics-range"
               and e["fields"]["claimed"] == 1e12 and e["fields"]["committed"] == committed["val"]
               for e in metrics_refused), metrics_refused

    # The fake validations did not choose the round: round 0's was refused, round 1's is outvoted (median).
    history = {h["round"]: h for h in summary["validation"]}
    assert LIAR not in history[0]["sites"]
    ex = coordinator_exchange(deployed)
    honest = [json.loads(ex.fs.cat(f"{EXCHANGE}/jobs/{job}/metrics/{s}/validation-round-0001.json"))
              ["metrics"]["pr_auc"] for s in ("eu", "us")]
    assert LIAR in history[1]["sites"] and history[1]["value"] == pytest.approx(max(honest))  # median of 3
    assert all(h["value"] < 0.9 for h in history.values()), history
    # … and the liar is named in the summary, with why.
    reasons = " ".join(summary["suspects"][LIAR])
    assert "integrity.n-samples" in reasons and "integrity.metrics-range" in reasons
    assert "differs from the sites' median" in reasons
    assert set(summary["suspects"]) == {LIAR}, summary["suspects"]
