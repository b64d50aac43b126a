"""The local platform's demo principals (people who sign requests and policies) and each site's first policy."""

from __future__ import annotations

from datetime import UTC, datetime

from deployments.platform.paths import PlatformPaths
from deployments.platform.users import current_account, make_private_dir
from insitu.conf import SitesConfig


class Principals:
    """A data scientist, an operator, an auditor and one admin per site; their key pairs are the caller's."""

    def __init__(self, paths: PlatformPaths, sites: SitesConfig) -> None:
        self._paths = paths
        self._sites = sites

    def roles(self) -> dict[str, list[str]]:
        """The local platform's principals: a data scientist, an operator, an auditor and one admin per site."""
        roles = {"alice": ["data-scientist"], "operator": ["coordinator-operator"], "auditor": ["auditor"]}
        roles.update({f"{s}-admin": ["site-admin"] for s in self._sites.names})
        return roles

    def keys(self) -> dict[str, str]:
        """Each principal's public key (hex); key pairs are created on first use and kept."""
        from insitu.governance.principals import new_key_pair

        make_private_dir(self._paths.principals_dir, current_account(), 0o700)
        return {name: new_key_pair(self._paths.principals_dir, name) for name in self.roles()}

    def site_admins(self, site: str) -> dict[str, str]:
        """The site's root of trust for its policy: its admins' public keys (in its identity file)."""
        keys = self.keys()
        return {f"{site}-admin": keys[f"{site}-admin"]}

    def default_policy(self, site: str, version: int = 1) -> str:
        """The site's first policy, signed by its admin: alice may train fraud detection (see DEFAULT_CEDAR)."""
        from insitu.governance.policy import DEFAULT_CEDAR, PrincipalEntry, SitePolicy, sign_policy
        from insitu.governance.principals import load_private_key

        keys = self.keys()
        policy = SitePolicy(site=site, version=version, issued_at=datetime.now(UTC),
                            principals={n: PrincipalEntry(public_key=keys[n], roles=r)
                                        for n, r in self.roles().items()
                                        if not r == ["site-admin"] or n == f"{site}-admin"},
                            cedar=DEFAULT_CEDAR)
        admin = f"{site}-admin"
        key = load_private_key(self._paths.principal_key_file(admin))
        return sign_policy(policy, admin, key).model_dump_json(indent=2)
