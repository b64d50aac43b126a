"""Which sites missed a phase's deadline, and why, in the words the job's summary and audit log use."""

from __future__ import annotations

from collections.abc import Mapping


def missed_deadline(finished: Mapping[str, bool], deadline_s: float, phase: str, setting: str) -> dict[str, str]:
    """Each site whose run had not finished when the phase's ``deadline_s`` passed, with the reason.

    A site left out this way is not a failure of the job: the quorum rule (``federation.min_sites``) decides
    whether the job goes on without it.
    """
    return {site: f"missed the {phase} deadline: still running after {deadline_s:.0f}s ({setting}); left out of "
                  "the job and its run cancelled"
            for site, done in finished.items() if not done}
