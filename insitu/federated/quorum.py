"""Whether a phase of a job may go on after some sites failed it: the quorum rule (``federation.min_sites``),
as a pure decision; the ``retrain`` flow audits and raises what it says."""

from __future__ import annotations

from collections.abc import Mapping


def quorum_refusal(phase: str, succeeded: list[str], failed: Mapping[str, str], min_sites: int) -> str | None:
    """Why ``phase`` cannot go on with only the sites that ``succeeded`` (None: the quorum holds).

    ``failed`` maps each failed site to why, and the reason names them all.
    """
    if len(succeeded) >= min_sites:
        return None
    detail = "; ".join(f"{site}: {why}" for site, why in failed.items())
    return (f"{phase}: only {len(succeeded)} site(s) succeeded ({succeeded}) < min_sites={min_sites}. "
            f"Failed: {detail}")
