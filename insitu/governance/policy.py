"""A site's own policy: who may do what with its data, decided at the site, deny by default.

Each site holds one policy bundle, signed by one of its site admins (whose public keys the site's
operator put in the site's identity file when it started the site, so nobody else can change it)::

    {"policy": {"site": "eu", "version": 2, "issued_at": "…",
                "principals": {"alice": {"public_key": "<hex>", "roles": ["data-scientist"]}},
                "limits": {"min_rows_per_aggregate": 20},
                "cedar": "@id(\"…\") permit (…) when {…};"},
     "signer": "eu-admin", "signature": "<hex>"}

A request is admitted in two steps, each with a named rule so the audit trail says which one decided:

1. the request itself (``request.*`` rules): present, from a principal this policy lists, signed by that
   principal's key, not expired, for this job, dataset, action, training configuration (by content hash)
   and overrides;
2. the site's rules, written in Cedar and evaluated by the Cedar engine (``cedarpy``): the principal (with
   its roles as parents), the action, the dataset, and a context of purpose, strategy, aggregator, rounds,
   local epochs, ranks and whether it is a standing approval. Cedar denies unless a ``permit`` matches and
   no ``forbid`` does; the rule reported is the ``@id`` of the deciding policy, or ``default-deny``.

Cedar was chosen over Casbin because a site's rules are conditions on attributes (rounds ≤ 50, purpose in a
set), not only role/object/action triples, because ``forbid`` always wins, and because a policy is
validated against a schema before it is installed, so a typo in a context attribute is an error, not a
rule that silently never matches.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import cedarpy
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from insitu.data.limits import ShardLimits
from insitu.governance.default_policy import DEFAULT_CEDAR  # the platform's first policy, exported from here too
from insitu.governance.principals import PRINCIPAL_NAME, ROLES, key_id, sign, verify_signature
from insitu.governance.request import (
    Action,
    RequestError,
    SignedRequest,
    parse_signed,
    scope_refusal,
)

log = logging.getLogger(__name__)

RULE_SIGNED_POLICY = "policy.signed-by-site-admin"
RULE_NO_REQUEST = "request.present"
RULE_MALFORMED = "request.well-formed"
RULE_UNKNOWN_PRINCIPAL = "request.known-principal"
RULE_SIGNATURE = "request.signature"
RULE_DEFAULT_DENY = "default-deny"
RULE_CEDAR_ERROR = "cedar.evaluation-error"

CEDAR_SCHEMA: dict[str, Any] = {
    "Insitu": {
        "entityTypes": {"Role": {}, "Principal": {"memberOfTypes": ["Role"]}, "Dataset": {}},
        "actions": {
            a: {"appliesTo": {
                "principalTypes": ["Principal"], "resourceTypes": ["Dataset"],
                "context": {"type": "Record", "attributes": {
                    "purpose": {"type": "String"}, "training": {"type": "String"},
                    "strategy": {"type": "String"}, "aggregator": {"type": "String"},
                    "task": {"type": "String"}, "model": {"type": "String"},
                    "rounds": {"type": "Long"}, "local_epochs": {"type": "Long"},
                    "ranks_per_site": {"type": "Long"}, "standing": {"type": "Bool"},
                    # sync | async (federation.mode): a site may admit only synchronous rounds
                    "federation": {"type": "String"},
                }},
            }}
            for a in ("prepare", "train", "evaluate")
        },
    }
}

RULE_JOB_OWNER = "request.job-owner"



class PolicyError(PermissionError):
    """The site's policy is missing, malformed, or not signed by one of the site's admins."""


class PolicyRefused(PermissionError):
    """The site's policy refuses a request (the message says who, what and which rule)."""

    def __init__(self, decision: Decision) -> None:
        super().__init__(decision.reason)
        self.decision = decision


class PrincipalEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    public_key: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    roles: Annotated[list[str], Field(min_length=1)]


