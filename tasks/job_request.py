"""The signed request a ``retrain`` run works under: the one passed in, else the standing approval."""

from __future__ import annotations

from typing import Any

from insitu.conf import load_training, trusted_training
from insitu.governance import job_request as request_rule
from insitu.governance.approvals import approvals_dir, find_approval
from insitu.governance.audit_service import Auditor
from insitu.governance.request import RequestError, SignedRequest, parse_signed, training_sha256


def job_request(request: dict[str, Any] | None, training: str, dataset: str, job_id: str, overrides: dict[str, Any],
                audit: Auditor, flow_run_id: str | None) -> SignedRequest:
    """The signed request this job runs under: ``request`` (the run's), else the standing approval, if it covers
    this run (:func:`insitu.governance.job_request.job_request`); a refusal is audited before it is raised."""
    try:
        given = parse_signed(request) if request else find_approval(approvals_dir(), training, dataset)
        digest = training_sha256(load_training(trusted_training(training)))
        return request_rule.job_request(given, job_id=job_id, training=training, dataset=dataset,
                                        training_hash=digest, overrides=overrides)
    except RequestError as e:
        audit.append("job.refused", job_id=job_id, flow_run_id=flow_run_id, rule=request_rule.RULE, reason=str(e))
        raise
