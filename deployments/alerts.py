"""``conf/alerts.yaml`` as Prefect automations: each alert kind it names becomes one automation that sends the event
to the webhook, as one JSON object naming the alert, the job, the site and the reason.

Prefect's own events carry a site's flow runs that failed, crashed or went late (``prefect.flow-run.<State>``, for
the site flows); the coordinator emits the rest (``insitu.alert.<kind>``: a site dropped from a round, a slow round,
a gate refusal; ``insitu audit verify`` a log that does not verify). The webhook is a
``CustomWebhookNotificationBlock`` (``insitu-alert-webhook``); Slack and e-mail blocks work the same way
(docs/operations.md, "Alerts"). ``insitu deploy`` calls :func:`ensure_alerts`; it is idempotent, and removes the
automations of kinds no longer named.
"""

from __future__ import annotations

import logging
from typing import Any

from insitu.conf import ALERT_KINDS, AlertsConfig
from insitu.governance.request import ACTIONS

log = logging.getLogger(__name__)

BLOCK = "insitu-alert-webhook"
PREFIX = "insitu-alert-"
SITE_FLOWS = tuple(f"site-{action}" for action in ACTIONS)  # a site's flow per action a request may grant
# A site's flow run, from Prefect's own state events: the site is its deployment (``site-train/eu``).
SITE_RUN_BODY = """{"alert": "%s", "job": {{ flow_run.parameters.job_id|default(none)|tojson }},
 "site": {{ deployment.name|default(none)|tojson }}, "phase": {{ flow.name|default(none)|tojson }},
 "reason": {{ (event.resource["prefect.state-message"] or event.resource["prefect.state-name"])|tojson }},
 "flow_run": {{ flow_run.name|default(none)|tojson }}, "url": {{ flow_run|ui_url|default(none)|tojson }}}"""
# The coordinator's (and the CLI's) insitu.alert.<kind>: the job is the event's resource, the rest its payload.
INSITU_BODY = """{"alert": {{ event.payload.kind|tojson }}, "job": {{ event.resource["prefect.resource.name"]|tojson }},
 "site": {{ event.payload.site|default(none)|tojson }}, "phase": {{ event.payload.phase|default(none)|tojson }},
 "reason": {{ event.payload.detail|default(none)|tojson }}, "flow_run": null, "url": null}"""
SITE_RUN_STATES = {"site-run-failed": ("Failed", "Crashed"), "site-run-late": ("Late",)}


def automation_for(kind: str, block_id: Any) -> Any:
    """The automation of one alert kind: its trigger and its notification."""
    from prefect.events.actions import SendNotification
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    if kind in SITE_RUN_STATES:
        trigger = EventTrigger(
            expect={f"prefect.flow-run.{s}" for s in SITE_RUN_STATES[kind]},
            match={"prefect.resource.id": "prefect.flow-run.*"},
            match_related=ResourceSpecification({"prefect.resource.role": "flow",
                                                 "prefect.resource.name": list(SITE_FLOWS)}),
            posture=Posture.Reactive, threshold=1)
        body = SITE_RUN_BODY % kind
    else:
        trigger = EventTrigger(expect={f"insitu.alert.{kind}"}, match={"prefect.resource.id": "insitu.job.*"},
                               posture=Posture.Reactive, threshold=1)
        body = INSITU_BODY
    return AutomationCore(name=f"{PREFIX}{kind}", description=f"insitu alert: {kind} (conf/alerts.yaml)",
                          trigger=trigger, actions=[SendNotification(block_document_id=block_id,
                                                                     subject=f"insitu alert: {kind}", body=body)])


def ensure_alerts(cfg: AlertsConfig) -> list[str]:
    """Create or update the webhook block and one automation per alert kind ``cfg`` sends; remove those of kinds it
    no longer sends (all of them when it has no webhook). Returns the kinds now sent."""
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.client.orchestration import get_client

    wanted = list(cfg.events) if cfg.webhook is not None else []
    with get_client(sync_client=True) as client:
        ours = {a.name: a for a in client.read_automations() if a.name.startswith(PREFIX)}
        for name, automation in ours.items():
            if name.removeprefix(PREFIX) not in wanted:
                client.delete_automation(automation.id)
        if not wanted:
            return []
        assert cfg.webhook is not None
        block_id = CustomWebhookNotificationBlock(
            name="insitu", url=str(cfg.webhook.url), method="POST",
            headers={"Content-Type": "application/json"}, form_data="{{body}}",  # the rendered JSON, as sent
        ).save(BLOCK, overwrite=True)
        for kind in wanted:
            automation = automation_for(kind, block_id)
            same = [a for a in client.read_automations_by_name(automation.name)]
            if same:
                client.update_automation(same[0].id, automation)
                for extra in same[1:]:  # names are not unique on the server: one per kind
                    client.delete_automation(extra.id)
            else:
                client.create_automation(automation)
    log.info("alerts to %s: %s", cfg.webhook.url, ", ".join(wanted))
    return wanted


def emit_alert(kind: str, job_id: str, site: str, phase: str, detail: str) -> None:
    """An ``insitu.alert.<kind>`` event from outside a job's flow (``insitu audit verify``)."""
    from prefect.events import emit_event

    assert kind in ALERT_KINDS
    emit_event(event=f"insitu.alert.{kind}", resource={"prefect.resource.id": f"insitu.job.{job_id}",
                                                      "prefect.resource.name": job_id},
               payload={"kind": kind, "site": site, "phase": phase, "detail": detail})
