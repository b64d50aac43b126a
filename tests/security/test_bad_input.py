"""Bad input, fed to a site the way a careless or hostile data owner would, on the running platform.

Found on the platform as it was: a shard with a 100 MB header line ran a site's prepare for over 13 minutes with
no error; a CSV with an unterminated quote turned 49 lines into one quarantined row (48 valid rows lost, silently);
an unsigned S3 request got HTTP 500. Now each shard is measured against the site's own limits (its signed policy's
``limits``) before any parser reads it, refused with the shard and the limit named, quarantined with the reason and
audited (``data.refused``); a CSV is read line by line; an unsigned request gets S3's 403 with a reason.

The limits are set small in the site's policy (applied by the site's admin, as ``insitu policy apply --limit``
does) rather than writing 100 MB files. The shipped datasets have no CSV shard, so the CSV cases run the site's
own ``prepare_shard`` (the function its Dask task runs) against the site's real S3 store with the site's keys.
"""

from __future__ import annotations

import io
import json
import urllib.error
import urllib.request
import uuid
from typing import Any

import pandas as pd
import pytest
from platform_helpers import (
    e2e_name,
    flow_runs_named,
    job_events,
    run_dispatched,
    shipped_training,
    site_store,
    start_retrain,
    wait_for_flow_run,
    wait_for_flow_runs,
    write_training,
)

from deployments.cli import signing as governance
from deployments.platform import COORDINATOR, Platform
from insitu.conf import ShardConfig, load_conf
from insitu.data.limits import ShardLimits
from insitu.data.prepare import prepare_shard, quarantine_prefix
from insitu.data.synthetic import generate
from insitu.governance.policy import Limits

pytestmark = pytest.mark.e2e
SITE, BUCKET = "eu", "insitu-eu"
DEFAULT_LIMITS = ShardLimits().model_dump()


def _prepare(p: Platform, signer: Any, job_id: str) -> Any:
    return run_dispatched(p, f"site-prepare/{SITE}", {"job_id": job_id, "shards": ["eu-000", "eu-001"],
                                                      "request": signer(job_id=job_id)}, timeout=300)


def _refused(p: Platform, job_id: str) -> list[dict[str, Any]]:
    return [e["fields"] for e in job_events(p, SITE, job_id, "data.refused")]


def test_oversized_and_too_wide_shards_are_refused_before_parsing_and_audited(deployed: Platform,
                                                                                signer: Any) -> None:
    store = site_store(deployed, SITE)
    good, target = f"{BUCKET}/raw/fraud/part-000.parquet", f"{BUCKET}/raw/fraud/part-001.parquet"
    original = store.fs.cat_file(target)
    frame = pd.read_parquet(io.BytesIO(original))
    limit = store.fs.size(good) + 2048  # eu-000 fits; a shard three times eu-001's rows does not
    try:
        # 1. An oversized shard: refused from its size alone (the store's metadata), the other shard goes on.
        store.fs.pipe_file(target, pd.concat([frame] * 3).to_parquet(index=False))
        governance.apply(deployed, SITE, f"{SITE}-admin", None, None, None, {"max_shard_bytes": limit})
        job_id = f"e2e-big-shard-{uuid.uuid4().hex[:6]}"
        fr = _prepare(deployed, signer, job_id)
        assert fr.state.is_completed(), fr.state.message
        (refusal,) = _refused(deployed, job_id)
        assert refusal["shard"] == "eu-001" and refusal["rule"] == "limits.max-shard-bytes"
        assert "shard eu-001 refused before parsing" in refusal["reason"]
        assert f"limits.max_shard_bytes = {limit}" in refusal["reason"] and "site's policy" in refusal["reason"]
        reads = {e["fields"]["shard"]: e["fields"] for e in job_events(deployed, SITE, job_id, "data.read")}
        assert reads["eu-001"]["rows"] == 0 and reads["eu-000"]["rows"] > 0 and reads["eu-000"]["error"] is None
        reason = json.loads(store.fs.cat_file(f"{BUCKET}/{quarantine_prefix('fraud', job_id)}/eu-001.reason.json"))
        assert reason["rule"] == "limits.max-shard-bytes"

        # 2. A shard as wide as the long header of the issue: its Parquet footer has more columns than allowed.
        wide = frame.assign(**{f"pad_{i}": "x" for i in range(20)})
        store.fs.pipe_file(target, wide.to_parquet(index=False))
        governance.apply(deployed, SITE, f"{SITE}-admin", None, None, None,
                         {"max_shard_bytes": DEFAULT_LIMITS["max_shard_bytes"], "max_columns": 12})
        job_id = f"e2e-wide-shard-{uuid.uuid4().hex[:6]}"
        fr = _prepare(deployed, signer, job_id)
        assert fr.state.is_completed(), fr.state.message
        (refusal,) = _refused(deployed, job_id)
        assert refusal["rule"] == "limits.max-columns" and "30 is over limits.max_columns = 12" in refusal["reason"]
    finally:
        store.fs.pipe_file(target, original)
        governance.apply(deployed, SITE, f"{SITE}-admin", None, None, None, DEFAULT_LIMITS)
    assert Limits.model_validate(json.loads(deployed.policy_file(SITE).read_text())["policy"]["limits"]) == Limits()


