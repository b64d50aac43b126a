"""What the platform benchmarks share: point Prefect at a platform, seed and deploy the demo, run signed demo jobs."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from deployments.platform import Platform


@contextmanager
def prefect_at(p: Platform) -> Iterator[None]:
    """Prefect's client settings for ``p`` (Prefect may have been imported before the platform's variables)."""
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, PREFECT_HOME, temporary_settings

    with temporary_settings({PREFECT_API_URL: p.prefect_api_url, PREFECT_API_AUTH_STRING: p.prefect_auth,
                             PREFECT_HOME: str(p.dir / "prefect-client")}):
        yield


def seed_and_deploy(p: Platform, rows: int) -> None:
    """The demo dataset (``rows`` per site) in the sites' stores, and every flow deployed."""
    from deployments.deploy import deploy_all
    from insitu.conf import load_conf, load_datasets
    from insitu.data.seed import seed

    conf = load_conf("fraud", directory=p.conf_dir)
    seed(conf, rows_per_site=rows)
    deploy_all(conf.sites, load_datasets(p.conf_dir / "datasets.yaml"))


def start_demo_job(p: Platform, rounds: int, tag: str, training: str = "fraud") -> UUID:
    """A ``retrain`` run of the demo (its ``training`` config), signed by alice for ``rounds`` rounds, as
    `insitu run --as alice` starts it."""
    from prefect.client.orchestration import get_client

    from insitu.governance.request import sign_for

    job = f"{tag}-{uuid.uuid4().hex[:6]}"
    request = sign_for(p.principal_key_file("alice"), "alice", training, "fraud", "fraud-detection", job_id=job,
                       overrides={"rounds": rounds}, conf_directory=p.conf_dir).model_dump(mode="json")
    params = {"training": training, "dataset": "fraud", "job_id": job, "rounds": rounds, "request": request}
    with get_client(sync_client=True) as c:
        dep = c.read_deployment_by_name("retrain/coordinator")
        return c.create_flow_run_from_deployment(dep.id, parameters={"params": params}).id


def wait_final(ids: list[UUID], poll_s: float = 2.0) -> list[Any]:
    """The runs once every one is final."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as c:
        while True:
            runs = [c.read_flow_run(i) for i in ids]
            if all(r.state and r.state.is_final() for r in runs):
                return runs
            time.sleep(poll_s)
