"""The coordinator's control notices: abort, early stop, an async job's newest version, state and refusals, and
the dispatch of each site flow run (what the run was created with, so that a site can tell it was not changed)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from insitu.federated.documents.base import (
    MAX_ROUNDS,
    MAX_SHARDS,
    MAX_SITES,
    Doc,
    FlowRunId,
    Ident,
    JobId,
    Sha256,
    Site,
    StateName,
    Text,
)
from insitu.federated.documents.manifests import AppliedList


class Abort(Doc):
    reason: Text


class Stop(Doc):
    """``control/stop.json``: training ended early (the validation metric stopped improving)."""

    after_round: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    reason: Text


class Newest(Doc):
    """``control/newest.json``: the newest global version of an async job (what a site pulls next)."""

    version: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    sha256: Sha256
    target: Annotated[int, Field(ge=1, le=MAX_ROUNDS)]  # the job ends at this version


class AsyncState(Doc):
    """``control/async-state.json``: the parameter server between two decisions, for a resumed coordinator."""

    version: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    decisions: Annotated[int, Field(ge=0, le=10**7)]
    next_seq: Annotated[dict[Site, Annotated[int, Field(ge=0, le=10**6)]], Field(max_length=MAX_SITES)]
    refused: Annotated[dict[Site, Annotated[int, Field(ge=0, le=10**6)]], Field(max_length=MAX_SITES)]
    buffer: AppliedList
    buffer_state: StateName | None = None


class Refresh(Doc):
    """``control/refresh-<site>.json``: the coordinator refused the site's update ``seq``; pull ``version``."""

    recipient: Site
    seq: Annotated[int, Field(ge=0, le=10**6)]
    base_version: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    version: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    staleness: Annotated[int, Field(ge=0, le=MAX_ROUNDS)]
    reason: Text


class DispatchedParameters(Doc):
    """The parameters of one site flow run as the coordinator created it (the request by its digest)."""

    job_id: JobId
    dataset: Ident
    training: Ident
    overrides: Annotated[dict[Literal["rounds", "local_epochs", "batch_size"], Annotated[int, Field(ge=1)]],
                         Field(max_length=3)] = {}
    request: Sha256 | None = None
    shards: Annotated[list[Ident], Field(max_length=MAX_SHARDS)] | None = None
    weights: Annotated[list[StateName], Field(max_length=8)] | None = None
    wait_timeout_s: Annotated[float, Field(gt=0, le=10**7)] | None = None


class Dispatch(Doc):
    """``control/dispatch-<phase>-<site>.json``: the coordinator created flow run ``flow_run_id`` of ``phase`` on
    ``recipient``'s pool with ``parameters``. Only the coordinator can write it (the exchange's IAM); the site
    admits a run only with the dispatch that names that very run, and only once
    (:mod:`insitu.governance.dispatch`)."""

    recipient: Site
    phase: Literal["prepare", "train", "evaluate"]
    flow_run_id: FlowRunId
    parameters: DispatchedParameters
    goes_on: bool = False
    """The run waits, past this phase, for the coordinator to dispatch the job's next phase to it (one site run per
    job); a run dispatched alone ends with its phase."""
