"""Job requests: what a principal asks a site to do, signed so that nobody on the way can change it.

A request names the principal, the dataset, the actions (``prepare``, ``train``, ``evaluate``), the
training configuration by name *and* by the hash of its contents, the overrides, the purpose and an expiry.
It is signed with the principal's Ed25519 key and travels unchanged from the CLI through the coordinator to
every site, which checks it against its own policy (``insitu.governance.policy``). The coordinator holds
no principal's key, so a compromised coordinator can only forward requests someone signed.

Two shapes:

- a **job request** is bound to one ``job_id`` and carries exact ``overrides`` (``insitu run --as``);
- a **standing approval** has no ``job_id`` and carries ``override_bounds`` instead: runs started from the
  Prefect UI or a schedule use it, with overrides only inside the bounds (``insitu approve --as``).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from insitu.governance.principals import PRINCIPAL_NAME, canonical, sign, verify_signature

Action = Literal["prepare", "train", "evaluate"]
ACTIONS: tuple[Action, ...] = ("prepare", "train", "evaluate")
OVERRIDABLE = ("rounds", "local_epochs", "batch_size")
NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
MAX_TTL = timedelta(days=366)


class RequestError(PermissionError):
    """A request is malformed, or does not match what it is used for."""


class Bounds(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    min: Annotated[int, Field(ge=1)] = 1
    max: Annotated[int, Field(ge=1, le=1_000_000)]


class JobRequest(BaseModel):
    """The signed part of a request (every field is covered by the signature)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    principal: Annotated[str, Field(pattern=PRINCIPAL_NAME.pattern)]
    dataset: Annotated[str, Field(pattern=NAME)]
    actions: Annotated[list[Action], Field(min_length=1, max_length=3)]
    training: Annotated[str, Field(pattern=NAME)]
    training_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    purpose: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9 ._-]{0,79}$")]
    job_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")] | None = None
    overrides: dict[Literal["rounds", "local_epochs", "batch_size"], Annotated[int, Field(ge=1)]] = {}
    override_bounds: dict[Literal["rounds", "local_epochs", "batch_size"], Bounds] = {}
    issued_at: datetime
    expires_at: datetime
    nonce: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]

    @model_validator(mode="after")
    def _shape(self) -> JobRequest:
        if self.job_id is None and self.overrides:
            raise ValueError("a standing approval (no job_id) carries override_bounds, not overrides")
        if self.job_id is not None and self.override_bounds:
            raise ValueError("a job request (with job_id) carries exact overrides, not override_bounds")
        if self.expires_at <= self.issued_at:
            raise ValueError("expires_at must be after issued_at")
        if self.expires_at - self.issued_at > MAX_TTL:
            raise ValueError(f"a request may be valid for at most {MAX_TTL.days} days")
        return self

    @property
    def standing(self) -> bool:
        return self.job_id is None


class SignedRequest(BaseModel):
    """A request and its principal's signature, as it travels in a flow run's parameters."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    request: JobRequest
    signature: Annotated[str, Field(pattern=r"^[0-9a-f]{128}$")]

    def payload(self) -> dict[str, Any]:
        return self.request.model_dump(mode="json")

    def verifies_with(self, public_hex: str) -> bool:
        return verify_signature(public_hex, self.payload(), self.signature)

    def digest(self) -> str:
        """SHA-256 of the signed payload and signature: how the audit trail names this request."""
        return hashlib.sha256(canonical({"request": self.payload(), "signature": self.signature})).hexdigest()


def training_sha256(training: Any) -> str:
    """The hash a request pins a training configuration by: its validated contents, before overrides.

    ``training`` is a :class:`insitu.conf.TrainingConfig`; the hash is over its canonical JSON, so
    comments and key order in the YAML do not matter but every value does.
    """
    return hashlib.sha256(canonical(training.model_dump(mode="json"))).hexdigest()


def new_request(principal: str, dataset: str, training: str, training_hash: str, purpose: str,
                actions: list[Action] | None = None, job_id: str | None = None,
                overrides: dict[str, int] | None = None, override_bounds: dict[str, dict[str, int]] | None = None,
                ttl: timedelta = timedelta(hours=12), now: datetime | None = None) -> JobRequest:
    """Build (not sign) a request; validation errors say which field is wrong."""
    now = now or datetime.now(UTC)
    try:
        return JobRequest(principal=principal, dataset=dataset, actions=actions or list(ACTIONS), training=training,
                          training_sha256=training_hash, purpose=purpose, job_id=job_id, overrides=overrides or {},
                          override_bounds=override_bounds or {}, issued_at=now, expires_at=now + ttl,
                          nonce=secrets.token_hex(16))
    except ValidationError as e:
        raise RequestError(f"invalid request: {_first_error(e)}") from None


def sign_request(request: JobRequest, key: Any) -> SignedRequest:
    """Sign ``request`` with an Ed25519 private key."""
    return SignedRequest(request=request, signature=sign(key, request.model_dump(mode="json")))


def parse_signed(obj: Any) -> SignedRequest:
    """A signed request from a flow parameter or a file's JSON.

    Raises
    ------
    RequestError
        When it is not a well-formed signed request; the message names the first wrong field and never
        echoes its value (a parameter is attacker-controlled).
    """
    if isinstance(obj, str | bytes):
        try:
            obj = json.loads(obj)
        except ValueError:
            raise RequestError("the request is not JSON") from None
    try:
        return SignedRequest.model_validate(obj)
    except ValidationError as e:
        raise RequestError(f"malformed request: {_first_error(e)}") from None


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(root)"
    return f"field {loc!r}: {err['msg']}"


def bounds_admit(req: JobRequest, overrides: dict[str, Any]) -> str:
    """Why ``overrides`` are not what ``req`` allows, or ``""`` when they are.

    A job request admits exactly its own overrides; a standing approval admits overrides of the keys it
    bounds, each inside its bounds, and nothing else.
    """
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    if not req.standing:
        if given != dict(req.overrides):
            return f"overrides {sorted(given)} differ from the signed overrides {sorted(req.overrides)}"
        return ""
    for k, v in given.items():
        b = req.override_bounds.get(k)  # type: ignore[call-overload]
        if b is None:
            return f"override {k!r} is not allowed by the approval (it bounds {sorted(req.override_bounds)})"
        if not isinstance(v, int) or isinstance(v, bool) or not b.min <= v <= b.max:
            return f"override {k!r} is outside the approved bounds [{b.min}, {b.max}]"
    return ""


def bounds_admit_effective(req: JobRequest, effective: dict[str, Any]) -> str:
    """For a standing approval: why the values the job will really run with (the configuration's, after
    overrides) fall outside its bounds, or ``""``. An approval of at most 3 rounds must not run a
    configuration's 5 just because no override was given."""
    if not req.standing:
        return ""
    for k, b in req.override_bounds.items():
        v = effective.get(k)
        if v is not None and not b.min <= int(v) <= b.max:
            return f"{k} = {v} (the configuration's, after overrides) is outside the approved bounds [{b.min}, {b.max}]"
    return ""


