"""Fill an actor's home *as that actor* (``python -m insitu.stack_home``, the identity as JSON on stdin).

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

from insitu.governance.identity import Identity, write_identity

SUBDIRS = ("audit", "tmp", "tmp/matplotlib", "prefect", "dask")


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


def main() -> None:
    spec: dict[str, Any] = json.load(sys.stdin)  # {"identity": <identity file text>, "path", "home", "with_tls"}
    ident = Identity.from_json(spec["identity"], Path(spec["path"]))
    prepare_home(Path(spec["home"]), ident, bool(spec["with_tls"]))


if __name__ == "__main__":
    main()
