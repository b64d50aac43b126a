"""The champion/challenger gate: promote a candidate only when it is better, everywhere enough.

Pure decision logic; the Prefect layer gathers the metrics and moves the aliases.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from insitu.conf import GateConfig
from insitu.specs.base import GateMetric


@dataclass
class GateDecision:
    passed: bool
    reason: str
    primary_metric: str
    candidate: float
    champion: float | None
    site_deltas: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "reason": self.reason, "primary_metric": self.primary_metric,
                "candidate": self.candidate, "champion": self.champion, "site_deltas": self.site_deltas}


def decide(
    cfg: GateConfig,
    metric: GateMetric,
    candidate_global: Mapping[str, float],
    candidate_sites: Mapping[str, Mapping[str, float]],
    champion_global: Mapping[str, float] | None = None,
    champion_sites: Mapping[str, Mapping[str, float]] | None = None,
) -> GateDecision:
    """Decide whether the candidate becomes champion, on the task's gate ``metric`` (its direction decides
    what "better" means: higher PR-AUC, lower RMSE).

    - No champion yet: pass when the candidate's metric meets ``cfg.absolute_floor`` (a floor for a
      higher-is-better metric, a ceiling otherwise; empty: the metric's default bound, if any).
    - Otherwise: the candidate's global metric must be better than the champion's by at least
      ``cfg.margin``, and on no site may it be worse than the champion by more than ``cfg.max_site_drop``.
    """
    m = metric.name
    cand = float(candidate_global.get(m, math.nan))
    if math.isnan(cand):
        return GateDecision(False, f"candidate has no {m} (a site without both classes?)", m, cand, None)
    if champion_global is None:
        bound = cfg.absolute_floor if cfg.absolute_floor is not None else metric.default_bound
        ok = metric.meets(cand, bound)
        if bound is None:
            why = f"first model: {m} {cand:.4f}, no absolute bound configured"
        else:
            kind = "floor" if metric.higher_is_better else "ceiling"
            why = f"first model: {m} {cand:.4f} {'meets' if ok else 'misses'} the absolute {kind} {bound:.4f}"
        return GateDecision(ok, why, m, cand, None)
    champ = float(champion_global.get(m, math.nan))
    deltas: dict[str, float] = {}
    worse: list[str] = []
    for site, metrics in candidate_sites.items():
        old = (champion_sites or {}).get(site, {}).get(m, math.nan)
        new = metrics.get(m, math.nan)
        if math.isnan(old) or math.isnan(new):
            continue
        deltas[site] = new - old
        if metric.improvement(new, old) < -cfg.max_site_drop:
            worse.append(f"{site} {new:.4f} vs {old:.4f}")
    if not math.isnan(champ) and metric.improvement(cand, champ) < cfg.margin:
        return GateDecision(False, f"{m} {cand:.4f} does not beat the champion's {champ:.4f} by the margin "
                            f"{cfg.margin:.4f} ({'higher' if metric.higher_is_better else 'lower'} is better)",
                            m, cand, champ, deltas)
    if worse:
        return GateDecision(False, f"{m} got worse than the per-site tolerance {cfg.max_site_drop:.4f} allows on: "
                            f"{'; '.join(worse)}", m, cand, champ, deltas)
    return GateDecision(True, f"{m} {cand:.4f} beats the champion's {champ:.4f} by at least {cfg.margin:.4f} and no "
                        f"site got worse by more than {cfg.max_site_drop:.4f}", m, cand, champ, deltas)


# ---- the registry's side of the decision: what a candidate is compared with, and what stands already
def judged(tags: Mapping[str, str]) -> tuple[bool, str] | None:
    """A version's recorded gate decision (passed, reason), or None when it was not judged yet.

    The ``gate`` tag is written last, after the alias move it implies: a re-run of a job whose version carries
    it keeps that decision instead of judging again against a champion that may be itself by now.
    """
    if "gate" not in tags:
        return None
    return tags["gate"] == "passed", tags.get("gate_reason", "")


def comparison_basis(evaluated: str | None, current: str | None) -> str:
    """What the candidate is judged against, once the registry lock is held.

    ``evaluated`` is the champion version the sites scored beside the candidate, ``current`` the champion now.
    ``"none"``: there is no champion (a first model); ``"evaluated"``: the sites' scores of the champion stand;
    ``"recorded"``: another job promoted a version since, which the sites never scored beside this candidate,
    so its metrics recorded at its registration are used.
    """
    if current is None:
        return "none"
    return "evaluated" if current == evaluated else "recorded"


def recorded_metrics(tags: Mapping[str, str], metric: str) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """A version's global and per-site test ``metric`` from its tags (written at registration)."""
    glob = {metric: float(tags.get(f"global_test_{metric}", "nan"))}
    sites = {}
    for k, v in tags.items():
        if k.startswith("site_") and k.endswith(f"_test_{metric}"):
            sites[k[len("site_"): -len(f"_test_{metric}")]] = {metric: float(v)}
    return glob, sites
