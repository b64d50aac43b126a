"""The automation that marks a flow run whose process is gone Crashed (deployments/unresponsive.py): what it
waits for, for how long, per run, and what it does. On the platform: tests/e2e/test_control_plane_faults.py."""

from __future__ import annotations

from datetime import timedelta

from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import Posture

from deployments.unresponsive import HEARTBEAT_S, UNRESPONSIVE_S, automation


def test_a_run_silent_for_the_bound_is_crashed_and_each_run_is_judged_alone() -> None:
    a = automation()
    t = a.trigger
    assert t.posture == Posture.Proactive and t.within == timedelta(seconds=UNRESPONSIVE_S)
    assert t.after == {"prefect.flow-run.heartbeat"}
    # another heartbeat, or any final state, is what was expected: only silence fires it
    assert t.expect >= {"prefect.flow-run.heartbeat", "prefect.flow-run.Completed", "prefect.flow-run.Failed",
                        "prefect.flow-run.Cancelled", "prefect.flow-run.Crashed"}
    assert t.for_each == {"prefect.resource.id"}  # one run's heartbeat does not vouch for another's
    (action,) = a.actions
    assert isinstance(action, ChangeFlowRunState) and action.state == StateType.CRASHED
    assert "re-run the job by its id" in (action.message or "")


def test_the_bound_leaves_room_for_missed_heartbeats() -> None:
    assert UNRESPONSIVE_S >= 3 * HEARTBEAT_S
