"""What a finished round says about the job's health: the sites it went on without, and whether it was slow.

Pure decisions (the coordinator's ``tasks/alerts.py`` audits each alert, emits it as the Prefect event
``insitu.alert.<kind>`` and ``conf/alerts.yaml`` sends it to a webhook). The first round is never the yardstick:
it includes the sites' start (their flow runs, imports, the data loaded).
"""

from __future__ import annotations

from statistics import median

from insitu.governance.run_alerts import Alert

SITE_DROPPED = "site-dropped"
SLOW_ROUND = "slow-round"
GATE_REFUSED = "gate-refused"


def dropped(rnd: int, missing: list[str], rejected: dict[str, str], deadline_s: float) -> list[Alert]:
    """One alert per site the round went on without: late (no update by the deadline) or its update rejected."""
    out = [Alert(SITE_DROPPED, s, "train", f"round {rnd} went on without {s}: its update was rejected: {why}")
           for s, why in sorted(rejected.items())]
    out += [Alert(SITE_DROPPED, s, "train", f"round {rnd} went on without {s}: no update from it in the round (its "
                                            f"run ended, or the {deadline_s:.0f}s deadline passed)")
            for s in sorted(set(missing) - set(rejected))]
    return out


def slow(rnd: int, seconds: float, earlier: dict[int, float], factor: float, sites: list[str],
         last: str | None = None) -> Alert | None:
    """An alert when round ``rnd`` took more than ``factor`` × the median of the rounds before it (round 0 left
    out: it includes the start); judged once there is one such round. ``last``: the site whose update came last
    (the one the round waited for), named as the alert's site."""
    baseline = [s for r, s in earlier.items() if r > 0 and r < rnd]
    if not baseline:
        return None
    typical = median(baseline)
    if seconds <= factor * typical:
        return None
    waited = f"; the last update came from {last}" if last else ""
    return Alert(SLOW_ROUND, last or "", "train",
                 f"round {rnd} took {seconds:.1f}s, {seconds / typical:.1f}× the job's median round ({typical:.1f}s; "
                 f"alert above {factor:g}×){waited}; sites in it: {', '.join(sites) or 'none'}")
