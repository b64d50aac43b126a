"""Signing on the user's machine for ``insitu approve``, ``run`` and ``policy show|check|apply``: job requests,
standing approvals and site policies.

Signing happens here, with the user's own key (``--as NAME`` or ``INSITU_PRINCIPAL_KEY``); the coordinator
never holds a principal's key.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from rich.table import Table

from deployments.cli.common import console, fail
from deployments.platform import Platform, PlatformError
from insitu.governance.policy import PolicyError, SignedPolicy, read_signed_policy
from insitu.governance.principals import PrincipalError, key_id, resolve_key_file
from insitu.governance.request import RequestError, SignedRequest, parse_signed, sign_for


def sign_job(p: Platform, as_: str | None, training: str, dataset: str, purpose: str, *, job_id: str | None,
             overrides: dict[str, int] | None = None, bounds: dict[str, dict[str, int]] | None = None,
             ttl: timedelta = timedelta(hours=12)) -> SignedRequest:
    """Sign a job request (with ``job_id``) or a standing approval (without) as the chosen principal."""
    try:
        name, key_file = resolve_key_file(as_, default_dir=p.principals_dir)
        return sign_for(key_file, name, training, dataset, purpose, job_id=job_id, overrides=overrides,
                        override_bounds=bounds, ttl=ttl, conf_directory=p.conf_dir)
    except (PrincipalError, RequestError) as e:
        raise fail(f"cannot sign: {e}") from None


def approve(p: Platform, as_: str | None, training: str, dataset: str, purpose: str, max_rounds: int,
            days: float) -> Path:
    """Sign and store a standing approval (used by UI and scheduled runs of ``training`` on ``dataset``)."""
    from insitu.governance.approvals import save_approval

    signed = sign_job(p, as_, training, dataset, purpose, job_id=None,
                      bounds={"rounds": {"min": 1, "max": max_rounds}, "local_epochs": {"min": 1, "max": 10},
                              "batch_size": {"min": 16, "max": 4096}},
                      ttl=timedelta(days=days))
    path = save_approval(p.approvals_dir, signed)
    console.print(f"{signed.request.principal} approved training {training!r} on dataset {dataset!r} for "
                  f"{purpose!r} until {signed.request.expires_at:%Y-%m-%d %H:%M} UTC (≤ {max_rounds} rounds): {path}")
    return path


# --------------------------------------------------------------------------- policy
def _policy(p: Platform, site: str) -> SignedPolicy:
    if site not in p.sites.names:
        raise fail(f"unknown site {site!r}; sites: {p.sites.names}", 2)
    try:
        return read_signed_policy(p.policy_file(site))
    except PolicyError as e:
        raise fail(str(e)) from None


def show(p: Platform, site: str) -> None:
    from insitu.governance.policy import verify_policy

    signed = _policy(p, site)
    pol = signed.policy
    try:
        verify_policy(signed, site, p.site_admins(site))
        verdict = "[green](a site admin's valid signature)[/green]"
    except PolicyError as e:
        verdict = f"[red](REFUSED by the site: {e})[/red]"
    console.print(f"site [bold]{site}[/bold] policy v{pol.version}, issued {pol.issued_at:%Y-%m-%d %H:%M} UTC, "
                  f"signed by {signed.signer} {verdict}")
    t = Table("principal", "roles", "key")
    for name, e in sorted(pol.principals.items()):
        t.add_row(name, ", ".join(e.roles), key_id(e.public_key))
    console.print(t)
    console.print("limits: " + ", ".join(f"{k} = {v}" for k, v in pol.limits.model_dump().items()))
    console.print(pol.cedar)


def check(p: Platform, site: str, action: str, request_file: Path | None, as_: str | None, training: str,
          dataset: str, purpose: str, job_id: str, overrides: dict[str, int]) -> bool:
    """What ``site`` would decide for a request (a file, or one signed now as ``--as``), without running it."""
    from insitu.conf import load_training, trusted_training
    from insitu.governance.policy import decide, job_context, verify_policy
    from insitu.governance.request import training_sha256
    from insitu.job import load_job

    signed_policy = _policy(p, site)
    try:
        policy = verify_policy(signed_policy, site, p.site_admins(site))
    except PolicyError as e:
        raise fail(str(e)) from None
    if request_file is not None:
        try:
            req: Any = parse_signed(request_file.read_text()).model_dump(mode="json")
        except RequestError as e:
            raise fail(f"{request_file}: {e}") from None
    else:
        req = sign_job(p, as_, training, dataset, purpose, job_id=job_id, overrides=overrides or None) \
            .model_dump(mode="json")
    training = req["request"]["training"]
    conf = load_job(trusted_training(training, p.conf_dir), req["request"]["dataset"], directory=p.conf_dir,
                     overrides=overrides or req["request"]["overrides"] or None)
    d = decide(policy, req, action=action, dataset=req["request"]["dataset"], job_id=req["request"]["job_id"] or job_id,
               training=training, training_hash=training_sha256(load_training(trusted_training(training, p.conf_dir))),
               overrides=overrides or req["request"]["overrides"], context=job_context(conf.training))
    colour = "green" if d.allowed else "red"
    console.print(f"[{colour}]{'ALLOW' if d.allowed else 'DENY'}[/{colour}] rule {d.rule}: {d.reason}")
    return d.allowed


def apply(p: Platform, site: str, as_: str | None, cedar_file: Path | None, principals_file: Path | None,
          min_rows: int | None, limits: dict[str, int] | None = None) -> None:
    """Sign a new version of ``site``'s policy as a site admin and install it in the site's home.

    ``limits`` changes some of the policy's limits (``max_line_bytes``, …); the others are kept."""
    from insitu.governance.policy import Limits, PrincipalEntry, SitePolicy, sign_policy, verify_policy
    from insitu.governance.principals import load_private_key

    # Carry over only what a site admin signed: a bundle someone put in place around the CLI is not re-signed.
    try:
        current: SitePolicy | None = verify_policy(read_signed_policy(p.policy_file(site)), site, p.site_admins(site))
    except PolicyError as e:
        if cedar_file is None or principals_file is None:
            raise fail(f"the site's current policy is not valid ({e}); nothing of it is carried over: give both "
                       "--cedar and --principals") from None
        current = None
    cedar = cedar_file.read_text() if cedar_file else current.cedar  # type: ignore[union-attr]
    if principals_file is not None:
        raw = json.loads(principals_file.read_text())
        principals = {n: PrincipalEntry.model_validate(e) for n, e in raw.items()}
    else:
        principals = current.principals  # type: ignore[union-attr]
    changed = {**(limits or {}), **({"min_rows_per_aggregate": min_rows} if min_rows else {})}
    try:
        new_limits = Limits.model_validate({**(current.limits if current else Limits()).model_dump(), **changed})
    except ValueError as e:
        raise fail(f"policy not applied: the limits are not valid: {e}") from None
    # Above every version the site accepted: an older (or equal) one would be refused (policy.version-only-grows).
    version = max(current.version if current else 0, _policy_version_on_disk(p, site)) + 1
    try:
        name, key_file = resolve_key_file(as_, default_dir=p.principals_dir)
        new = SitePolicy(site=site, version=version, issued_at=datetime.now(UTC), principals=principals,
                         limits=new_limits, cedar=cedar)
        signed = sign_policy(new, name, load_private_key(key_file))
        verify_policy(signed, site, p.site_admins(site))  # the site would refuse it: refuse here, write nothing
    except (PolicyError, PrincipalError) as e:
        raise fail(f"policy not applied: {e}") from None
    try:
        p.install_policy(site, signed.model_dump_json(indent=2))
    except PlatformError as e:
        raise fail(f"policy not applied: {e}") from None
    console.print(f"site {site}: policy v{new.version} signed by {name} installed at {p.policy_file(site)}")


def _policy_version_on_disk(p: Platform, site: str) -> int:
    """The highest of the installed policy's version and the version the site's record says it accepted."""
    from insitu.governance.policy_version import PolicyVersionError, read_record

    try:
        installed = read_signed_policy(p.policy_file(site)).policy.version
    except PolicyError:
        installed = 0
    try:
        record = read_record(p.policy_record(site))
    except PolicyVersionError:
        record = None
    return max(installed, int(record["version"]) if record else 0)
