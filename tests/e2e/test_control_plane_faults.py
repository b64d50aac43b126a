"""The control plane failing under a running job, on the shared platform: the Prefect server and its PostgreSQL
killed (SIGKILL) in the middle of round 1 and started again; the exchange's S3 endpoint and us's store killed as
round 2 begins and started again 30 s later (nothing the exchange acknowledged before the kill is missing, and
what nothing writes again is byte for byte what it was); then MLflow killed just as the job reaches its
registration and kept down for 20 s.

The stores' outage is ridden out by every call to them (insitu.outage: tried again after 1, 2, 4, … s within the
store's outage_s). The orchestrator's restart either is ridden through (Prefect's client retries) or fails an
attempt with its reason, and the job completes when re-run by its id. Either way what it leaves is what an
undisturbed job leaves: each round aggregated once from that round's updates, each round logged to MLflow once on
one parent run, one model version registered for the job, and every audit log verifies against the anchors the
exchange keeps.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import psutil
import pytest
from platform_helpers import (
    EXCHANGE,
    assert_logged_once,
    assert_trail_verifies,
    cancel_job,
    coordinator_exchange,
    job_events,
    job_summary,
    shipped_training,
    slow_sites,
    start_retrain,
    wait_for_flow_run,
    write_training,
)
from prefect.client.orchestration import get_client

from deployments.platform import Platform
from deployments.platform.actors import COORDINATOR
from insitu.storage import Store

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
ROUNDS = 3
STORES_DOWN_S = 30


def _listing(store: Store, prefix: str) -> dict[str, tuple[int, str]]:
    """Every object under ``prefix``: path → (size, ETag: the MD5 of its bytes), in one listing (hashing a whole
    exchange object by object took minutes on CI: the kill then came after the job it was meant to interrupt)."""
    store.fs.invalidate_cache()
    return {p: (int(d["size"]), str(d.get("ETag"))) for p, d in store.fs.find(prefix, detail=True).items()}


class _Attempts:
    """The job's runs: a run that ends before the job reaches where the test needs it is re-run by the job id (what
    an operator does), and the reason it ended is kept."""

    def __init__(self, rerun: Callable[[], UUID], ex: Store) -> None:
        self.rerun, self.ex = rerun, ex
        self.run = rerun()
        self.failures: list[str] = []

    def _ended(self) -> Any:
        with get_client(sync_client=True) as c:
            state = c.read_flow_run(self.run).state
        if state is None or not state.is_final():
            return None
        if not state.is_completed():
            self.failures.append(state.message or state.name)
            self.run = self.rerun()
        return state

    def reach(self, paths: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.ex.fs.invalidate_cache()
            if all(self.ex.fs.exists(path) for path in paths):
                return
            state = self._ended()
            assert state is None or not state.is_completed(), f"the job completed without {paths}"
            time.sleep(1)
        raise AssertionError(f"never reached {paths} (failed attempts: {self.failures})")

    def finish(self, timeout: float) -> Any:
        done = wait_for_flow_run(self.run, timeout, poll_s=2)
        if not done.state.is_completed():
            self._ended()
            done = wait_for_flow_run(self.run, timeout, poll_s=2)
        return done


@contextlib.contextmanager
def _cancelled_on_failure(current: Callable[[], UUID | None], job: str) -> Iterator[None]:
    """A failed check leaves no job running under the tests after this one: its run and site runs are cancelled."""
    try:
        yield
    except BaseException:
        run = current()
        if run is not None:
            with contextlib.suppress(Exception):
                cancel_job(run, job, timeout=120)
        raise


def _kill(p: Platform, *names: str) -> None:
    """SIGKILL each component with its children (MLflow's server runs uvicorn as a child: killed alone, that child
    would outlive the test)."""
    for name in names:
        proc = psutil.Process(p.state["pids"][name])
        family = [proc, *proc.children(recursive=True)]  # listed before any dies (a parent may exit with its child)
        for member in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.send_signal(signal.SIGKILL)


def test_a_job_survives_prefect_its_database_and_mlflow_going_down(deployed: Platform, shared_conf: Path,
                                                                    signer: Any) -> None:
    p = deployed
    model = f"insitu-e2e-cpfault-{uuid.uuid4().hex[:6]}"
    cfg = shipped_training(p.conf_dir, "fraud")
    cfg.update(rounds=ROUNDS, local_epochs=1, strategy="single", ranks_per_site=1, registry={"model_name": model})
    training = write_training(shared_conf, f"e2e-cpfault-{uuid.uuid4().hex[:6]}", cfg).stem
    job = f"e2e-cpfault-{uuid.uuid4().hex[:6]}"
    params = {"training": training, "dataset": "fraud", "job_id": job, "request": signer(training, job)}
    ex = coordinator_exchange(p)
    root = f"{EXCHANGE}/jobs/{job}"
    control_plane = ["prefect-server", *(["postgres"] if "postgres" in p.state["pids"] else [])]

    # eu is slow in rounds 1 and 2: round 1 stays open a while, and round 2 waits for eu well after the others are
    # in. The stores' outage at round 2's start holds us's and apac's round-2 updates until it ends and their calls'
    # backoff (1, 2, … 16 s) next tries, then they train: 60 s of delay was once not enough on a loaded CI machine.
    # 120 s still publishes eu's before the lost coordinator's re-run (≥ 120 s after the kill) and inside the
    # round's deadline (round_deadline_s: 180).
    attempts: list[_Attempts] = []
    with (slow_sites(p, job, {"eu": {"1": 15.0, "2": 120.0}}),  # type: ignore[dict-item]
          _cancelled_on_failure(lambda: attempts[0].run if attempts else None, job)):
        attempt = _Attempts(lambda: start_retrain({**params, "request": signer(training, job)}), ex)
        attempts.append(attempt)
        # ---- round 0 aggregated, round 1 under way: the orchestrator and its database go down, and come back
        attempt.reach([f"{root}/weights/coordinator/round-0001.manifest.json"], 600)
        _kill(p, *control_plane)
        time.sleep(3)
        restarted = p.up()["started"]
        assert set(control_plane) <= set(restarted), restarted
        # ---- round 1 aggregated: the exchange's endpoint and us's store go down for 30 s as round 2 begins, and
        # come back (same keys, same data: nothing else). Every call to them waits (1, 2, 4, … s) meanwhile.
        attempt.reach([f"{root}/weights/coordinator/round-0002.manifest.json"], 600)
        acknowledged = _listing(ex, f"{EXCHANGE}/")
        _kill(p, "s3-exchange", "s3-us")
        time.sleep(STORES_DOWN_S)
        assert sorted(p.up()["started"]) == ["s3-exchange", "s3-us"]
        after = _listing(coordinator_exchange(p), f"{EXCHANGE}/")
        assert not sorted(set(acknowledged) - set(after))  # the job goes on writing; nothing it wrote is gone
        fixed = [k for k in acknowledged if f"/jobs/{job}/" not in k]  # earlier jobs' objects, anchors
        assert fixed and not [k for k in fixed if after[k] != acknowledged[k]]
        # ---- round 2: us's and apac's updates in, eu's not yet: the coordinator's worker and its run are killed
        # (a host lost). Its run stays Running until its heartbeats have stopped for 120 s: then Prefect's zombie
        # automation marks it Crashed, and the job is re-run by its id. The re-run aggregates round 2 once, from
        # the updates already published, after cancelling the site runs the dead run left going.
        attempt.reach([f"{root}/update/{s}/round-0002.manifest.json" for s in ("us", "apac")], 600)
        assert not ex.fs.exists(f"{root}/weights/coordinator/round-0003.manifest.json")  # not aggregated yet
        assert not ex.fs.exists(f"{root}/update/eu/round-0002.manifest.json")  # and eu's still to come
        dead = attempt.run
        _kill(p, f"worker-{p.sites.coordinator.work_pool}")
        assert f"worker-{p.sites.coordinator.work_pool}" in p.up()["started"]
        # ---- every site evaluated: the registry goes down as the coordinator reaches registration
        attempt.reach([f"{root}/metrics/{site}/evaluate.json" for site in p.sites.names], 900)
        _kill(p, "mlflow-server")
        time.sleep(20)
        assert "mlflow-server" in p.up()["started"]
        done = attempt.finish(900)
    # the stores' outage is ridden out (within their outage_s); the orchestrator's or the registry's outage may
    # fail an attempt with its reason, and a re-run by the id resumes it; the lost coordinator's run was crashed
    assert all(attempt.failures) and len(attempt.failures) <= 3, attempt.failures
    with get_client(sync_client=True) as c:
        lost = c.read_flow_run(dead).state
    assert lost is not None and lost.is_crashed() and "no heartbeat" in (lost.message or ""), lost
    assert not [f for f in attempt.failures if "endpoint" in f or "StoreUnavailable" in f], attempt.failures
    assert done.state.is_completed(), done.state.message

    # ---- each round aggregated once, from that round's updates, and in the summary once
    summary = job_summary(p, job)
    assert [r["round"] for r in summary["rounds_detail"]] == list(range(ROUNDS))
    for r in range(ROUNDS):
        manifest = json.loads(ex.fs.cat_file(f"{root}/weights/coordinator/round-{r + 1:04d}.manifest.json"))
        assert sorted(manifest["sites"]) == sorted(set(manifest["sites"])) and manifest["sites"], manifest
    # ---- one parent run, each round logged once per site, one version registered for the job
    assert_logged_once(p, job, ROUNDS, model)
    # ---- the re-run cancelled the site runs the lost coordinator left waiting, and said so in its audit log
    left = job_events(p, COORDINATOR, job, "job.earlier-site-runs-cancelled")
    assert left and len(left[-1]["fields"]["runs"]) == len(p.sites.names), left
    # ---- the audit logs verify against the anchors, across the outages
    assert_trail_verifies(p)
