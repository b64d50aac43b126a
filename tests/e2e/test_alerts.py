"""Watching jobs on the real platform, around one job whose site ``eu`` its own operator slows in round 2 only
(``publish-delay.json``):

- alerts: ``conf/alerts.yaml``'s automations (made by ``ensure_alerts``, what ``insitu deploy`` runs) send a failed
  site run and a slow round to a webhook, once each, naming the job, the site and the reason. The webhook is a local
  HTTP receiver; the failed site run is one the site refuses (no signed request: rule request.present). The
  automations are removed at the end (the receiver goes away);
- one run of a job at a time: a second run of the same job id, started while the job runs, is refused at once with a
  message naming the running one (rule ``job.one-run-at-a-time``, audited by the coordinator); the first completes
  and registers one version; a re-run by the job id after it ended proceeds (the hold was let go);
- ``insitu status``: every site healthy with the job's seconds per round; a site whose audit service is down is
  degraded and says why, and healthy again once the service is restarted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from platform_helpers import (
    job_events,
    shipped_training,
    slow_sites,
    start_flow_run,
    start_retrain,
    wait_for_flow_run,
    write_training,
)
from prefect.client.orchestration import get_client

from deployments.alerts import ensure_alerts
from deployments.platform import Platform
from insitu.conf import ALERT_KINDS, AlertsConfig
from tasks.job_lease import RULE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]
DELAY_S = 40.0  # eu's lateness in round 2 (its own operator's publish-delay.json)


class Receiver(ThreadingHTTPServer):
    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/alerts"

    def of(self, alert: str, job: str) -> list[dict[str, Any]]:
        return [a for a in self.received if a.get("alert") == alert and a.get("job") == job]

    def wait_for(self, alert: str, job: str, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.of(alert, job):
            time.sleep(0.5)
        time.sleep(5)  # a second one, if any, arrives within this
        return self.of(alert, job)


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            self.server.received.append(json.loads(body))
        except ValueError:
            self.server.received.append({"unparsed": body.decode(errors="replace")})
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    t = threading.Thread(target=r.serve_forever, daemon=True)
    t.start()
    try:
        assert set(ensure_alerts(AlertsConfig.model_validate(
            {"webhook": {"url": r.url}, "slow_round_factor": 1.5}))) == set(ALERT_KINDS)
        yield r
    finally:
        assert ensure_alerts(AlertsConfig()) == []  # no webhook: every automation of ours removed
        r.shutdown()
        r.server_close()


def _wait_running(flow_run_id: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as c:
        while time.monotonic() < deadline:
            state = c.read_flow_run(flow_run_id).state
            if state is not None and state.is_running():
                return
            assert state is None or not state.is_final(), state
            time.sleep(0.5)
    raise AssertionError(f"flow run {flow_run_id} did not start within {timeout:.0f}s")


@pytest.fixture(scope="module")
def watched(deployed: Platform, signer: Any, receiver: Receiver) -> Iterator[dict[str, Any]]:
    """The job (3 rounds, eu 40 s late in round 2) and a second run of it started while it runs. 40 s: round 2 must
    take more than 1.5 x round 1 even when round 1 itself ran slow on a busy machine (make test's other stream)."""
    p = deployed
    model = f"insitu-e2e-alert-{uuid.uuid4().hex[:6]}"
    cfg = shipped_training(p.conf_dir, "fraud")
    cfg.update(rounds=3, local_epochs=1, strategy="single", ranks_per_site=1, registry={"model_name": model})
    path = write_training(p.conf_dir / "training", f"e2e-alert-{uuid.uuid4().hex[:6]}", cfg)
    job = f"e2e-alert-slow-{uuid.uuid4().hex[:6]}"
    params = {"training": path.stem, "dataset": "fraud", "job_id": job, "request": signer(path.stem, job)}
    try:
        with slow_sites(p, job, {"eu": {"2": DELAY_S}}):  # type: ignore[dict-item]
            first = start_retrain(params)
            _wait_running(first, 300)
            time.sleep(3)  # past open_job: the first holds the job
            second = wait_for_flow_run(start_retrain(params), 300)
            done = wait_for_flow_run(first, 900, poll_s=2)
        yield {"job": job, "model": model, "params": params, "first": first, "second": second, "done": done}
    finally:
        path.unlink()


def test_a_failed_site_run_reaches_the_webhook_once(deployed: Platform, receiver: Receiver) -> None:
    # a site run the site refuses (an unsigned run nobody dispatched): Failed, and said so
    refused_job = f"e2e-alert-refused-{uuid.uuid4().hex[:6]}"
    run = wait_for_flow_run(start_flow_run("site-prepare/eu", {"job_id": refused_job}), 300)
    assert run.state is not None and run.state.is_failed(), run.state
    (failed,) = receiver.wait_for("site-run-failed", refused_job, 60)
    assert failed["site"] == "eu" and failed["phase"] == "site-prepare"
    assert "site 'eu' refuses prepare" in failed["reason"] and "rule request.present" in failed["reason"], failed


def test_a_slow_round_reaches_the_webhook_once(watched: dict[str, Any], receiver: Receiver) -> None:
    job, done = watched["job"], watched["done"]
    assert done.state is not None and done.state.is_completed(), done.state
    (slow,) = receiver.wait_for("slow-round", job, 60)
    assert slow["reason"].startswith("round 2 took") and "median round" in slow["reason"], slow
    assert slow["site"] == "eu" and "the last update came from eu" in slow["reason"], slow  # the straggler
    assert not receiver.of("site-dropped", job)  # every site made every round
    assert not receiver.of("site-run-failed", job)


def test_status_shows_each_sites_health_and_why_one_is_degraded(deployed: Platform, watched: dict[str, Any]) -> None:
    p, job = deployed, watched["job"]
    # every site healthy, with this job's round times (eu's round 2 slower than round 1)
    rows = _site_rows(p)
    assert set(rows) == set(p.sites.names), rows
    for row in rows.values():
        assert row.endswith("healthy") and f"{job}: " in row, row
    times = [float(t) for t in rows["eu"].split(f"{job}: ")[1].split(" s")[0].split(", ")]
    # (round 0 also holds every site's training start, so it is compared with round 1 only)
    assert len(times) == 3 and times[2] > times[1] and times[2] >= DELAY_S, rows["eu"]

    # a site's audit service down: that site is degraded, and says why; back once it is restarted
    os.kill(p.state["pids"]["audit-us"], signal.SIGKILL)
    try:
        row = _site_rows(p)["us"]
        assert "degraded: its audit service does not answer" in row, row
        assert _site_rows(p)["eu"].endswith("healthy")
    finally:
        assert p.up()["started"] == ["audit-us"]
    assert _site_rows(p)["us"].endswith("healthy")


def test_a_second_run_of_a_running_job_is_refused_naming_the_first(deployed: Platform, signer: Any,
                                                                    watched: dict[str, Any]) -> None:
    p, job, first, refused = deployed, watched["job"], watched["first"], watched["second"]
    assert refused.state is not None and refused.state.is_failed(), refused.state
    assert f"job {job} is already running as flow run {first}" in (refused.state.message or ""), refused.state.message
    assert watched["done"].state.is_completed(), watched["done"].state
    (event,) = job_events(p, "coordinator", job, "job.refused")
    assert event["fields"]["rule"] == RULE and event["fields"]["running"] == [str(first)]
    assert event["fields"]["flow_run_id"] == str(refused.id)
    assert len(MlflowClient(p.mlflow_url).search_model_versions(f"name = '{watched['model']}'")) == 1

    params = watched["params"]
    again = wait_for_flow_run(start_retrain({**params, "request": signer(params["training"], job)}), 600, poll_s=2)
    assert again.state is not None and again.state.is_completed(), again.state  # the hold was let go
    assert len(job_events(p, "coordinator", job, "job.refused")) == 1
    assert len(MlflowClient(p.mlflow_url).search_model_versions(f"name = '{watched['model']}'")) == 1


def _site_rows(p: Platform) -> dict[str, str]:
    """``insitu status``'s per-site rows, as the operator's terminal shows them (one line each, wide)."""
    out = subprocess.run([sys.executable, "-m", "deployments.cli", "status", "--state-dir", str(p.dir), "--conf",
                          str(p.conf_dir)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "400"}, check=True).stdout
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("│┃").split("│")]
        if len(cells) == 5 and cells[0] in p.sites.names:
            rows[cells[0]] = " | ".join(cells[1:])
    return rows
