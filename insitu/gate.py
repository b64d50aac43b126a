"""The champion/challenger gate: promote a candidate only when it is better, everywhere enough.

Pure decision logic; the Prefect layer (``tasks/promotion.py``) gathers the metrics, holds the lock and moves
the aliases.
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


# ---- the model registry's side of the decision: what a candidate is compared with, and what stands already
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


def metric_tags(global_metrics: Mapping[str, float], site_metrics: Mapping[str, Mapping[str, float]],
                gate_metrics: list[str]) -> dict[str, str]:
    """The test metrics a version carries as tags from its registration on (read back by
    :func:`recorded_metrics`): every global one, and each site's gate metrics. NaN is left out."""
    tags = {f"global_test_{k}": f"{v:.6f}" for k, v in global_metrics.items() if not math.isnan(v)}
    for site, metrics in site_metrics.items():
        for k in gate_metrics:
            if k in metrics and not math.isnan(metrics[k]):
                tags[f"site_{site}_test_{k}"] = f"{metrics[k]:.6f}"
    return tags


def recorded_metrics(tags: Mapping[str, str], metric: str) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """A version's global and per-site test ``metric`` from its tags (written at registration)."""
    glob = {metric: float(tags.get(f"global_test_{metric}", "nan"))}
    sites = {}
    for k, v in tags.items():
        if k.startswith("site_") and k.endswith(f"_test_{metric}"):
            sites[k[len("site_"): -len(f"_test_{metric}")]] = {metric: float(v)}
    return glob, sites


@dataclass(frozen=True)
class Promotion:
    """The gate's outcome for one registered version, and where the ``champion`` alias points afterwards.

    ``basis`` is what the candidate was judged against (:func:`comparison_basis`), or ``"judged"``: the version
    carried a decision already (a re-run of its job), which stands, and nothing is to be written again.
    """

    version: str
    passed: bool
    reason: str
    primary_metric: str
    candidate: float | dict[str, float]  # a version judged before reports the candidate's global metrics
    site_deltas: dict[str, float]
    previous_champion: str | None  # the champion the gate found (None when the version was judged before)
    champion: str | None  # the champion after the gate
    basis: str

    @property
    def alias(self) -> str:
        """The alias the version ends with: ``champion`` if it passed, else it stays ``challenger``."""
        return "champion" if self.passed else "challenger"

    def as_record(self) -> dict[str, Any]:
        """The job summary's gate record (``insitu.federated.schemas.GateRecord``)."""
        return {"passed": self.passed, "reason": self.reason, "primary_metric": self.primary_metric,
                "candidate": self.candidate, "site_deltas": self.site_deltas, "version": self.version,
                "previous_champion": self.previous_champion, "champion": self.champion}


def promotion(
    cfg: GateConfig,
    metric: GateMetric,
    version: str,
    version_tags: Mapping[str, str],
    candidate_global: Mapping[str, float],
    candidate_sites: Mapping[str, Mapping[str, float]],
    scored_champion: str | None,
    champion_global: Mapping[str, float] | None,
    champion_sites: Mapping[str, Mapping[str, float]] | None,
    current_champion: str | None,
    current_tags: Mapping[str, str],
) -> Promotion:
    """Judge ``version`` under the model registry's lock, from what the registry holds now.

    ``scored_champion`` is the champion version the sites scored beside the candidate (``champion_global`` and
    ``champion_sites`` are their scores); ``current_champion`` and ``current_tags`` are the champion alias's version
    and tags read inside the lock. A version already judged keeps its decision; if another job promoted a
    different version since the sites scored, the candidate is compared with that version's recorded metrics.
    """
    before = judged(version_tags)
    if before is not None:
        passed, reason = before
        return Promotion(version, passed, reason, metric.name, dict(candidate_global), {}, None, current_champion,
                         "judged")
    basis = comparison_basis(scored_champion, current_champion)
    if basis == "recorded":
        champion_global, champion_sites = recorded_metrics(current_tags, metric.name)
    elif basis == "none":
        champion_global, champion_sites = None, None
    d = decide(cfg, metric, candidate_global, candidate_sites, champion_global, champion_sites)
    return Promotion(version, d.passed, d.reason, d.primary_metric, d.candidate, d.site_deltas, current_champion,
                     version if d.passed else current_champion, basis)
