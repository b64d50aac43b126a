"""Who and where a flow run is: its site (from the worker's own identity file), its pool, its stores."""

from __future__ import annotations

import json
import os
import pwd
from dataclasses import dataclass, replace
from typing import Any

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext

from insitu.conf import Conf, check_job_id, load_conf, load_training, trusted_training
from insitu.federated.exchange import Exchange
from insitu.governance.audit_service import Auditor
from insitu.governance.dispatch import RULE_CONFIG, request_digest
from insitu.governance.identity import Identity, IdentityError, check_pool, load_identity, refuse_runtime_overrides
from insitu.governance.policy import (
    Decision,
    PolicyError,
    PolicyRefused,
    SitePolicy,
    decide,
    job_context,
    job_owner_refusal,
    load_policy,
)
from insitu.governance.policy_version import RULE_VERSION, installed_refusal
from insitu.governance.request import Action, training_sha256
from insitu.job import JobSpec, resolve
from insitu.storage import Store, store_from_env
from tasks.dispatch_binding import bind_to_dispatch


@dataclass
class SiteContext:
    site: str
    conf: JobSpec
    store: Store
    exchange: Exchange
    audit: Auditor
    flow_run_id: str | None
    ran_as: dict[str, str]
    decision: Decision
    policy: SitePolicy
    identity: Identity  # from the worker's own identity file
    parsed: Conf  # the job's configuration as this site parsed it (what its policy decides on)
    received: dict[str, Any]  # the run's job parameters as received: job_id, dataset, training, overrides, request
    dispatch: dict[str, Any]  # the coordinator's dispatch that admitted the current phase (``goes_on``: wait for more)

    @property
    def principal(self) -> str:
        """The principal whose signed request the site's policy admitted (verified, never a parameter)."""
        assert self.decision.principal is not None
        return self.decision.principal

    @property
    def min_rows(self) -> int:
        """The site's own floor: no published aggregate covers fewer rows."""
        return self.policy.limits.min_rows_per_aggregate


def current_flow_run_id() -> str | None:
    """This flow run's id from the engine's own context (not ``prefect.runtime``, which env vars can override)."""
    ctx = FlowRunContext.get()
    return str(ctx.flow_run.id) if ctx and ctx.flow_run else None


def flow_run_pool(flow_run_id: str | None) -> str | None:
    """The work pool the Prefect API says this flow run was submitted to (None when run directly)."""
    if flow_run_id is None:
        return None
    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id).work_pool_name


def ran_as(ident: Identity) -> dict[str, str]:
    """Who ran a step, as the summary reports it: the actor, its OS user and its pool."""
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = str(os.geteuid())
    return {"actor": ident.actor, "os_user": user, "pool": ident.work_pool}


def actor_identity(role: str, job_id: str | None) -> tuple[Identity, str | None]:
    """This process's identity, checked: right role, no runtime overrides, the flow run is on its pool.

    Every refusal is audited in the actor's own log before it is raised.
    """
    ident = load_identity()
    fr_id = current_flow_run_id()
    if ident.role != role:
        raise IdentityError(f"this flow needs a {role} worker; {ident.actor!r} is a {ident.role}")
    refuse_runtime_overrides(ident, fr_id)
    check_pool(ident, flow_run_pool(fr_id), fr_id, job_id)
    return ident, fr_id


def admit(ident: Identity, action: Action, job_id: str, training: str, dataset: str,
          overrides: dict[str, Any] | None, request: dict[str, Any] | None, conf: Conf, store: Store,
          flow_run_id: str | None) -> tuple[Decision, SitePolicy]:
    """Decide the run's signed request with this site's own policy; audit the decision either way.

    Raises
    ------
    PolicyRefused
        When the policy refuses (or cannot be loaded: then every request is refused).
    """
    audit = ident.audit()
    try:
        if ident.policy is None:
            raise PolicyError(f"site {ident.actor!r} has no policy file in its identity {ident.path}")
        policy = load_policy(ident.policy, ident.actor, ident.admins)
        older = installed_refusal(ident.policy, ident.actor, policy.version)
        if older:  # an older signed policy put back: every request is refused until the admin installs a newer one
            raise PolicyError(older)
    except PolicyError as e:
        rule = RULE_VERSION if RULE_VERSION in str(e) else "policy.signed-by-site-admin"
        audit.append("policy.refused", job_id=job_id, flow_run_id=flow_run_id, action=action, dataset=dataset,
                     rule=rule, reason=str(e))
        raise
    digest = training_sha256(load_training(trusted_training(training)))
    d = decide(policy, request, action=action, dataset=dataset, job_id=job_id, training=training,
               training_hash=digest, overrides=overrides, context=job_context(conf.training))
    first = _first_admission(store, job_id)
    d = job_owner_refusal(d, first, training)
    audit.append("policy.decision", job_id=job_id, flow_run_id=flow_run_id, training=training, **d.audit_fields())
    if not d.allowed:
        raise PolicyRefused(d)
    if first is None:
        record = {"job_id": job_id, "training": training, "standing": d.standing, "principal": d.principal,
                  "request": d.request}
        store.write_bytes(_admission_key(job_id), json.dumps(record, sort_keys=True).encode())
    return d, policy


