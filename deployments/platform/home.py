"""Fill an actor's home *as that actor* (``python -m deployments.platform.home``, the identity as JSON on stdin).

The home belongs to the site's OS user, so a site process can plant symbolic links in it. Root must not
write there by name (it would follow a link to ``/etc/shadow`` or another site's home); the platform
therefore only creates the home directory itself (in its own root-owned ``actors/``) and runs this module
as the actor's user to write the identity file, the TLS material and the sub-directories. Whatever a
link points to, this process can only write what the actor could write anyway.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from insitu.governance.identity import Identity, write_identity, write_private

SUBDIRS = ("tmp", "tmp/matplotlib", "prefect", "dask", "policy")


def prepare_home(home: Path, identity: Identity, with_tls: bool) -> None:
    """Sub-directories (0700), the identity file (0600) and, for a site, its Dask CA and certificate."""
    for sub in SUBDIRS:
        d = home / sub
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o700)
    write_identity(identity.path, identity)
    if with_tls:
        from insitu.governance.pki import create_site_pki

        create_site_pki(home / "tls", identity.actor)


def install_policy(path: Path, signed_policy: str, replace: bool) -> bool:
    """Write the site's signed policy (when missing, or always with ``replace``); True if written.

    A restart must not overwrite a policy a site admin applied since, so the platform's default is only
    written into an empty place.
    """
    if path.exists() and not replace:
        return False
    write_private(path, signed_policy)
    return True


def main() -> None:
    # {"identity": <identity file text>, "path", "home", "with_tls", optional "policy": {"text", "replace"}}
    spec: dict[str, Any] = json.load(sys.stdin)
    ident = Identity.from_json(spec["identity"], Path(spec["path"]))
    if not spec.get("policy_only"):
        prepare_home(Path(spec["home"]), ident, bool(spec["with_tls"]))
    if spec.get("policy") and ident.policy is not None:
        install_policy(ident.policy, spec["policy"]["text"], bool(spec["policy"]["replace"]))


if __name__ == "__main__":
    main()