class Limits(ShardLimits):
    """The site's limits: its floor for published aggregates, and what one shard may be (checked before parsing)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    min_rows_per_aggregate: Annotated[int, Field(ge=1, le=1_000_000,
                                                 description="fewest rows any published aggregate covers")] = 20


class SitePolicy(BaseModel):
    """The signed contents of a site's policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    site: str
    version: Annotated[int, Field(ge=1)]
    issued_at: datetime
    principals: dict[Annotated[str, Field(pattern=PRINCIPAL_NAME.pattern)], PrincipalEntry]
    limits: Limits = Limits()
    cedar: Annotated[str, Field(max_length=200_000)]


class SignedPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    policy: SitePolicy
    signer: Annotated[str, Field(pattern=PRINCIPAL_NAME.pattern)]
    signature: Annotated[str, Field(pattern=r"^[0-9a-f]{128}$")]


@dataclass(frozen=True)
class Decision:
    """What the site decided about one request, and why."""

    allowed: bool
    rule: str
    reason: str
    action: str
    dataset: str
    principal: str | None = None
    """The verified principal (None when the request was not verified)."""
    claimed: str | None = None
    """The principal the request names, verified or not."""
    request: str | None = None
    """The signed request's digest."""
    policy_version: int | None = None
    roles: list[str] = field(default_factory=list)
    standing: bool | None = None
    """Whether the admitted request was a standing approval (None when not verified)."""

    def audit_fields(self) -> dict[str, Any]:
        return {"allowed": self.allowed, "rule": self.rule, "reason": self.reason, "action": self.action,
                "dataset": self.dataset, "principal": self.principal, "claimed_principal": self.claimed,
                "request": self.request, "policy_version": self.policy_version, "roles": self.roles}


# --------------------------------------------------------------------------- writing and loading
def check_cedar(cedar: str) -> None:
    """Validate Cedar policies against insitu's schema (unknown attributes, actions or types are errors).

    Raises
    ------
    PolicyError
        With each validation error of the Cedar validator.
    """
    try:
        result = cedarpy.validate_policies(cedar, CEDAR_SCHEMA)
    except Exception as e:  # a parse error surfaces as an exception from the binding
        raise PolicyError(f"the Cedar policy does not parse: {e}") from None
    if not result.validation_passed:
        raise PolicyError("the Cedar policy does not validate against insitu's schema: "
                          + "; ".join(err.error for err in result.errors))


def sign_policy(policy: SitePolicy, signer: str, key: Any) -> SignedPolicy:
    """Validate ``policy``'s Cedar text and sign the bundle as ``signer`` (a site admin)."""
    check_cedar(policy.cedar)
    return SignedPolicy(policy=policy, signer=signer, signature=sign(key, policy.model_dump(mode="json")))


def _signed_forms(policy: SitePolicy) -> list[dict[str, Any]]:
    """What a signature over ``policy`` may cover: today's form, and (when its shard limits are the defaults)
    the form before shard limits existed, whose ``limits`` held only the row floor, so that a policy an
    admin signed before still verifies."""
    body = policy.model_dump(mode="json")
    forms = [body]
    shard_fields = set(ShardLimits.model_fields)
    if policy.limits.model_dump(include=shard_fields) == ShardLimits().model_dump():
        forms.append({**body, "limits": policy.limits.model_dump(mode="json", exclude=shard_fields)})
    return forms


def verify_policy(signed: SignedPolicy, site: str, admins: dict[str, str]) -> SitePolicy:
    """The policy, if it is this site's and signed by one of the site's admins.

    Raises
    ------
    PolicyError
        Naming the signer and the rule ``policy.signed-by-site-admin``.
    """
    pub = admins.get(signed.signer)
    if pub is None or not any(verify_signature(pub, body, signed.signature) for body in _signed_forms(signed.policy)):
        who = "is not one of its site admins" if pub is None else "did not sign it (the signature does not verify)"
        raise PolicyError(f"site {site!r} refuses a policy signed by {signed.signer!r}: the signer {who} "
                          f"{sorted(admins)}; rule {RULE_SIGNED_POLICY}")
    if signed.policy.site != site:
        raise PolicyError(f"site {site!r} refuses a policy written for site {signed.policy.site!r}; "
                          f"rule {RULE_SIGNED_POLICY}")
    check_cedar(signed.policy.cedar)
    return signed.policy


