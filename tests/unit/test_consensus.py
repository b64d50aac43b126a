"""Combining the sites' metrics where they decide something: pooled, median, trimmed mean; disagreeing sites."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from protocol_examples import model_metrics

from insitu.conf import ValidationConfig
from insitu.federated.claims import METRICS_RULE
from insitu.federated.consensus import across_sites, combination, disagreeing, judge, trimmed_mean
from insitu.federated.validation import Selection
from insitu.metrics import weighted_global
from insitu.specs.base import GateMetric


class Pooled:
    def global_metrics(self, per_site: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
        return weighted_global(per_site)


HONEST = {"eu": {**model_metrics(100.0), "pr_auc": 0.20}, "us": {**model_metrics(100.0), "pr_auc": 0.30},
          "apac": {**model_metrics(100.0), "pr_auc": 0.25}}
COMMITTED = {s: {"train": 700, "val": 150, "test": 150} for s in ("eu", "us", "apac", "liar")}


def test_auto_is_median_from_three_sites_and_pooled_below() -> None:
    assert combination(ValidationConfig(), 3) == "median" and combination(ValidationConfig(), 2) == "pooled"
    assert combination(ValidationConfig(combine="pooled"), 5) == "pooled"
    assert combination(ValidationConfig(combine="trimmed_mean"), 2) == "trimmed_mean"


def test_median_and_trimmed_mean_across_sites() -> None:
    assert trimmed_mean([1.0, 2.0, 3.0, 100.0], 0.25) == 2.5 and trimmed_mean([1.0, 2.0, 9.0], 0.34) == 2.0
    assert trimmed_mean([1.0, 2.0, 9.0], 0.2) == 4.0  # floor(0.2 * 3) = 0: nothing dropped
    out = across_sites({**HONEST, "liar": {**model_metrics(150.0), "pr_auc": 1.0}}, "median")
    assert out["pr_auc"] == 0.275 and out["count"] == 450.0
    assert math.isnan(across_sites({"eu": {**model_metrics(), "roc_auc": math.nan}}, "median")["roc_auc"])


def test_a_liar_in_range_moves_pooled_far_and_median_little() -> None:
    lying = {**HONEST, "liar": {**model_metrics(150.0), "pr_auc": 1.0}}
    pooled = judge(Pooled(), lying, COMMITTED, "val", "v", "pr_auc", ValidationConfig(combine="pooled"))
    robust = judge(Pooled(), lying, COMMITTED, "val", "v", "pr_auc", ValidationConfig())
    assert pooled.metrics["pr_auc"] > 0.45 and robust.how == "median" and robust.metrics["pr_auc"] == 0.275
    assert set(robust.disagreeing) == {"liar"} and robust.disagreeing["liar"] > 0.7


def test_an_out_of_range_document_is_refused_before_it_is_combined() -> None:
    lying = {**HONEST, "liar": {**model_metrics(1e12), "pr_auc": 1.0}}
    j = judge(Pooled(), lying, COMMITTED, "val", "the validation of global model 0", "pr_auc",
              ValidationConfig(combine="pooled"))
    assert j.sites == ["eu", "us", "apac"] and abs(j.metrics["pr_auc"] - 0.25) < 1e-12
    (r,) = j.refused
    assert r.site == "liar" and r.rule == METRICS_RULE and r.claimed == 1e12 and r.committed == 150


def test_two_sites_cannot_tell_who_disagrees() -> None:
    assert disagreeing({"eu": 0.1, "us": 0.9}, 0.2) == {}
    assert disagreeing({"eu": 0.1, "us": 0.12, "apac": 0.11, "liar": math.nan}, 0.2) == {}


def test_a_selection_names_its_suspects_once_each() -> None:
    sel = Selection(GateMetric("pr_auc", True), ValidationConfig())
    sel.suspect("liar", "a")
    sel.suspect("liar", "a")
    sel.suspect("liar", "b")
    assert sel.suspects == {"liar": ["a", "b"]}
