"""The real local platform, shared by the end-to-end (tests/e2e) and security (tests/security) tests: free ports,
a temporary state dir, every process stopped by PID."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from deployments.platform import REPO, Platform

PLATFORM_TIERS = (Path(__file__).parent / "e2e", Path(__file__).parent / "security")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the end-to-end and security tests that use the session's platform: ``make test`` runs those in one
    stream and every other test beside them, at once. (Moving the security tests to a second platform in the other
    stream was tried: two platforms' jobs at once slowed rounds enough to hide the alert test's slow round.)"""
    for item in items:
        if "platform" in getattr(item, "fixturenames", ()) and any(t in item.path.parents for t in PLATFORM_TIERS):
            item.add_marker(pytest.mark.shared_platform)


@pytest.fixture(scope="session")
def platform() -> Iterator[Platform]:
    # Not under pytest's basetemp: pytest makes `pytest-of-<user>` private (0700) whenever a session starts,
    # which would lock the sites' OS users out of their homes under it.
    state = Path(tempfile.mkdtemp(prefix="insitu-e2e-"))
    p = Platform(state, REPO / "conf", free_ports=True)
    p.apply_env()
    # Prefect was imported (by the test modules) before these variables existed: point its settings here.
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, PREFECT_HOME, temporary_settings

    try:
        p.up()
        p.apply_env()  # again: the S3 keys exist only once the endpoints' IAM issued them
        with temporary_settings({PREFECT_API_URL: p.prefect_api_url, PREFECT_API_AUTH_STRING: p.prefect_auth,
                                 PREFECT_HOME: str(p.dir / "prefect-client")}):
            yield p
    finally:
        pids = dict(p.state.get("pids", {}))
        p.down()
        left = [n for n, pid in pids.items() if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        assert not left, f"processes left behind after down(): {left}"
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def deployed(platform: Platform) -> Platform:
    from deployments.deploy import deploy_all
    from insitu.conf import load_conf, load_datasets
    from insitu.data.seed import seed

    conf = load_conf("fraud", directory=platform.conf_dir)
    seeded = seed(conf, rows_per_site=int(os.environ.get("INSITU_E2E_ROWS", "3000")))
    platform.state["seeded"] = seeded
    deploy_all(conf.sites, load_datasets(platform.conf_dir / "datasets.yaml"))
    approve(platform, "fraud")  # what the UI trigger and scheduled runs of `fraud` run under
    return platform


@pytest.fixture(scope="session")
def signer(platform: Platform) -> Any:
    """``signer(training="fraud", job_id=None, principal="alice", **kw)``: a signed request (see :func:`sign`)."""
    return lambda *a, **kw: sign(platform, *a, **kw)


def sign(platform: Platform, training: str = "fraud", job_id: str | None = None, principal: str = "alice",
         **kw: Any) -> dict[str, Any]:
    """A request signed by one of the platform's principals, as `insitu run --as` makes it (a flow parameter)."""
    from insitu.governance.request import sign_for

    return sign_for(platform.principal_key_file(principal), principal, training, kw.pop("dataset", "fraud"),
                    kw.pop("purpose", "fraud-detection"), job_id=job_id, conf_directory=platform.conf_dir,
                    **kw).model_dump(mode="json")


def approve(platform: Platform, training: str, max_rounds: int = 20) -> None:
    """A standing approval by alice for `training` (as `insitu approve --as alice` writes it)."""
    from insitu.governance.approvals import save_approval
    from insitu.governance.request import parse_signed

    save_approval(platform.approvals_dir, parse_signed(sign(
        platform, training, override_bounds={"rounds": {"min": 1, "max": max_rounds}})))


@pytest.fixture
def shared_conf(platform: Platform) -> Iterator[Path]:
    """Where a test puts its own training configs: the platform's ``conf/training/`` (a run may name only
    configs there), removed afterwards. Name them ``e2e-*.yaml`` (git ignores those)."""
    from platform_helpers import WRITTEN

    first = len(WRITTEN)
    yield platform.conf_dir / "training"
    for p in WRITTEN[first:]:  # what this test wrote: the other stream of `make test` writes here too
        p.unlink(missing_ok=True)
