"""``conf/alerts.yaml``: who is told when a job or a site goes wrong (a webhook), and of what.

``insitu deploy`` turns it into Prefect automations (``deployments/alerts.py``); the coordinator reads
``slow_round_factor`` to judge its rounds. A missing file means no alerts."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, HttpUrl

from insitu.conf.strict import Strict

AlertKind = Literal["site-run-failed", "site-run-late", "site-dropped", "slow-round", "gate-refused",
                    "audit-verification-failed", "pool-paused", "run-forced", "run-cancelled"]
ALERT_KINDS: tuple[str, ...] = AlertKind.__args__  # type: ignore[attr-defined]


class WebhookConfig(Strict):
    url: HttpUrl
    """Where each alert is POSTed as one JSON object (alert, job, site, reason, flow_run, url): a Slack or Teams
    incoming webhook, a pager's, or your own receiver."""


class AlertsConfig(Strict):
    webhook: WebhookConfig | None = None
    """The alerts' destination; none: no alerts are sent (they are still audited and emitted as Prefect events)."""
    events: Annotated[list[AlertKind], Field(min_length=1)] = list(ALERT_KINDS)  # type: ignore[assignment]
    """Which alerts to send: ``site-run-failed`` (a site's flow run failed or crashed), ``site-run-late`` (a site's
    run not picked up in time: its worker or pool is down), ``site-dropped`` (a round went on without a site),
    ``slow-round`` (a round slower than ``slow_round_factor`` × the job's median round), ``gate-refused`` (the
    gate kept the champion), ``audit-verification-failed`` (an actor's audit log does not verify), and what the
    shared Prefect credential can do to a job: ``pool-paused``, ``run-forced``, ``run-cancelled`` (a site's pool
    paused, a site's run's state forced or cancelled by someone else; docs/security.md)."""
    slow_round_factor: Annotated[float, Field(gt=1.0)] = 3.0
    """A round counts as slow when it takes more than this multiple of the median of the job's rounds before it
    (judged from the third round on)."""
