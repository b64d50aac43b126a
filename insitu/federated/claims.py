"""What a site claims, checked against what it committed to before training.

A site reports numbers the coordinator cannot recompute: how many rows an update was trained on (FedAvg weighs
each update by it) and its validation and test metrics (they decide the registered round, early stopping and the
gate). What the coordinator holds of a site from before training is its prepare statistics (``stats/prepare.json``:
rows per split, schema-checked, published before round 0 and recorded in the site's audit log). The rules here
bound each claim by that commitment and by the metric's own range; a claim that breaks one is refused, and the
refusal names the site, the rule, the number claimed and the one committed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

N_SAMPLES_RULE = "integrity.n-samples"
METRICS_RULE = "integrity.metrics-range"
SCHEMA_RULE = "protocol.schema"  # a document the exchange protocol's schema refuses
STALE_RULE = "round.stale"  # an update that arrived after its round was aggregated without it

# Metrics that are fractions (a probability, an AUC, a rate, a score in [0, 1]) and metrics that cannot be negative;
# a metric of a task not named here is only checked to be a number (finite, or NaN: an AUC over one class).
FRACTIONS = frozenset({"roc_auc", "pr_auc", "positive_rate", "accuracy", "macro_f1"})
NON_NEGATIVE = frozenset({"loss", "log_loss", "rmse", "mae", "sse", "sae", "label_sumsq", "count"})
AT_MOST_ONE = frozenset({"r2"})


@dataclass(frozen=True)
class ClaimRefusal:
    """One refused claim: who, what, by which rule, what was claimed and what was committed."""

    site: str
    rule: str
    what: str  # "update of round 3", "validation of global model 2", "evaluation of round-0004"
    claimed: float | None  # None: the document could not be read at all
    committed: float | None
    reason: str

    def as_audit(self) -> dict[str, Any]:
        """The fields of the coordinator's audit event (``update.refused`` / ``metrics.refused``)."""
        return {"site": self.site, "rule": self.rule, "what": self.what, "claimed": self.claimed,
                "committed": self.committed, "reason": self.reason}


def committed_rows(prepare: Mapping[str, Any]) -> dict[str, int]:
    """Rows per split (``train``, ``val``, ``test``) a site committed to in its prepare statistics."""
    counts = {k: int(v) for k, v in (prepare.get("split_counts") or {}).items()}
    train_n = (prepare.get("train_stats") or {}).get("n")
    if train_n is not None:  # the statistics the global normalisation was built from: the smaller of the two
        counts["train"] = min(counts.get("train", int(train_n)), int(train_n))
    return counts


def n_samples_refusal(site: str, what: str, claimed: int, committed: Mapping[str, int] | None) -> ClaimRefusal | None:
    """Refuse an update that claims more training rows than the site's train split held before round 0.

    ``committed`` is the site's :func:`committed_rows` (None: the site committed nothing, which refuses too).
    An honest site's count is at most its split's rows (every data-parallel replica trains an equal block; the
    remainder is dropped, see ``insitu.data.loader.load_rank_part``).
    """
    train = None if committed is None else committed.get("train")
    if train is not None and 0 <= claimed <= train:
        return None
    said = "no prepare statistics" if train is None else f"{train:,} train rows in its prepare statistics"
    return ClaimRefusal(site, N_SAMPLES_RULE, what, float(claimed), None if train is None else float(train),
                        f"{what} of {site} claims {claimed:,} training rows; the site committed {said} before "
                        f"round 0 [{N_SAMPLES_RULE}]: an update weighs at most the rows its site prepared "
                        f"(fix: the site re-runs its prepare phase, or publishes its true count)")


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def metrics_refusal(site: str, what: str, metrics: Mapping[str, Any], split: str,
                    committed: Mapping[str, int] | None) -> ClaimRefusal | None:
    """Refuse metrics out of their range: a fraction outside [0, 1], a negative loss or error, an infinite value,
    or a ``count`` of more rows than the site's ``split`` held before round 0 (None: it committed nothing).

    A withheld document (fewer rows than the floor) carries no numbers and is not refused.
    """
    if "withheld" in metrics:
        return None
    rows = None if committed is None else committed.get(split)
    for name, value in metrics.items():
        v = _number(value)
        if v is None:
            continue  # the task's tag, histograms, a confusion matrix: bounded by the schema
        bad = None
        if math.isinf(v):
            bad = "is infinite"
        elif math.isnan(v):
            bad = "is not a number" if name == "count" else None
        elif name in FRACTIONS and not 0.0 <= v <= 1.0:
            bad = "is outside [0, 1]"
        elif name in NON_NEGATIVE and v < 0:
            bad = "is negative"
        elif name in AT_MOST_ONE and v > 1.0:
            bad = "is above 1"
        if bad:
            return ClaimRefusal(site, METRICS_RULE, what, v if math.isfinite(v) else None, None,
                                f"{what} of {site}: {name} {v:g} {bad} [{METRICS_RULE}] (fix: the site publishes "
                                f"the metrics its own split gives)")
    count = _number(metrics.get("count"))
    if count is not None and (rows is None or count > rows):
        said = "no prepare statistics" if rows is None else f"{rows:,} {split} rows"
        return ClaimRefusal(site, METRICS_RULE, what, count, None if rows is None else float(rows),
                            f"{what} of {site} counts {count:,.0f} rows; the site committed {said} before round 0 "
                            f"[{METRICS_RULE}] (fix: the site scores its own {split} split)")
    return None


def screen_metrics(per_site: Mapping[str, Mapping[str, Any]], committed: Mapping[str, Mapping[str, int]],
                   split: str, what: str) -> tuple[dict[str, Mapping[str, Any]], list[ClaimRefusal]]:
    """The sites' metrics that keep to their ranges, and a refusal for each that does not (left out)."""
    kept: dict[str, Mapping[str, Any]] = {}
    refused: list[ClaimRefusal] = []
    for site, metrics in per_site.items():
        r = metrics_refusal(site, what, metrics, split, committed.get(site))
        if r is None:
            kept[site] = metrics
        else:
            refused.append(r)
    return kept, refused
