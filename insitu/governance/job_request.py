"""Which signed request a job runs under, decided on the coordinator before anything is dispatched.

The request passed in, else the standing approval of the training and dataset; either must cover this run
(:func:`insitu.governance.request.scope_refusal` for all three actions). Checked here so that a request every
site would refuse fails at once with the same reason; each site still decides with its own policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from insitu.governance.request import ACTIONS, RequestError, SignedRequest, scope_refusal

RULE = "request.matches-job"


def job_request(signed: SignedRequest | None, *, job_id: str, training: str, dataset: str, training_hash: str,
                overrides: Mapping[str, Any], now: datetime | None = None) -> SignedRequest:
    """``signed`` (the request passed in, or the standing approval found; None: neither), if it covers this run.

    Raises
    ------
    RequestError
        When there is no request, or it does not cover this job, dataset, training (by name and contents),
        its overrides or the time; the message says what to do.
    """
    if signed is None:
        raise RequestError(
            f"no signed request and no standing approval for training {training!r} on dataset {dataset!r}: start "
            f"the job with `insitu run --as NAME`, or have a data scientist approve it for scheduled and UI runs "
            f"with `insitu approve --as NAME --training {training} --dataset {dataset} --purpose …`")
    refusal = scope_refusal(signed.request, job_id=job_id, dataset=dataset, actions=ACTIONS, training=training,
                            training_hash=training_hash, overrides=dict(overrides), now=now)
    if refusal:
        raise RequestError(f"the job's request does not cover this run: {refusal[1]}; rule {refusal[0]}")
    return signed