def read_signed_policy(path: Path) -> SignedPolicy:
    try:
        return SignedPolicy.model_validate_json(path.read_text())
    except FileNotFoundError:
        raise PolicyError(f"no site policy at {path}: every request is refused until a site admin installs one "
                          "(`insitu policy apply`)") from None
    except ValidationError as e:
        err = e.errors()[0]
        raise PolicyError(f"site policy {path} is malformed at {'.'.join(map(str, err['loc']))}: {err['msg']}") \
            from None


def load_policy(path: Path, site: str, admins: dict[str, str]) -> SitePolicy:
    """Read and verify the site's policy file (see :func:`verify_policy`)."""
    return verify_policy(read_signed_policy(path), site, admins)


# --------------------------------------------------------------------------- deciding
def _entities(policy: SitePolicy, dataset: str) -> list[dict[str, Any]]:
    roles = sorted({r for p in policy.principals.values() for r in p.roles})
    ents: list[dict[str, Any]] = [{"uid": {"type": "Insitu::Role", "id": r}, "attrs": {}, "parents": []}
                                  for r in roles]
    ents += [{"uid": {"type": "Insitu::Principal", "id": name}, "attrs": {},
              "parents": [{"type": "Insitu::Role", "id": r} for r in p.roles]} for name, p in policy.principals.items()]
    ents.append({"uid": {"type": "Insitu::Dataset", "id": dataset}, "attrs": {}, "parents": []})
    return ents


def _policy_ids(cedar: str) -> dict[str, str]:
    """Cedar's own policy ids (``policy0``…) → the ``@id`` annotations the site admin wrote."""
    parsed = json.loads(cedarpy.policies_to_json_str(cedar))
    return {pid: (p.get("annotations") or {}).get("id", pid) for pid, p in parsed.get("staticPolicies", {}).items()}


def job_context(training: Any) -> dict[str, Any]:
    """What a job will really run with (a :class:`insitu.conf.TrainingConfig`, overrides applied), as
    :func:`decide` takes it: the Cedar context's attributes and the values a standing approval bounds."""
    return {"strategy": training.strategy, "aggregator": training.aggregator.name, "task": training.task.name,
            "model": training.model.name, "rounds": training.rounds,
            "local_epochs": training.local_epochs, "ranks_per_site": training.ranks_per_site,
            "batch_size": training.batch_size, "federation": training.federation.mode}


