"""What an insitu worker will run: local code and configuration on the worker's machine, never the API's.

A site worker runs the three site flows, the coordinator's worker runs ``retrain``; each from a fixed
import path chosen by the flow's name, with one fixed command, no extra environment and the checkout
as working directory. A deployment on the pool must match this exactly (entrypoint, pull steps, no job
variables) or its runs are refused (``deployments/worker.py``).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefect import Flow

REPO = Path(__file__).resolve().parent.parent

# flow name → (the deployment's entrypoint, the import path this worker loads it from)
SITE_FLOWS: dict[str, tuple[str, str]] = {
    "site-prepare": ("flows/site_prepare.py:site_prepare", "flows.site_prepare:site_prepare"),
    "site-train": ("flows/site_train.py:site_train", "flows.site_train:site_train"),
    "site-evaluate": ("flows/site_evaluate.py:site_evaluate", "flows.site_evaluate:site_evaluate"),
}
COORDINATOR_FLOWS: dict[str, tuple[str, str]] = {
    "retrain": ("flows/retrain.py:retrain", "flows.retrain:retrain"),
}
RUNNER_MODULE = "deployments.runner"


def flows_for(role: str) -> dict[str, tuple[str, str]]:
    """The flows an actor of ``role`` ('site' or 'coordinator') runs."""
    return COORDINATOR_FLOWS if role == "coordinator" else SITE_FLOWS


def expected_pull_steps(source: Path = REPO) -> list[dict[str, Any]]:
    """What ``deploy.py`` registers: run from this checkout (the only pull step a worker accepts)."""
    return [{"prefect.deployments.steps.set_working_directory": {"directory": str(source)}}]


def locked_job_configuration() -> dict[str, Any]:
    return {
        "command": f"{sys.executable} -m {RUNNER_MODULE}",
        "env": {},
        "working_dir": str(REPO),
        "stream_output": True,
    }


def locked_base_job_template() -> dict[str, Any]:
    """The pools' base job template: no variables, so a run has nothing to vary.

    Placeholders (``{{ name }}``) are left out: the server refuses undeclared ones, and the worker fills
    name and labels itself.
    """
    return {"job_configuration": locked_job_configuration(), "variables": {"type": "object", "properties": {}}}


def load_flow(role: str, flow_name: str) -> Flow[..., Any]:
    """The flow object for ``flow_name`` from this worker's fixed list.

    Raises
    ------
    LookupError
        When ``flow_name`` is not one of ``role``'s flows.
    """
    from prefect import Flow

    try:
        target = flows_for(role)[flow_name][1]
    except KeyError:
        raise LookupError(f"flow {flow_name!r} is not one a {role} runs; allowed: {sorted(flows_for(role))}") from None
    module, _, attr = target.partition(":")
    obj = getattr(importlib.import_module(module), attr)
    if not isinstance(obj, Flow) or obj.name != flow_name:
        raise LookupError(f"{target} is not the flow {flow_name!r}")
    return obj
