"""Each actor's root of trust, kept by its admin identity, not by its runtime.

A site's runtime user (``insitu-<site>``) runs its flows, its Dask workers and the user's model code; it must
not be able to change what decides what it may do. So each actor has an admin identity, the OS user
``insitu-<actor>-admin`` (when the platform runs as root), that runs nothing and owns ``admin/<actor>/``:

- ``identity.json``: the actor's name, pool, audit socket and the audit service's pinned public key, and a
  site's admin keys (group-readable by the runtime: 0640, directory 0750, so it can read, not change or swap);
- ``policy.json`` and ``accepted.json``: the installed signed policy and the newest version the site accepted
  (versions only grow: ``insitu.governance.policy_version``);
- ``ca/``: the site's CA, its private key readable by the admin only (0600 in a 0700 directory); the runtime
  gets only the CA certificate and its own leaf certificate and key, in its home.

Root writes these files itself: the directory is the admin's, and the admin runs no code that could plant a
link there. Installing a policy is the admin's act: it is verified (a site admin's signature, this site, a
version above the accepted one), then written, recorded and audited in the site's log, through the site's
audit service (verified by its pinned key); a refusal is audited with its rule. Without root everything is
the caller's (mode 0600/0700): the separation between admin and runtime needs root.
"""

from __future__ import annotations

import json
from typing import NoReturn

from deployments.platform.actors import Actors
from deployments.platform.errors import PlatformError
from deployments.platform.paths import PlatformPaths
from deployments.platform.state import PlatformState
from deployments.platform.users import Account, current_account, make_private_dir, own
from insitu.governance.audit_proof import service_public_hex
from insitu.governance.audit_service import AuditClient
from insitu.governance.identity import Identity, write_identity, write_private
from insitu.governance.policy import PolicyError, SignedPolicy, verify_policy
from insitu.governance.policy_version import (
    RULE_VERSION,
    PolicyVersionError,
    accepted_record,
    bundle_sha256,
    read_record,
    version_refusal,
)

RULE_SIGNED = "policy.signed-by-site-admin"


class AdminTrust:
    """Writes and changes the actors' roots of trust as their admins."""

    def __init__(self, paths: PlatformPaths, actors: Actors, state: PlatformState) -> None:
        self._paths = paths
        self._actors = actors
        self._state = state

    def _shared(self, actor: str) -> Account:
        """Owner the admin, group the runtime's: the runtime may read what is shared with it, never write it."""
        admin = self._actors.admin_account(actor)
        return Account(admin.name, admin.uid, self._actors.account(actor).gid)

    @property
    def _shared_mode(self) -> tuple[int, int]:
        """(directory, file) modes: group-readable only when the admin is not the runtime itself."""
        return (0o750, 0o640) if self._actors.isolate else (0o700, 0o600)

    def prepare(self, ident: Identity) -> None:
        """The actor's admin directory and identity file; a site's CA (created once, kept)."""
        make_private_dir(self._paths.admin_root, current_account(), 0o711)
        owner = self._shared(ident.actor)
        dir_mode, file_mode = self._shared_mode
        d = self._paths.admin_dir(ident.actor)
        if d.is_symlink():
            raise PlatformError(f"{d} is a symbolic link; refusing to use it as {ident.actor}'s admin directory")
        make_private_dir(d, owner, dir_mode)
        write_identity(ident.path, ident, owner.uid, owner.gid, file_mode)

    def identity_fields(self, actor: str) -> dict[str, str | None]:
        """What the identity says about its admin and its audit service's key."""
        return {"admin": self._actors.admin_account(actor).name if self._actors.isolate else None,
                "audit_service_key": service_public_hex(self._state.audit_signing_key(actor))}

    def site_pki(self, site: str) -> dict[str, str]:
        """Create (or reuse) the site's CA in the admin's ``ca/``; return what the runtime needs (PEM texts by file
        name): the CA certificate, its leaf certificate and key. The CA key stays here."""
        from insitu.governance.pki import CA_CERT, LEAF_CERT, LEAF_KEY, create_site_pki

        ca_dir = self._paths.ca_dir(site)
        admin = self._actors.admin_account(site)
        pki = create_site_pki(ca_dir, site)
        for p in [ca_dir, *ca_dir.iterdir()]:
            own(p, admin, 0o700 if p.is_dir() else 0o600 if p.name.endswith("key.pem") else 0o644)
        return {CA_CERT: pki.ca_file.read_text(), LEAF_CERT: pki.cert_file.read_text(),
                LEAF_KEY: pki.key_file.read_text()}

    # ------------------------------------------------------------------ policies
    def _audit(self, site: str) -> AuditClient:
        """The site's own log, through its audit service, verified by the key its identity pins."""
        return AuditClient(self._paths.audit_socket(site), site, self._paths.audit_log(site),
                           service_public_hex(self._state.audit_signing_key(site)))

    def install_policy(self, site: str, text: str, admins: dict[str, str], replace: bool = True) -> bool:
        """Install a signed policy as ``site``'s admin; True if written, False if one is kept (``replace`` off).

        Raises
        ------
        PlatformError
            When the site would refuse it (not a site admin's signature, another site's, or older than the
            version it accepted: rule ``policy.version-only-grows``); the refusal is audited in the site's log.
        """
        path, record_file = self._paths.policy_file(site), self._paths.policy_record(site)
        if path.exists() and not replace:
            if not record_file.exists():  # a platform from before the record: what is in place is what was accepted
                self._accept(site, path.read_text(), audit=False)
            return False
        try:
            signed = SignedPolicy.model_validate_json(text)
            verify_policy(signed, site, admins)
        except (PolicyError, ValueError) as e:
            self._refuse(site, RULE_SIGNED, f"site {site!r} refuses to install the policy: {e}")
        try:
            why = version_refusal(site, signed.policy.version, bundle_sha256(text), read_record(record_file))
        except PolicyVersionError as e:
            why = str(e)
        if why:
            self._refuse(site, RULE_VERSION, why, version=signed.policy.version, signer=signed.signer)
        self._accept(site, text)
        return True

    def _accept(self, site: str, text: str, audit: bool = True) -> None:
        signed = SignedPolicy.model_validate_json(text)
        owner = self._shared(site)
        _, file_mode = self._shared_mode
        sha = bundle_sha256(text)
        write_private(self._paths.policy_file(site), text, owner.uid, owner.gid, file_mode)
        record = accepted_record(site, signed.policy.version, sha, signed.signer)
        write_private(self._paths.policy_record(site), json.dumps(record), owner.uid, owner.gid, file_mode)
        if audit:
            self._audit(site).append("policy.installed", version=signed.policy.version, sha256=sha,
                                     signer=signed.signer, by=self._actors.admin_account(site).name)

    def _refuse(self, site: str, rule: str, why: str, **fields: object) -> NoReturn:
        self._audit(site).append("policy.refused", action="install", rule=rule, reason=why, **fields)
        raise PlatformError(why)