RULE_EXPIRED = "request.not-expired"
RULE_JOB = "request.job"
RULE_DATASET = "request.dataset"
RULE_ACTION = "request.action"
RULE_TRAINING = "request.training"
RULE_OVERRIDES = "request.overrides"
SKEW = timedelta(minutes=5)
"""Clock skew tolerated on ``issued_at`` between the signer's machine and the checker's."""


def scope_refusal(req: JobRequest, *, job_id: str, dataset: str, actions: tuple[str, ...], training: str,
                  training_hash: str, overrides: dict[str, Any] | None, effective: dict[str, Any] | None = None,
                  now: datetime | None = None) -> tuple[str, str] | None:
    """``(rule, why)`` when a (verified) request does not cover this use of it, else None.

    The one check of what a request covers: each site runs it for its own action (with ``effective``, the
    values the job will really run with), and the coordinator for all three before it dispatches anything, so
    that a request every site would refuse fails at once with the same reason.
    """
    now = now or datetime.now(UTC)
    if not req.issued_at - SKEW <= now <= req.expires_at:
        return RULE_EXPIRED, (f"the request is valid from {req.issued_at:%Y-%m-%dT%H:%M:%SZ} to "
                              f"{req.expires_at:%Y-%m-%dT%H:%M:%SZ}; now is {now:%Y-%m-%dT%H:%M:%SZ} (sign a new one)")
    if req.job_id is not None and req.job_id != job_id:
        return RULE_JOB, f"the request was signed for job {req.job_id}, not {job_id}"
    if req.dataset != dataset:
        return RULE_DATASET, f"the request was signed for dataset {req.dataset!r}, not {dataset!r}"
    if missing := [a for a in actions if a not in req.actions]:
        return RULE_ACTION, f"the request allows only {req.actions}, not {missing}"
    if req.training != training or req.training_sha256 != training_hash:
        return RULE_TRAINING, (f"the request was signed for training {req.training!r} with contents "
                               f"{req.training_sha256[:12]}…; here {training!r} is {training_hash[:12]}… (changed "
                               "since it was signed: sign a new request)")
    why = bounds_admit(req, overrides or {}) or bounds_admit_effective(req, effective or {})
    return (RULE_OVERRIDES, why) if why else None


def sign_for(key_file: Any, principal: str, training: str, dataset: str, purpose: str, *,
             job_id: str | None = None, overrides: dict[str, int] | None = None,
             override_bounds: dict[str, dict[str, int]] | None = None, ttl: timedelta = timedelta(hours=12),
             conf_directory: Any = None) -> SignedRequest:
    """Build and sign a request for ``training`` (a name in ``conf/training/``) as the principal holding
    ``key_file``: what ``insitu run --as`` and ``insitu approve --as`` do on the user's machine."""
    from insitu.conf import load_training, trusted_training
    from insitu.governance.principals import load_private_key

    digest = training_sha256(load_training(trusted_training(training, conf_directory)))
    req = new_request(principal, dataset, training, digest, purpose, job_id=job_id, overrides=overrides,
                      override_bounds=override_bounds, ttl=ttl)
    return sign_request(req, load_private_key(key_file))