def _csv_lines() -> list[str]:
    return generate(SITE, 48, seed=5).to_csv(index=False).splitlines()  # a header and 48 rows: 49 lines


def test_csv_shards_at_a_sites_store_lose_only_their_malformed_lines(deployed: Platform) -> None:
    store = site_store(deployed, SITE)
    conf = load_conf("fraud", directory=deployed.conf_dir)
    schema, split = conf.dataset.schema_, conf.training.split
    lines = _csv_lines()
    lines[7] = lines[7].replace(",", ',"', 1)  # line 8 opens a quote that never closes
    path = f"raw/e2e-bad-input/{uuid.uuid4().hex[:6]}.csv"
    store.fs.pipe_file(f"{BUCKET}/{path}", ("\n".join(lines) + "\n").encode())
    shard = ShardConfig(id="eu-csv", site=SITE, path=path)
    try:
        job_id = f"e2e-quote-{uuid.uuid4().hex[:6]}"
        rep = prepare_shard(store, shard, schema, split, 7, "fraud", job_id, Limits())
        assert rep.error is None and rep.malformed_lines == [8]
        assert (rep.rows_read, rep.rows_quarantined, rep.rows_prepared) == (48, 1, 47)
        quarantined = json.loads(store.fs.cat_file(
            f"{BUCKET}/{quarantine_prefix('fraud', job_id)}/eu-csv.malformed-lines.json"))
        assert quarantined["lines"][0]["line"] == 8 and "quotes do not close" in quarantined["lines"][0]["reason"]

        # A header line longer than the site allows: refused from a bounded read, nothing parsed.
        long_header = [lines[0] + ",pad" + "d" * 200, *lines[1:]]
        store.fs.pipe_file(f"{BUCKET}/{path}", ("\n".join(long_header) + "\n").encode())
        job_id = f"e2e-long-line-{uuid.uuid4().hex[:6]}"
        rep = prepare_shard(store, shard, schema, split, 7, "fraud", job_id, Limits(max_line_bytes=128))
        assert rep.refused_rule == "limits.max-line-bytes" and rep.rows_read == 0
        assert rep.error and "shard eu-csv refused before parsing" in rep.error and "line 1" in rep.error
    finally:
        store.fs.rm(f"{BUCKET}/{path}")


def test_an_unsigned_s3_request_gets_403_with_a_reason(deployed: Platform) -> None:
    endpoint = deployed.storage_options(SITE, SITE)["client_kwargs"]["endpoint_url"]
    for method, url in (("GET", f"{endpoint}/{BUCKET}/raw/fraud/part-000.parquet"), ("GET", f"{endpoint}/{BUCKET}"),
                        ("PUT", f"{endpoint}/{BUCKET}/raw/planted.csv")):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(url, data=b"x" if method == "PUT" else None,
                                                          method=method), timeout=10)
        body = e.value.read()
        assert e.value.code == 403 and b"<Code>AccessDenied</Code>" in body and b"sign the request" in body


def test_a_stalled_prepare_cannot_hold_a_job_beyond_its_deadline(deployed: Platform, signer: Any,
                                                                  shared_conf: Any) -> None:
    """A deadline no site can meet (1 s: starting a site's run alone takes longer) stands for a stalled site:
    each is left out with the reason, its run cancelled, and the quorum rule ends the job, audited."""
    cfg = shipped_training(deployed.conf_dir, "fraud")
    cfg.setdefault("federation", {})["prepare_deadline_s"] = 1
    training = write_training(shared_conf, e2e_name("prepare-deadline"), cfg).stem
    job_id = e2e_name("prepare-deadline")
    fr = wait_for_flow_run(start_retrain({"training": training, "dataset": "fraud", "job_id": job_id,
                                          "request": signer(training, job_id)}), 300)
    assert fr.state.is_failed() and "missed the prepare deadline" in fr.state.message, fr.state.message
    assert "federation.prepare_deadline_s" in fr.state.message
    (failed,) = job_events(deployed, COORDINATOR, job_id, "job.failed")
    assert failed["fields"]["phase"] == "prepare"
    assert all("missed the prepare deadline" in why for why in failed["fields"]["failed_sites"].values())
    # Each site's run is stopped, whether the coordinator found it still Scheduled, held by its worker (Pending:
    # a fork's engine would bring a run forced Cancelled back to Running) or Running.
    site_runs = wait_for_flow_runs([r.id for r in flow_runs_named(job_id) if r.id != fr.id], 120)
    assert site_runs and all(r.state.is_cancelled() for r in site_runs), \
        [(r.name, r.state_name, r.state.message) for r in site_runs]
