"""``insitu run``'s work: sign the request, trigger ``retrain/coordinator`` through the Prefect API, follow the job
until it ends, and on any failure say the exact command that resumes it."""

from __future__ import annotations

import os
import shlex
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import typer

from deployments.cli import signing
from deployments.cli.common import DEFAULT_CONF, DEFAULT_PURPOSE, DEFAULT_STATE, console, fail
from deployments.cli.progress import JobProgress, JobShape, progress_for
from deployments.platform import Platform
from insitu.job import load_job

# The deployment `insitu deploy` registers for retrain (deployments/deploy.py).
RETRAIN_DEPLOYMENT = "retrain/coordinator"
POLL_S = 2.0
# A Prefect API that answers 5xx or not at all for a moment ("database is locked") is waited out this often.
API_RETRIES = 5
API_RETRY_WAIT_S = 5.0
T = TypeVar("T")


@dataclass(frozen=True)
class JobRun:
    """What ``insitu run`` was asked to run: enough to resume it by the same job id."""

    training: str
    dataset: str
    job_id: str
    rounds: int | None = None
    as_: str | None = None
    purpose: str = DEFAULT_PURPOSE
    state_dir: Path = DEFAULT_STATE
    conf: Path = DEFAULT_CONF

    @property
    def overrides(self) -> dict[str, int] | None:
        return {"rounds": self.rounds} if self.rounds else None

    def resume_command(self) -> str:
        """``insitu run --as NAME --training T --dataset D --job-id JOB``, with any other option it was given."""
        args = ["insitu", "run"]
        args += ["--as", self.as_] if self.as_ else []
        args += ["--training", self.training, "--dataset", self.dataset]
        args += ["--rounds", str(self.rounds)] if self.rounds else []
        args += ["--purpose", self.purpose] if self.purpose != DEFAULT_PURPOSE else []
        args += ["--state-dir", str(self.state_dir)] if Path(self.state_dir) != DEFAULT_STATE else []
        args += ["--conf", str(self.conf)] if Path(self.conf) != DEFAULT_CONF else []
        return shlex.join([*args, "--job-id", self.job_id])


def new_job_id() -> str:
    return f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"


def not_deployed_message(deployment: str = RETRAIN_DEPLOYMENT) -> str:
    """What a run says when the Prefect API does not know ``deployment`` (instead of ``ObjectNotFound: None``)."""
    return f"{deployment} is not deployed: run insitu deploy"


@contextmanager
def resume_hint(job: JobRun) -> Iterator[None]:
    """On any failure inside (a failed run, a Prefect API error while following it), print how to resume."""
    try:
        yield
    except Exception as e:
        if not (isinstance(e, typer.Exit) and e.exit_code == 0):
            print_resume(job)
        raise


def print_resume(job: JobRun) -> None:
    console.print(f"resume this job: {job.resume_command()}", markup=False, highlight=False, soft_wrap=True)


def is_transient(e: BaseException) -> bool:
    """A Prefect API error worth waiting out: no connection, a timeout, or a 5xx / 429 answer."""
    if isinstance(e, httpx.HTTPStatusError):
        return e.response.status_code >= 500 or e.response.status_code == 429
    return isinstance(e, httpx.TransportError)


def retrying(call: Callable[[], T], retries: int, wait_s: float, sleep: Callable[[float], None] = time.sleep) -> T:
    """``call()``, called again after a transient API error up to ``retries`` times; any other error at once."""
    for attempt in range(retries + 1):
        try:
            return call()
        except Exception as e:
            if attempt == retries or not is_transient(e):
                raise
            console.print(f"[yellow]Prefect API: {type(e).__name__}: {e}; trying again in {wait_s:.0f}s[/yellow]")
            sleep(wait_s)
    raise AssertionError("unreachable")


