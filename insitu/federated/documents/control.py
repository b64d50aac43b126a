"""The coordinator's control notices: abort, early stop, and an async job's newest version, state and refusals."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from insitu.federated.documents.base import MAX_ROUNDS, MAX_SITES, Doc, Sha256, Site, StateName, Text
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