def _admission_key(job_id: str) -> str:
    return f"admissions/{job_id}.json"


def _first_admission(store: Store, job_id: str) -> dict[str, Any] | None:
    """What this site recorded, in its own store, when it first admitted ``job_id`` (None the first time)."""
    try:
        return json.loads(store.fs.cat_file(store.path(_admission_key(job_id))))  # one GET: rides out an outage
    except FileNotFoundError:
        return None


def site_context(job_id: str, training: str, dataset: str, overrides: dict[str, Any] | None,
                 request: dict[str, Any] | None, action: Action,
                 phase_parameters: dict[str, Any] | None = None) -> SiteContext:
    """Resolve this site's identity and stores, admit the run's signed request with the site's policy, and check
    that the run is the one the coordinator dispatched, with the parameters it dispatched (``phase_parameters``:
    the phase's own, e.g. ``weights``), admitted once (:mod:`insitu.governance.dispatch`).

    Refuses to run anywhere but on this site's own pool, and for anyone its policy does not admit.
    """
    logger = get_run_logger()
    ident, fr_id = actor_identity("site", job_id)
    site = ident.actor
    try:
        check_job_id(job_id)
        # Parsed only: resolving names imports code (a user's model factory), and nothing is imported for a run
        # that this site's policy has not admitted (the overrides come from whoever created the run).
        parsed = load_conf(trusted_training(training), dataset, overrides=overrides)
    except ValueError as e:  # a dataset or training this site does not have: the run's doing, so a refusal
        reason = f"site {site!r} refuses {action} of job {job_id}: {e}; rule {RULE_CONFIG}"
        ident.audit().append("run.refused", job_id=job_id, flow_run_id=fr_id, action=action, rule=RULE_CONFIG,
                             claimed_principal=_claimed(request), request=request_digest(request), reason=reason)
        raise PermissionError(reason) from None
    cfg = parsed.sites.site(site)
    if cfg.work_pool != ident.work_pool:
        raise IdentityError(f"conf/sites.yaml puts site {site!r} on pool {cfg.work_pool!r} but this worker serves "
                            f"{ident.work_pool!r}: fix sites.yaml or the site's identity file {ident.path}")
    store = store_from_env(cfg, site)
    decision, policy = admit(ident, action, job_id, training, dataset, overrides, request, parsed, store, fr_id)
    exchange = Exchange(store_from_env(parsed.sites.exchange, "exchange"), job_id, writer=site)
    received = {"job_id": job_id, "dataset": dataset, "training": training, "overrides": overrides,
                "request": request}
    dispatched = bind_to_dispatch(ident.audit(), exchange, store, site, action, fr_id,
                                  {**received, **(phase_parameters or {})}, decision.principal)
    conf = resolve(parsed)  # admitted: now every component the configuration names is resolved
    logger.info("site=%s pool=%s flow_run=%s: %s", site, ident.work_pool, fr_id, decision.reason)
    return SiteContext(
        site=site,
        conf=conf,
        store=store,
        exchange=exchange,
        audit=ident.audit().with_fields(principal=decision.principal),
        flow_run_id=fr_id,
        ran_as=ran_as(ident),
        decision=decision,
        policy=policy,
        identity=ident,
        parsed=parsed,
        received=received,
        dispatch=dispatched,
    )


def admit_next_phase(context: SiteContext, action: Action, phase_parameters: dict[str, Any]) -> SiteContext:
    """Admit the job's next phase in this same run (a site's run going on from preparing to training, or from
    training to evaluating), as a run started for that phase would be admitted: the site's own policy decides the
    signed request for ``action`` (audited either way), and the coordinator's dispatch of the phase must name this
    run with these parameters, admitted once (:mod:`insitu.governance.dispatch`). Returns the context under the new
    decision.

    Raises
    ------
    PolicyRefused, DispatchRefused
        Audited in the site's own log first, as :func:`site_context` does.
    """
    p, ident = context.received, context.identity
    decision, policy = admit(ident, action, p["job_id"], p["training"], p["dataset"], p["overrides"], p["request"],
                             context.parsed, context.store, context.flow_run_id)
    dispatched = bind_to_dispatch(ident.audit(), context.exchange, context.store, context.site, action,
                                  context.flow_run_id, {**p, **phase_parameters}, decision.principal)
    get_run_logger().info("site=%s pool=%s flow_run=%s goes on to %s: %s", context.site, ident.work_pool,
                          context.flow_run_id, action, decision.reason)
    return replace(context, audit=ident.audit().with_fields(principal=decision.principal), decision=decision,
                   policy=policy, dispatch=dispatched)



def _claimed(request: Any) -> str | None:
    """The principal a request names (unverified): for the audit line of a run refused before its decision."""
    try:
        return str(request["request"]["principal"])[:64]
    except (TypeError, KeyError):
        return None
