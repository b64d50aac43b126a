"""A site's policy versions only grow: the highest version it accepted is kept, and an older one is refused.

Every policy bundle is signed by a site admin, so an old one stays validly signed forever. Without this
record, whoever can put a file in place could bring back v1 (which admitted what v2 denies). So when the
site's admin installs a policy, the site records what it accepted (version and the bundle's SHA-256) in a
file its admin owns, next to the policy (``accepted.json``); the installation refuses a bundle whose
version is lower than the record's, or equal with other contents, and the site refuses, when it loads its
policy for a request, a policy on disk that is older than the record. Both refusals carry the rule
``policy.version-only-grows`` and are audited by the caller (the acceptance itself is audited too, in
the site's signed and anchored log).

Pure functions and the record's format; who may write the record is the platform's business (its admin).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

RULE_VERSION = "policy.version-only-grows"


class PolicyVersionError(PermissionError):
    """A policy older than (or conflicting with) the one the site already accepted."""


def bundle_sha256(bundle_text: str | bytes) -> str:
    """The SHA-256 of a signed policy bundle's bytes on disk (what the record pins)."""
    data = bundle_text.encode() if isinstance(bundle_text, str) else bundle_text
    return hashlib.sha256(data).hexdigest()


def accepted_record(site: str, version: int, sha256: str, signer: str) -> dict[str, Any]:
    """What the site keeps about the newest policy it accepted."""
    return {"site": site, "version": int(version), "sha256": sha256, "signer": signer}


def read_record(path: Path) -> dict[str, Any] | None:
    """The site's record of its newest accepted policy, or None when it has accepted none yet.

    Raises
    ------
    PolicyVersionError
        When the record exists but is not a valid record (fail closed: no policy is then accepted).
    """
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise PolicyVersionError(f"the record of accepted policy versions {path} is unreadable ({e}); rule "
                                 f"{RULE_VERSION}. Fix: the site admin reinstalls the newest policy") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("version"), int) or not isinstance(raw.get("sha256"), str):
        raise PolicyVersionError(f"the record of accepted policy versions {path} is malformed; rule {RULE_VERSION}")
    return raw


def version_refusal(site: str, version: int, sha256: str, record: dict[str, Any] | None) -> str:
    """Why ``site`` refuses a policy of ``version`` (bundle hash ``sha256``) given its ``record``; "" to accept.

    A higher version is accepted; the same version only with the same bytes (a restart re-installs it);
    a lower one never.
    """
    if record is None:
        return ""
    newest = int(record["version"])
    if version < newest:
        return (f"site {site!r} refuses policy v{version}: it already accepted v{newest}, and policy versions only "
                f"grow (an older signed policy cannot be put back). Fix: sign a new version above v{newest} "
                f"(`insitu policy apply`); rule {RULE_VERSION}")
    if version == newest and sha256 != record["sha256"]:
        return (f"site {site!r} refuses policy v{version}: it already accepted another policy with that version "
                f"(sha256 {str(record['sha256'])[:12]}…). Fix: sign it as v{newest + 1}; rule {RULE_VERSION}")
    return ""


def record_path(policy_path: Path) -> Path:
    """Where the record lives: beside the policy, in the admin's directory."""
    return policy_path.with_name("accepted.json")


def installed_refusal(policy_path: Path, site: str, version: int) -> str:
    """Why the policy file at ``policy_path`` (whose verified version is ``version``) is older than what the site
    accepted; "" when it is not (what a site checks each time it loads its policy for a request)."""
    try:
        record = read_record(record_path(policy_path))
    except PolicyVersionError as e:
        return str(e)
    return version_refusal(site, version, bundle_sha256(policy_path.read_bytes()), record)
