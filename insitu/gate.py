"""The champion/challenger gate: promote a candidate only when it is better, everywhere enough.

Pure decision logic; the Prefect layer gathers the metrics and moves the aliases.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from insitu.config import GateConfig


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
    candidate_global: Mapping[str, float],
    candidate_sites: Mapping[str, Mapping[str, float]],
    champion_global: Mapping[str, float] | None = None,
    champion_sites: Mapping[str, Mapping[str, float]] | None = None,
) -> GateDecision:
    """Decide whether the candidate becomes champion.

    - No champion yet: pass when the candidate's primary metric meets ``cfg.absolute_floor``.
    - Otherwise: the candidate's sample-weighted primary metric must beat the champion's by at least
      ``cfg.margin``, and on no site may it be worse than the champion by more than ``cfg.max_site_drop``.
    """
    m = cfg.primary_metric
    cand = float(candidate_global.get(m, math.nan))
    if math.isnan(cand):
        return GateDecision(False, f"candidate has no {m} (a site without both classes?)", m, cand, None)
    if champion_global is None:
        ok = cand >= cfg.absolute_floor
        why = (f"first model: {m} {cand:.4f} {'meets' if ok else 'is below'} the absolute floor "
               f"{cfg.absolute_floor:.4f}")
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
        if new < old - cfg.max_site_drop:
            worse.append(f"{site} {new:.4f} < {old:.4f} - {cfg.max_site_drop:.4f}")
    if not math.isnan(champ) and cand < champ + cfg.margin:
        return GateDecision(False, f"{m} {cand:.4f} does not beat the champion's {champ:.4f} by the margin "
                            f"{cfg.margin:.4f}", m, cand, champ, deltas)
    if worse:
        return GateDecision(False, f"{m} got worse than the per-site floor allows on: {'; '.join(worse)}", m, cand,
                            champ, deltas)
    return GateDecision(True, f"{m} {cand:.4f} beats the champion's {champ:.4f} by at least {cfg.margin:.4f} and no "
                        f"site dropped more than {cfg.max_site_drop:.4f}", m, cand, champ, deltas)
