"""The insitu worker's vetting of a flow run, rule by rule, against an API answering what an attacker set.

The real worker refuses on the real platform in tests/security/test_platform_boundaries.py; here every rule is
exercised, including the ones an end-to-end attack cannot reach first, and failing closed on API errors.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from uuid import uuid4

import pytest

from deployments import worker_policy as policy
from deployments.worker import (
    RULE_DEPLOYMENT,
    RULE_ENTRYPOINT,
    RULE_FLOW,
    RULE_JOB_VARIABLES,
    RULE_POOL,
    RULE_PULL_STEPS,
    InsituWorker,
    Refused,
)
from insitu.governance.identity import Identity

FLOW_ID = uuid4()
DEP_ID = uuid4()


class FakeApi:
    """Answers the three reads the worker makes; each field can be set the way an attacker would."""

    def __init__(self, run: dict[str, Any] | None = None, dep: dict[str, Any] | None = None,
                 flow_name: str = "site-prepare", fail: bool = False) -> None:
        self.run = {"id": uuid4(), "deployment_id": DEP_ID, "flow_id": FLOW_ID, "job_variables": {},
                    "work_pool_name": "insitu-eu", "name": "r", **(run or {})}
        self.dep = {"name": "eu", "work_pool_name": "insitu-eu", "job_variables": {}, "flow_id": FLOW_ID,
                    "entrypoint": "flows/site_prepare.py:site_prepare",
                    "pull_steps": policy.expected_pull_steps(), **(dep or {})}
        self.flow_name = flow_name
        self.fail = fail

    async def read_flow_run(self, _id: Any) -> Any:
        if self.fail:
            raise ConnectionError("API down")
        return SimpleNamespace(**self.run)

    async def read_deployment(self, _id: Any) -> Any:
        return SimpleNamespace(**self.dep)

    async def read_flow(self, _id: Any) -> Any:
        return SimpleNamespace(name=self.flow_name)

    async def read_work_pool(self, name: str) -> Any:
        return SimpleNamespace(name=name, base_job_template=policy.locked_base_job_template())


def _worker(api: FakeApi, role: str = "site") -> InsituWorker:
    w = object.__new__(InsituWorker)  # no server: only what vet() uses
    w._client = api  # type: ignore[assignment]
    w._work_pool_name = "insitu-eu"
    w._locked_template = policy.locked_base_job_template()
    w.identity = Identity(actor="eu", role=role, work_pool="insitu-eu",  # type: ignore[arg-type]
                          audit_log=Path("/nonexistent"), audit_key=b"k", path=Path("/nonexistent"))
    return w


def _vet(api: FakeApi, role: str = "site") -> None:
    asyncio.run(_worker(api, role).vet(SimpleNamespace(**{k: api.run[k] for k in
                                                          ("id", "deployment_id", "flow_id", "job_variables")})))


def test_the_deployed_site_flow_passes() -> None:
    _vet(FakeApi())
    for name, (entry, _) in policy.SITE_FLOWS.items():
        _vet(FakeApi(dep={"entrypoint": entry}, flow_name=name))


@pytest.mark.parametrize(("api", "rule"), [
    (FakeApi(run={"job_variables": {"env": {"INSITU_IDENTITY": "/x"}}}), RULE_JOB_VARIABLES),
    (FakeApi(dep={"job_variables": {"command": "sh"}}), RULE_JOB_VARIABLES),
    (FakeApi(run={"deployment_id": None}), RULE_DEPLOYMENT),
    (FakeApi(run={"work_pool_name": "insitu-us"}), RULE_POOL),
    (FakeApi(dep={"work_pool_name": "insitu-us"}), RULE_POOL),
    (FakeApi(dep={"entrypoint": "/tmp/evil.py:evil"}), RULE_ENTRYPOINT),
    (FakeApi(dep={"entrypoint": "flows/retrain.py:retrain"}, flow_name="retrain"), RULE_ENTRYPOINT),
    (FakeApi(dep={"pull_steps": [{"prefect.deployments.steps.run_shell_script": {"script": "id"}}]}),
     RULE_PULL_STEPS),
    (FakeApi(dep={"pull_steps": None}), RULE_PULL_STEPS),
    (FakeApi(flow_name="site-train"), RULE_FLOW),  # the prepare entrypoint under another flow's name
    (FakeApi(dep={"flow_id": uuid4()}), RULE_FLOW),
])
def test_each_rule_refuses(api: FakeApi, rule: str) -> None:
    with pytest.raises(Refused) as e:
        _vet(api)
    assert e.value.rule == rule


def test_the_coordinator_runs_only_retrain() -> None:
    _vet(FakeApi(dep={"entrypoint": "flows/retrain.py:retrain"}, flow_name="retrain"), role="coordinator")
    with pytest.raises(Refused):
        _vet(FakeApi(), role="coordinator")


def test_an_api_error_while_vetting_refuses(tmp_path: Path) -> None:
    """_submit_run_and_capture_errors fails closed: the run is refused (and audited by _refuse), nothing starts."""
    from insitu.governance.audit import new_key

    api = FakeApi(fail=True)
    w = _worker(api)
    w.identity = Identity(actor="eu", role="site", work_pool="insitu-eu", audit_log=tmp_path / "eu.jsonl",
                          audit_key=new_key(), path=tmp_path / "id.json")
    refused: list[tuple[str, str]] = []

    async def record(flow_run: Any, rule: str, reason: str) -> None:
        refused.append((rule, reason))

    w._refuse = record  # type: ignore[method-assign]
    w._release_limit_slot = lambda _id: None  # type: ignore[method-assign]
    run = SimpleNamespace(id=uuid4(), deployment_id=DEP_ID, flow_id=FLOW_ID, job_variables={})
    out = asyncio.run(w._submit_run_and_capture_errors(run))  # type: ignore[arg-type]
    assert isinstance(out, ConnectionError)
    assert refused and refused[0][0] == "worker.vetting-failed-closed"


def test_the_runner_loads_only_the_actors_own_flows() -> None:
    assert policy.load_flow("site", "site-train").name == "site-train"
    assert policy.load_flow("coordinator", "retrain").name == "retrain"
    with pytest.raises(LookupError):
        policy.load_flow("site", "retrain")
    with pytest.raises(LookupError):
        policy.load_flow("coordinator", "site-prepare")


def test_the_locked_template_has_nothing_to_vary() -> None:
    t = policy.locked_base_job_template()
    assert t["variables"]["properties"] == {}
    assert t["job_configuration"]["env"] == {}
    assert t["job_configuration"]["command"].endswith("-m deployments.runner")
    assert "{{" not in str(t)
