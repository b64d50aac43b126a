"""Each site behind its own WAN border on the shared platform: a job crosses the relays and registers, with eu's
border cut mid-job for less than the round deadline (nothing lost) and for more (the round goes on without eu, its
late update is refused as stale and audited, eu rejoins the next round); a cut border holds its site's traffic
(no reset) until restored; a border taken off leaves the site direct again.

The borders are set on the running platform (``insitu up --wan``'s path: the profile recorded, then ``up``), and
taken off at the end so the tests after this one run on loopback as before.
"""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from mlflow.tracking import MlflowClient
from platform_helpers import (
    EXCHANGE,
    coordinator_exchange,
    job_events,
    shipped_training,
    start_retrain,
    wait_for_file,
    wait_for_flow_run,
    write_training,
)

from deployments.platform import Platform
from deployments.platform.actors import COORDINATOR
from deployments.platform.health import prefect_headers
from deployments.platform.wan_relay import stats_file
from insitu.federated.claims import STALE_RULE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]
RTT_MS = 20.0
DEADLINE_S = 60.0  # round 0 holds the site flows' start (20-30 s on a loaded 2-core CI); the long cut outlasts this


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def _prefect_health(url: str, auth: str, timeout: float) -> bool:
    try:
        return httpx.get(f"{url}/health", headers=prefect_headers(auth), timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_job_crosses_every_border_and_a_cut_border_holds_its_site(deployed: Platform, shared_conf: Path,
                                                                   signer: Any) -> None:
    p = deployed
    sites = p.sites.names
    p.borders.record({s: {"rtt_ms": RTT_MS} for s in sites})
    try:
        started = p.up()["started"]
        assert {f"wan-{s}" for s in sites} <= set(started), started
        assert {f"worker-{p.work_pool(s)}" for s in sites} <= set(started), started  # restarted behind the border
        for s in sites:  # the running worker's own environment: the control plane only through its relay
            env = _environ(p.state["pids"][f"worker-{p.work_pool(s)}"])
            assert env["PREFECT_API_URL"] == f"http://127.0.0.1:{p.state['ports'][f'wan-{s}-prefect']}/api"
            assert env["INSITU_EXCHANGE_S3_ENDPOINT"].endswith(f":{p.state['ports'][f'wan-{s}-s3-exchange']}")
            assert env[f"INSITU_{s.upper()}_S3_ENDPOINT"] == p.s3_endpoint(s)  # its own store stays inside

        # ---- a job across the borders, to a registered model. eu's border is cut twice while it runs: shorter
        # than the round deadline in round 0 (its calls are held, then answered: nothing lost, it is in the round)
        # and longer in round 1 (the round closes without eu; its update, published once the link is back, is
        # refused as stale and audited, not merged; eu takes part again in round 2)
        model = f"insitu-e2e-wan-{uuid.uuid4().hex[:6]}"
        cfg = shipped_training(p.conf_dir, "fraud")
        cfg.update(rounds=3, local_epochs=1, strategy="single", ranks_per_site=1, registry={"model_name": model})
        cfg["federation"] = {**cfg.get("federation", {}), "min_sites": 2, "round_deadline_s": DEADLINE_S}
        training = write_training(shared_conf, f"e2e-wan-{uuid.uuid4().hex[:6]}", cfg).stem
        job = f"e2e-wan-{uuid.uuid4().hex[:6]}"
        ex, root = coordinator_exchange(p), f"{EXCHANGE}/jobs/{job}/weights/coordinator"
        started_run = start_retrain({"training": training, "dataset": "fraud", "job_id": job,
                                     "request": signer(training, job)})
        wait_for_file(ex, f"{root}/round-0000.manifest.json", 600, "the job never reached round 0")
        p.borders.cut("eu")
        time.sleep(5)
        p.borders.restore("eu")
        wait_for_file(ex, f"{root}/round-0001.manifest.json", 600, "round 0 was never aggregated")
        p.borders.cut("eu")
        try:
            wait_for_file(ex, f"{root}/round-0002.manifest.json", 600, "round 1 was never aggregated")
        finally:
            p.borders.restore("eu")
        run = wait_for_flow_run(started_run, 900, poll_s=2)
        assert run.state.is_completed(), run.state.message
        members = [sorted(json.loads(ex.fs.cat_file(f"{root}/round-{r + 1:04d}.manifest.json"))["sites"])
                   for r in range(3)]
        assert members == [sorted(sites), sorted(s for s in sites if s != "eu"), sorted(sites)], members
        stale = [e["fields"] for e in job_events(p, COORDINATOR, job, "update.refused")]
        assert [(f["site"], f["round"], f["rule"]) for f in stale] == [("eu", 1, STALE_RULE)], stale
        (mv,) = MlflowClient(p.mlflow_url).search_model_versions(f"name = '{model}'")
        assert mv.tags["job_id"] == job
        for s in sites:  # every site's traffic to both servers crossed its relay
            traffic = json.loads(stats_file(p.borders.config_file(s)).read_text())
            for server in ("s3-exchange", "prefect"):
                crossed = traffic[str(p.state["ports"][server])]
                assert crossed["round_trips"] > 0 and crossed["up_bytes"] > 0, (s, server, crossed)

        # ---- a cut border holds its site's requests (no reset) and delivers them once restored
        relay_api = f"http://127.0.0.1:{p.state['ports']['wan-eu-prefect']}/api"
        assert _prefect_health(relay_api, p.prefect_auth, 10)
        p.borders.cut("eu")
        with pytest.raises(httpx.ReadTimeout):  # held: no answer and no reset
            httpx.get(f"{relay_api}/health", headers=prefect_headers(p.prefect_auth), timeout=2)
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(_prefect_health, relay_api, p.prefect_auth, 60)  # asked during the cut
            assert _prefect_health(p.prefect_api_url, p.prefect_auth, 10)  # the control plane itself is up
            assert _prefect_health(f"http://127.0.0.1:{p.state['ports']['wan-us-prefect']}/api", p.prefect_auth,
                                   10)  # and another site's border is not cut
            assert not held.done()
            p.borders.restore("eu")
            assert held.result(timeout=60)  # answered, late, once the link is back
    finally:
        # ---- borders off: relays stopped, workers back on loopback
        p.borders.record({s: None for s in sites})
        p.up()
    assert not any(p._processes.is_ours(f"wan-{s}") for s in sites)
    for s in sites:
        assert _environ(p.state["pids"][f"worker-{p.work_pool(s)}"])["PREFECT_API_URL"] == p.prefect_api_url
