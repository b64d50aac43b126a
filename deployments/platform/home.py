"""Fill an actor's home *as that actor* (``python -m deployments.platform.home``, a JSON spec on stdin).

The home belongs to the site's OS user (its runtime), so a site process can plant symbolic links in it. Root
must not write there by name (it would follow a link to ``/etc/shadow`` or another site's home); the platform
therefore only creates the home directory itself (in its own root-owned ``actors/``) and runs this module
as the actor's user to write the sub-directories and the TLS material its admin issued (the CA certificate,
the site's leaf certificate and key; never the CA key). Whatever a link points to, this process can only
write what the actor could write anyway.

The actor's identity file and policy are not here: they are its admin's (``deployments.platform.admin``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from insitu.governance.identity import write_private

SUBDIRS = ("tmp", "tmp/matplotlib", "prefect", "dask", "tls")
TLS_MODES = {"ca.pem": 0o644, "site.pem": 0o644, "site-key.pem": 0o600}
# What homes of an older platform held that now belongs to the admin: removed so that nothing reads it.
LEFTOVERS = ("identity.json", "tls/ca-key.pem", "policy/policy.json")


def prepare_home(home: Path, tls: dict[str, str]) -> None:
    """Sub-directories (0700) and, for a site, the TLS files its admin issued (keys 0600)."""
    for sub in SUBDIRS:
        d = home / sub
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o700)
    for name, text in tls.items():
        if name not in TLS_MODES:
            raise ValueError(f"unexpected TLS file {name!r}")
        write_private(home / "tls" / name, text, mode=TLS_MODES[name])
    for old in LEFTOVERS:
        p = home / old
        if p.is_file() and not p.is_symlink():
            os.unlink(p)


def main() -> None:
    # {"home": <path>, "tls": {file name: PEM text}}
    spec: dict[str, Any] = json.load(sys.stdin)
    prepare_home(Path(spec["home"]), spec.get("tls") or {})


if __name__ == "__main__":
    main()
