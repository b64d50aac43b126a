"""A flow run whose process is gone is marked Crashed: Prefect's zombie-run automation, made by ``insitu deploy``.

A worker's host that dies, or a flow-run process killed with SIGKILL, leaves its run ``Running`` on the server
for ever: nothing is left to report its end. For a job that is more than untidy: its ``retrain`` run would count
as the job's running run, and a re-run by the job id would be refused (one run of a job at a time). Every flow
run of the platform sends a heartbeat event every :data:`HEARTBEAT_S` (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``, set
in every worker's environment); this automation sets a run whose heartbeats stop for :data:`UNRESPONSIVE_S`,
without a final state, to ``Crashed`` — the recipe of Prefect's docs ("detect zombie flows"), on the open-source
server. Then the job's hold lapses and a re-run by its id resumes it.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

log = logging.getLogger(__name__)

NAME = "insitu-crash-unresponsive-runs"
HEARTBEAT_S = 30  # Prefect's lowest allowed frequency: the sooner a lost run is noticed
UNRESPONSIVE_S = 120  # four heartbeats missed: a busy process or a server restart misses one, not four


def automation(after_s: float = UNRESPONSIVE_S) -> Any:
    """The automation: a flow run's heartbeat not followed, within ``after_s``, by another or by a final state."""
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    finals = {f"prefect.flow-run.{s}" for s in ("Completed", "Failed", "Cancelled", "Crashed")}
    return AutomationCore(
        name=NAME,
        description=f"insitu: a flow run without a heartbeat for {after_s:g} s is marked Crashed (its process is gone)",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *finals},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive, threshold=1, within=timedelta(seconds=after_s)),
        actions=[ChangeFlowRunState(
            state=StateType.CRASHED,
            message=f"no heartbeat for {after_s:g} s: the run's process or its host is gone (insitu: re-run the job "
                    "by its id to resume it)")],
    )


def ensure_unresponsive_runs_crash(after_s: float = UNRESPONSIVE_S) -> None:
    """Create or update the automation (idempotent: one of that name)."""
    from prefect.client.orchestration import get_client

    wanted = automation(after_s)
    with get_client(sync_client=True) as client:
        same = client.read_automations_by_name(NAME)
        if same:
            client.update_automation(same[0].id, wanted)
            for extra in same[1:]:
                client.delete_automation(extra.id)
        else:
            client.create_automation(wanted)
    log.info("flow runs without a heartbeat for %g s are marked Crashed", after_s)
