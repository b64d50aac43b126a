"""The coordinator's side of :mod:`insitu.federated.claims` and :mod:`insitu.federated.consensus`: read what each
site committed to before training, log and audit every refused claim, log and name every site that disagrees.

The decisions are the core's; this module only reads the exchange, logs and writes the audit log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prefect import get_run_logger
from prefect.exceptions import MissingContextError

from insitu.conf import ValidationConfig
from insitu.federated.claims import ClaimRefusal, committed_rows
from insitu.federated.consensus import Judged, judge
from insitu.federated.exchange import Exchange
from insitu.federated.paths import PREPARE_STATS
from insitu.federated.validation import Selection
from insitu.governance.audit_service import Auditor
from insitu.job import JobSpec
from insitu.specs import TaskSpec


def _logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    try:
        return get_run_logger()
    except MissingContextError:  # called outside a flow run (a test): the module's own logger
        return logging.getLogger(__name__)


def committed_counts(ex: Exchange, sites: Iterable[str]) -> dict[str, dict[str, int]]:
    """Each site's rows per split, from the prepare statistics it published before round 0 (schema-checked)."""
    return {s: committed_rows(ex.get_json(PREPARE_STATS, writer=s)) for s in sites
            if ex.exists(PREPARE_STATS, writer=s)}


def audit_refusals(audit: Auditor | None, job_id: str, flow_run_id: str | None, event: str,
                   refusals: Iterable[ClaimRefusal], **fields: Any) -> None:
    """Log and audit each refused claim (``update.refused`` for an update, ``metrics.refused`` for metrics)."""
    for r in refusals:
        _logger().warning("%s refused: %s", r.what, r.reason)
        if audit is not None:
            audit.append(event, job_id=job_id, flow_run_id=flow_run_id, **fields, **r.as_audit())


def judged_metrics(per_site: Mapping[str, Mapping[str, Any]], committed: Mapping[str, Mapping[str, int]],
                   task: TaskSpec, config: ValidationConfig, metric: str, split: str, what: str,
                   audit: Auditor | None, job_id: str, flow_run_id: str | None,
                   selection: Selection | None = None) -> Judged:
    """:func:`insitu.federated.consensus.judge` the sites' metrics; audit what it refused, log and name (on
    ``selection``, for the summary) the sites it refused or found disagreeing."""
    j = judge(task, per_site, committed, split, what, metric, config)
    audit_refusals(audit, job_id, flow_run_id, "metrics.refused", j.refused)
    for site, gap in j.disagreeing.items():
        why = (f"{what}: {metric} differs from the sites' median by {gap:+.4f} (more than "
               f"validation.max_disagreement {config.max_disagreement:g})")
        _logger().warning("site %s disagrees with the others: %s", site, why)
        if selection is not None:
            selection.suspect(site, why)
    if selection is not None:
        for r in j.refused:
            selection.suspect(r.site, r.reason)
    return j


def judge_evaluations(ex: Exchange, by_site: Mapping[str, Mapping[str, Mapping[str, Any]]], conf: JobSpec,
                      selection: Selection | None, audit: Auditor | None, flow_run_id: str | None
                      ) -> Callable[[str], tuple[dict[str, dict[str, Any]], Judged]]:
    """``judge(model)``: the sites' test metrics of ``model`` that keep to their ranges and to each site's committed
    test rows (the others refused and audited), and their :class:`Judged` combination (the gate's metric)."""
    committed = committed_counts(ex, by_site)
    t = conf.training
    metric = conf.task.gate_metric(t.gate.primary_metric).name

    def judge(model: str) -> tuple[dict[str, dict[str, Any]], Judged]:
        per_site = {s: dict(models[model]) for s, models in by_site.items()}
        j = judged_metrics(per_site, committed, conf.task, t.validation, metric, "test", f"the evaluation of {model}",
                           audit, ex.job_id, flow_run_id, selection)
        refused = {r.site for r in j.refused}
        return {s: m for s, m in per_site.items() if s not in refused}, j

    return judge