def run_and_follow(p: Platform, job: JobRun) -> dict[str, Any]:
    """Trigger retrain for ``job``, follow it to its end, and return the job's summary."""
    from insitu.federated.exchange import Exchange
    from insitu.federated.kinds import COORDINATOR
    from insitu.federated.paths import SUMMARY
    from insitu.storage import store_from_env

    c = load_job(job.training, job.dataset, directory=p.conf_dir, overrides=job.overrides)
    c.check_model()  # a misspelt model path fails here, naming file and key, before anything is signed
    flow_run_id = trigger(p, job)
    with resume_hint(job):
        console.print(f"triggered retrain as flow run {flow_run_id} (job {job.job_id}): "
                      f"{p.prefect_ui_url}/runs/flow-run/{flow_run_id}")
        ex = Exchange(store_from_env(c.sites.exchange, "exchange"), job.job_id, writer="operator")
        run = follow(flow_run_id, job.job_id, ex, JobShape(sites=len({s.site for s in c.dataset.shards}),
                                                           rounds=c.training.rounds))
        if not (run.state and run.state.is_completed()):
            console.print(f"[red]retrain {run.state_name}[/red]: {run.state.message if run.state else ''}")
            console.print(f"logs: {p.prefect_ui_url}/runs/flow-run/{flow_run_id}")
            raise typer.Exit(1)
        return ex.get_json(SUMMARY, writer=COORDINATOR)


def trigger(p: Platform, job: JobRun) -> Any:
    """Start ``retrain/coordinator`` for ``job`` (with its request signed here when a principal is named);
    returns the flow run's id."""
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    from insitu.governance.principals import ENV_PRINCIPAL_KEY

    params: dict[str, Any] = {"training": job.training, "dataset": job.dataset, "job_id": job.job_id}
    if job.rounds:
        params["rounds"] = job.rounds
    if job.as_ or os.environ.get(ENV_PRINCIPAL_KEY):
        signed = signing.sign_job(p, job.as_, job.training, job.dataset, job.purpose, job_id=job.job_id,
                                  overrides=job.overrides)
        params["request"] = signed.model_dump(mode="json")
        console.print(f"signed the job request as {signed.request.principal} (purpose {job.purpose!r})")
    try:  # not retried: a request that reached the server before it failed would start a second run
        return run_deployment(RETRAIN_DEPLOYMENT, parameters={"params": params}, timeout=0).id
    except ObjectNotFound:
        raise fail(not_deployed_message()) from None
    except Exception:
        print_resume(job)
        raise


def follow(flow_run_id: Any, job_id: str, ex: Any, shape: JobShape) -> Any:
    """Show the job's progress until its retrain flow run is final; returns that flow run."""
    from prefect.client.orchestration import get_client

    with progress_for(console, shape) as shown, get_client(sync_client=True) as client:
        while True:
            run, seen = retrying(lambda: look(client, flow_run_id, job_id, ex), API_RETRIES, API_RETRY_WAIT_S)
            shown.update(seen)
            if run.state and run.state.is_final():
                return run
            time.sleep(POLL_S)


def look(client: Any, flow_run_id: Any, job_id: str, ex: Any) -> tuple[Any, JobProgress]:
    """The retrain flow run, and how far its job is (read from Prefect and the exchange)."""
    from insitu.federated.kinds import COORDINATOR
    from insitu.federated.paths import EVALUATION, MANIFEST_SUFFIX, PREPARE_STATS, SUMMARY, Kind

    run = client.read_flow_run(flow_run_id)
    manifests = [x for x in ex.list(Kind.WEIGHTS, COORDINATOR) if x.endswith(MANIFEST_SUFFIX)]
    # What each site published, one document per site (a site's one run does every phase of the job).
    return run, JobProgress(
        state=str(run.state_name),
        prepared=sum(1 for x in ex.list(Kind.STATS) if x.endswith(f"/{PREPARE_STATS.name}")),
        rounds_done=max(0, len(manifests) - 1),  # the first global model is the initial one
        evaluated=sum(1 for x in ex.list(Kind.METRICS) if x.endswith(f"/{EVALUATION.name}")),
        registered=ex.exists(SUMMARY, writer=COORDINATOR),
    )
