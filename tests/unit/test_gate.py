"""Champion/challenger gate decisions on hand-computed cases."""

from __future__ import annotations

import math

from insitu.config import GateConfig
from insitu.gate import decide

CFG = GateConfig(primary_metric="pr_auc", margin=0.01, max_site_drop=0.05, absolute_floor=0.2)


def test_first_model_needs_the_absolute_floor() -> None:
    assert decide(CFG, {"pr_auc": 0.25}, {}).passed
    d = decide(CFG, {"pr_auc": 0.15}, {})
    assert not d.passed and "below the absolute floor 0.2000" in d.reason


def test_must_beat_champion_by_margin() -> None:
    sites = {"eu": {"pr_auc": 0.5}}
    assert decide(CFG, {"pr_auc": 0.52}, sites, {"pr_auc": 0.50}, {"eu": {"pr_auc": 0.5}}).passed
    d = decide(CFG, {"pr_auc": 0.505}, sites, {"pr_auc": 0.50}, {"eu": {"pr_auc": 0.5}})
    assert not d.passed and "does not beat the champion's 0.5000 by the margin 0.0100" in d.reason


def test_no_site_may_drop_more_than_the_floor() -> None:
    cand = {"eu": {"pr_auc": 0.70}, "us": {"pr_auc": 0.40}}
    champ = {"eu": {"pr_auc": 0.50}, "us": {"pr_auc": 0.46}}
    d = decide(CFG, {"pr_auc": 0.60}, cand, {"pr_auc": 0.48}, champ)
    assert not d.passed and "us 0.4000 < 0.4600 - 0.0500" in d.reason
    assert math.isclose(d.site_deltas["eu"], 0.2) and math.isclose(d.site_deltas["us"], -0.06)
    cand["us"]["pr_auc"] = 0.42  # a drop of 0.04 is allowed
    assert decide(CFG, {"pr_auc": 0.60}, cand, {"pr_auc": 0.48}, champ).passed


def test_nan_candidate_fails_and_nan_sites_are_skipped() -> None:
    assert not decide(CFG, {"pr_auc": float("nan")}, {}).passed
    d = decide(CFG, {"pr_auc": 0.6}, {"eu": {"pr_auc": float("nan")}}, {"pr_auc": 0.5}, {"eu": {"pr_auc": 0.9}})
    assert d.passed and d.site_deltas == {}


def test_roc_auc_as_primary_metric() -> None:
    cfg = CFG.model_copy(update={"primary_metric": "roc_auc"})
    assert not decide(cfg, {"roc_auc": 0.9, "pr_auc": 0.9}, {}, {"roc_auc": 0.95, "pr_auc": 0.1}, {}).passed
