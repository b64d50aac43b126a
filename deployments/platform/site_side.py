"""What the operator does *inside* a site: on an isolated platform (``platform.netns``) a site's store exists on that
site's network only, so seeding it, putting a file into it or checking it runs as a process started in the site's
namespace, with the operator's environment (the local stand-in for the site's admin working on the site's host).
On one network the same commands run where they are.

    python -m deployments.platform.site_side check-store --state .insitu --conf conf --site eu
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deployments.platform.consistency import StoreCheck, check_exchange, check_platform, check_site_store
from deployments.platform.paths import REPO

if TYPE_CHECKING:
    from deployments.platform.supervisor import Platform


def run_in_site(p: Platform, site: str, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in ``site``'s namespace (where the platform is isolated) with the operator's environment."""
    with p.within(site):
        return subprocess.run(argv, env=p.operator_env(), cwd=str(REPO), text=True, check=False, **kw)


def open_store(p: Platform, server: str) -> Any:
    from insitu.storage import store_from_env

    ref = p.sites.exchange if server == "exchange" else p.sites.site(server)
    return store_from_env(ref, server, p.operator_env())


def check_stores(p: Platform) -> list[StoreCheck]:
    """One line per store: is what the audit logs refer to still there (``platform.consistency``); an isolated
    site's store is checked from inside the site."""
    from deployments.platform.actors import COORDINATOR
    from insitu.governance.anchor_signing import read_last
    from insitu.governance.audit_service import anchor_signing_record
    from insitu.governance.audit_verify import read_events

    if p.network is None:
        return check_platform(p.sites.names, p.audit_log, lambda s: open_store(p, s), COORDINATOR)
    out = [_check_inside(p, site) for site in p.sites.names]
    last = {a: read_last(anchor_signing_record(p.audit_log(a))) for a in [COORDINATOR, *p.sites.names]}
    try:
        out.append(check_exchange(open_store(p, "exchange"), read_events(p.audit_log(COORDINATOR)), last))
    except Exception as e:  # a check that cannot run says so on its own line; it never stops `up`
        out.append(StoreCheck("exchange", False, f"could not be checked: {type(e).__name__}: {e}"))
    return out


def _check_inside(p: Platform, site: str) -> StoreCheck:
    r = run_in_site(p, site, [sys.executable, "-m", __name__, "check-store", "--state", str(p.dir),
                              "--conf", str(p.conf_dir), "--site", site], capture_output=True, timeout=120)
    try:
        return StoreCheck(**json.loads(r.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError, TypeError):
        return StoreCheck(f"store {site}", False, f"could not be checked inside the site: {r.stderr[-500:]}")


def main(argv: list[str] | None = None) -> None:
    from deployments.platform.supervisor import Platform
    from insitu.governance.audit_verify import read_events

    ap = argparse.ArgumentParser(prog=f"python -m {__name__}")
    ap.add_argument("command", choices=["check-store"])
    ap.add_argument("--state", type=Path, required=True)
    ap.add_argument("--conf", type=Path, required=True)
    ap.add_argument("--site", required=True)
    args = ap.parse_args(argv)
    p = Platform(args.state, args.conf)
    try:
        check = check_site_store(args.site, open_store(p, args.site), read_events(p.audit_log(args.site)))
    except Exception as e:
        check = StoreCheck(f"store {args.site}", False, f"could not be checked: {type(e).__name__}: {e}")
    sys.stdout.write(json.dumps(asdict(check)) + "\n")


if __name__ == "__main__":
    main()
