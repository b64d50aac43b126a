"""The state directory on disk before anything starts: who owns what, each actor's home, the audit services' files.

The state directory is root's (others may only pass through); each actor owns its own home, filled *as
that actor* by ``deployments.platform.home`` (root must not write by name into a directory a site owns);
each actor's root of trust (identity, policy, CA) is its admin's (``deployments.platform.admin``);
the audit services' directory is ``insitu-audit``'s, each actor reaching only its own socket.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from typing import Any

from deployments.platform.actors import COORDINATOR, Actors
from deployments.platform.admin import AdminTrust
from deployments.platform.errors import PlatformError
from deployments.platform.paths import OPERATOR_DIRS, REPO, PlatformPaths
from deployments.platform.principals import Principals
from deployments.platform.state import PlatformState
from deployments.platform.users import (
    current_account,
    ensure_code_runnable_by_others,
    ensure_traversable,
    make_private_dir,
)
from insitu.governance.anchor_signing import public_hex, write_service_keys
from insitu.governance.identity import Identity, write_private

log = logging.getLogger(__name__)
LEGACY_POLICY = "policy/policy.json"  # where an older platform kept a site's policy: in the runtime's home


class Layout:
    """Creates the platform's directories with their owners and modes, and each actor's identity and policy."""

    def __init__(self, paths: PlatformPaths, actors: Actors, principals: Principals, state: PlatformState) -> None:
        self._paths = paths
        self._actors = actors
        self._principals = principals
        self._state = state
        self.admin = AdminTrust(paths, actors, state)
        self._legacy_policies: dict[str, str] = {}  # site -> the policy its home held (an older platform's)

    def prepare_dirs(self) -> None:
        """The state directory is root's (others may only pass through); each actor owns its own home."""
        me = current_account()
        make_private_dir(self._paths.root, me, 0o711)
        for sub in OPERATOR_DIRS:
            make_private_dir(self._paths.root / sub, me, 0o700)
        make_private_dir(self._paths.actors_dir, me, 0o711)
        make_private_dir(self._paths.approvals_dir, me, 0o755)  # signed approvals: public, read by the coordinator
        if self._actors.isolate:
            ensure_traversable(self._paths.root)
            ensure_code_runnable_by_others(REPO)
        for actor in self._actors.names:
            self.prepare_home(actor)
        make_private_dir(self._paths.stores_dir, me, 0o711)
        for server in ["exchange", *self._actors.sites.names]:  # each store's objects and keys: its own user's only
            store = make_private_dir(self._paths.store_dir(server), self._actors.store_account(server), 0o700)
            make_private_dir(store / "tmp", self._actors.store_account(server), 0o700)

    def prepare_database(self) -> None:
        """The control plane's PostgreSQL cluster, created once, owned by the database's own account (0700)."""
        from deployments.platform import postgres

        if self._state.database != "postgres":
            return
        account = self._actors.database_account()
        if not account.is_current:
            ensure_traversable(self._paths.root)  # its account must reach its directory, as the actors do theirs
        postgres.init_cluster(self._paths.postgres_dir, account, self._state.database_password("superuser"))

    def prepare_home(self, actor: str) -> None:
        """Create the actor's home (root, in root's ``actors/``), then fill it as the actor (``home``)."""
        acct = self._actors.account(actor)
        home = self._paths.actor_home(actor)
        if home.is_symlink() or (home.exists() and not home.is_dir()):
            raise PlatformError(f"{home} is not a directory; refusing to use it as {actor}'s home")
        home.mkdir(exist_ok=True)
        if self._actors.isolate:
            os.chown(home, acct.uid, acct.gid, follow_symlinks=False)
        home.chmod(0o700)
        legacy = home / LEGACY_POLICY
        if legacy.is_file() and not legacy.is_symlink() and not self._paths.policy_file(actor).exists():
            # Offered to the admin's install below (verified like any policy), then removed by the home helper.
            self._legacy_policies[actor] = legacy.read_text()
        ident = self.identity(actor)
        self.admin.prepare(ident)
        # The runtime gets the CA certificate and its own leaf; the CA key stays with the admin.
        tls = self.admin.site_pki(actor) if actor != COORDINATOR else {}
        self._run_home_helper(actor, ident, {"tls": tls})

    def identity(self, actor: str) -> Identity:
        """The actor's identity file: its role, work pool, audit service and (a site's) policy and admins."""
        site = actor != COORDINATOR
        p = self._paths
        return Identity(actor=actor, role="site" if site else "coordinator",
                        work_pool=self._actors.work_pool(actor), audit_log=p.audit_log(actor),
                        audit_key=None, audit_socket=p.audit_socket(actor), path=p.identity_file(actor),
                        policy=p.policy_file(actor) if site else None,
                        admins=self._principals.site_admins(actor) if site else {},
                        **self.admin.identity_fields(actor))  # type: ignore[arg-type]

    def install_default_policy(self, site: str) -> None:
        """The platform's default policy for ``site`` if it has none yet (or the one an older platform kept)."""
        admins = self._principals.site_admins(site)
        if site in self._legacy_policies:  # the policy a site admin applied before its admin owned it
            try:
                self.admin.install_policy(site, self._legacy_policies.pop(site), admins, replace=False)
            except PlatformError as e:  # refused and audited: the default below takes its place
                log.warning("the policy of %s from an older platform was not kept: %s", site, e)
        self.admin.install_policy(site, self._principals.default_policy(site), admins, replace=False)

    def install_policy(self, site: str, signed_policy: str) -> None:
        """Install a signed policy as the site's admin: refused (and audited) unless the site would accept it
        (a site admin's signature, a version above the accepted one: rule ``policy.version-only-grows``)."""
        self.admin.install_policy(site, signed_policy, self._principals.site_admins(site))

    def _run_home_helper(self, actor: str, ident: Identity, extra: dict[str, Any]) -> None:
        """Run ``deployments.platform.home`` as the actor (in-process when not isolated), ``extra`` in its spec."""
        home = self._paths.actor_home(actor)
        spec = {"home": str(home), **extra}
        if not self._actors.isolate:
            from deployments.platform import home as home_helper

            home_helper.prepare_home(home, spec.get("tls") or {})
            return
        acct = self._actors.account(actor)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "PYTHONPATH": str(REPO)}
        r = subprocess.run([sys.executable, "-m", "deployments.platform.home"], input=json.dumps(spec), text=True,
                           env=env, cwd="/", capture_output=True, timeout=120, user=acct.uid, group=acct.gid,
                           extra_groups=[])
        if r.returncode != 0:
            raise PlatformError(f"could not prepare {actor}'s home {home} as {acct.name}: {r.stderr[-2000:]}")

    def prepare_audit(self) -> None:
        """Each actor's audit directory and service configuration (key, log, socket, the one uid it serves)."""
        for actor in self._actors.names:
            write_audit_config(self._paths, self._actors, self._state, actor)
        self.publish_audit_service_keys()

    def publish_audit_service_keys(self) -> None:
        """Every audit service's public key, in a root-owned file anyone may read: whoever checks anchors (the
        coordinator, ``insitu audit verify``) trusts those signed by these keys only."""
        write_service_keys(self._paths.audit_service_keys, {
            a: public_hex(self._state.audit_signing_key(a)) for a in self._actors.names})


def write_audit_config(paths: PlatformPaths, actors: Actors, state: PlatformState, actor: str) -> None:
    """``actor``'s audit directory and its service's configuration (key, log, socket, the uids it serves), from the
    secrets ``state`` holds: the operator's state file, or a site's own kit (``site_runtime``)."""
    acct = actors.audit_account()
    make_private_dir(paths.audit_dir, acct, 0o711)  # actors may reach their socket, not list or read
    make_private_dir(paths.audit_dir / actor, acct, 0o700)
    spec = {"actor": actor, "log": str(paths.audit_log(actor)),
            "key": state.audit_key(actor).hex(), "socket": str(paths.audit_socket(actor)),
            # the runtime logs; its admin and the operator log policy installations
            "allowed_uids": sorted({actors.account(actor).uid, actors.admin_account(actor).uid, os.geteuid()}),
            "signing_key": state.audit_signing_key(actor)}
    owner = (acct.uid, acct.gid) if os.geteuid() == 0 else ()
    write_private(paths.audit_service_file(actor), json.dumps(spec), *owner)