def decide(
    policy: SitePolicy,
    request: Any,
    *,
    action: Action,
    dataset: str,
    job_id: str,
    training: str,
    training_hash: str,
    overrides: dict[str, Any] | None,
    context: dict[str, Any],
    now: datetime | None = None,
) -> Decision:
    """Decide one request for one action on this site (pure: no I/O, no audit; the caller audits).

    ``context`` carries what the job will really do, from the site's own reading of the training
    configuration with the overrides applied: strategy, aggregator, rounds, local_epochs, ranks_per_site.
    """
    base = {"action": action, "dataset": dataset, "policy_version": policy.version}
    site = policy.site

    def deny(rule: str, why: str, signed: SignedRequest | None = None, principal: str | None = None) -> Decision:
        claimed = signed.request.principal if signed else None
        who = principal or (f"{claimed!r} (unverified)" if claimed else "an unsigned caller")
        return Decision(False, rule, f"site {site!r} refuses {action} on dataset {dataset!r} (job {job_id}) for "
                        f"{who}: {why}; rule {rule}", principal=principal, claimed=claimed,
                        request=signed.digest() if signed else None, **base)

    if request is None or request == {}:
        return deny(RULE_NO_REQUEST, "the run carries no signed request (sign one with `insitu run --as NAME`, or "
                    "approve the training configuration with `insitu approve --as NAME`)")
    try:
        signed = parse_signed(request)
    except RequestError as e:
        return deny(RULE_MALFORMED, str(e))
    req = signed.request
    entry = policy.principals.get(req.principal)
    if entry is None:
        return deny(RULE_UNKNOWN_PRINCIPAL, f"principal {req.principal!r} is not in this site's policy", signed)
    if not signed.verifies_with(entry.public_key):
        return deny(RULE_SIGNATURE, f"the signature does not verify with {req.principal!r}'s key "
                    f"{key_id(entry.public_key)} (altered, or signed by someone else)", signed)
    who = req.principal
    refusal = scope_refusal(req, job_id=job_id, dataset=dataset, actions=(action,), training=training,
                            training_hash=training_hash, overrides=overrides, effective=context, now=now)
    if refusal:
        return deny(refusal[0], refusal[1], signed, who)

    ctx = {"purpose": req.purpose, "training": training, "standing": req.standing,
           **{k: context[k] for k in ("strategy", "aggregator", "task", "model", "rounds", "local_epochs",
                                      "ranks_per_site")},
           "federation": context.get("federation", "sync")}  # contexts made before async mode: sync
    result = cedarpy.is_authorized(
        {"principal": f'Insitu::Principal::"{who}"', "action": f'Insitu::Action::"{action}"',
         "resource": f'Insitu::Dataset::"{dataset}"', "context": ctx},
        policy.cedar, _entities(policy, dataset))
    ids = _policy_ids(policy.cedar)
    if result.diagnostics.errors:
        # Cedar skips a policy whose evaluation errs: a failing forbid would let a permit through. Fail closed.
        errs = "; ".join(str(getattr(e, "error", e)) for e in result.diagnostics.errors)
        return deny(RULE_CEDAR_ERROR, f"a rule of this site's policy could not be evaluated ({errs[:300]})", signed,
                    who)
    rules = [ids.get(r, r) for r in result.diagnostics.reasons]
    rule = ",".join(rules) or RULE_DEFAULT_DENY
    if not result.allowed:
        why = ("no rule of this site's policy permits it" if not rules else "forbidden by this site's policy")
        # Every attribute the policy decided on, so that the refusal shows which one no rule admits.
        decided = ", ".join(f"{k} {v!r}" for k, v in ctx.items())
        why += f" ({decided}, roles {entry.roles})"
        return deny(rule, why, signed, who)
    return Decision(True, rule, f"site {site!r} admits {action} on dataset {dataset!r} (job {job_id}) for {who!r} "
                    f"(roles {entry.roles}, purpose {req.purpose!r}); rule {rule}", principal=who, claimed=who,
                    request=signed.digest(), roles=list(entry.roles), standing=req.standing, **base)


def job_owner_refusal(d: Decision, first: dict[str, Any] | None, training: str) -> Decision:
    """``d``, or a refusal when this job id was first admitted for another training configuration, or for a
    signed job request while this is a standing approval (whose holder could otherwise overwrite a running
    job's prepared data). ``first`` is what the site recorded when it first admitted the job."""
    if not d.allowed or first is None:
        return d
    why = ""
    if first.get("training") != training:
        why = f"job {first.get('job_id')} was first admitted here for training {first.get('training')!r}"
    elif first.get("standing") is False and d.standing:
        why = (f"job {first.get('job_id')} was first admitted here for {first.get('principal')!r}'s signed job "
               "request; a standing approval may not run under its id")
    if not why:
        return d
    return Decision(False, RULE_JOB_OWNER, f"{d.reason.split(';')[0].replace('admits', 'refuses')}: {why}; "
                    f"rule {RULE_JOB_OWNER}", d.action, d.dataset, d.principal, d.claimed, d.request,
                    d.policy_version, d.roles, d.standing)


__all__ = ["CEDAR_SCHEMA", "DEFAULT_CEDAR", "ROLES", "Decision", "Limits", "PolicyError", "PolicyRefused",
           "PrincipalEntry", "SignedPolicy", "SitePolicy", "check_cedar", "decide", "job_context", "job_owner_refusal",
           "load_policy", "read_signed_policy", "sign_policy", "verify_policy"]
