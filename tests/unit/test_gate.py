"""Champion/challenger gate decisions on hand-computed cases."""

from __future__ import annotations

import math

from insitu.conf import GateConfig
from insitu.gate import Promotion, metric_tags, promotion, recorded_metrics
from insitu.gate import decide as decide_on
from insitu.specs.base import GateMetric

CFG = GateConfig(primary_metric="pr_auc", margin=0.01, max_site_drop=0.05, absolute_floor=0.2)
PR_AUC = GateMetric("pr_auc", True, 0.05)


def decide(cfg: GateConfig, *args: object) -> object:
    metric = GateMetric(cfg.primary_metric or "pr_auc", True, 0.05)
    return decide_on(cfg, metric, *args)  # type: ignore[arg-type]


def test_first_model_needs_the_absolute_floor() -> None:
    assert decide(CFG, {"pr_auc": 0.25}, {}).passed
    d = decide(CFG, {"pr_auc": 0.15}, {})
    assert not d.passed and "misses the absolute floor 0.2000" in d.reason


def test_must_beat_champion_by_margin() -> None:
    sites = {"eu": {"pr_auc": 0.5}}
    assert decide(CFG, {"pr_auc": 0.52}, sites, {"pr_auc": 0.50}, {"eu": {"pr_auc": 0.5}}).passed
    d = decide(CFG, {"pr_auc": 0.505}, sites, {"pr_auc": 0.50}, {"eu": {"pr_auc": 0.5}})
    assert not d.passed and "does not beat the champion's 0.5000 by the margin 0.0100" in d.reason


def test_no_site_may_drop_more_than_the_floor() -> None:
    cand = {"eu": {"pr_auc": 0.70}, "us": {"pr_auc": 0.40}}
    champ = {"eu": {"pr_auc": 0.50}, "us": {"pr_auc": 0.46}}
    d = decide(CFG, {"pr_auc": 0.60}, cand, {"pr_auc": 0.48}, champ)
    assert not d.passed and "us 0.4000 vs 0.4600" in d.reason
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


RMSE = GateMetric("rmse", False, None)


def test_lower_is_better_metrics_gate_the_other_way() -> None:
    cfg = GateConfig(primary_metric="rmse", margin=0.1, max_site_drop=0.5)
    assert decide_on(cfg, RMSE, {"rmse": 2.0}, {}).passed  # no ceiling configured: any finite first model
    capped = GateConfig(primary_metric="rmse", absolute_floor=1.5)
    d = decide_on(capped, RMSE, {"rmse": 2.0}, {})
    assert not d.passed and "misses the absolute ceiling 1.5000" in d.reason
    sites = {"eu": {"rmse": 1.0}}
    assert decide_on(cfg, RMSE, {"rmse": 1.0}, sites, {"rmse": 1.2}, {"eu": {"rmse": 1.1}}).passed
    d = decide_on(cfg, RMSE, {"rmse": 1.15}, sites, {"rmse": 1.2}, {"eu": {"rmse": 1.1}})
    assert not d.passed and "lower is better" in d.reason  # better by 0.05 < margin 0.1
    d = decide_on(cfg, RMSE, {"rmse": 0.9}, {"eu": {"rmse": 1.7}}, {"rmse": 1.2}, {"eu": {"rmse": 1.1}})
    assert not d.passed and "eu 1.7000 vs 1.1000" in d.reason  # eu got worse by 0.6 > 0.5


def test_what_a_candidate_is_compared_with_under_the_registry_lock() -> None:
    from insitu.gate import comparison_basis, judged, recorded_metrics

    assert comparison_basis(None, None) == "none"  # the first model
    assert comparison_basis("3", None) == "none"  # the champion alias was removed since
    assert comparison_basis("3", "3") == "evaluated"
    assert comparison_basis("3", "4") == "recorded"  # another job promoted v4 meanwhile
    assert comparison_basis(None, "4") == "recorded"
    tags = {"global_test_pr_auc": "0.41", "site_eu_test_pr_auc": "0.5", "site_us-2_test_pr_auc": "0.3",
            "site_eu_test_roc_auc": "0.9", "gate": "failed", "gate_reason": "worse"}
    assert recorded_metrics(tags, "pr_auc") == ({"pr_auc": 0.41}, {"eu": {"pr_auc": 0.5}, "us-2": {"pr_auc": 0.3}})
    assert judged(tags) == (False, "worse") and judged({"gate": "passed"}) == (True, "") and judged({}) is None


def test_the_metric_tags_a_version_is_registered_with_read_back() -> None:
    tags = metric_tags({"pr_auc": 0.4123456789, "roc_auc": float("nan"), "count": 100.0},
                       {"eu": {"pr_auc": 0.5, "roc_auc": 0.9}, "us-2": {"pr_auc": float("nan")}, "fr": {}},
                       ["pr_auc", "roc_auc"])
    assert tags == {"global_test_pr_auc": "0.412346", "global_test_count": "100.000000",
                    "site_eu_test_pr_auc": "0.500000", "site_eu_test_roc_auc": "0.900000"}  # NaN left out
    assert recorded_metrics(tags, "pr_auc") == ({"pr_auc": 0.412346}, {"eu": {"pr_auc": 0.5}})


def _promote(version_tags: dict[str, str], scored: str | None, current: str | None, current_tags: dict[str, str],
             candidate: float = 0.6) -> Promotion:
    return promotion(CFG, PR_AUC, "5", version_tags, {"pr_auc": candidate}, {"eu": {"pr_auc": candidate}},
                     scored, {"pr_auc": 0.5}, {"eu": {"pr_auc": 0.5}}, current, current_tags)


def test_promotion_of_a_first_model_and_against_the_scored_champion() -> None:
    first = _promote({}, None, None, {}, candidate=0.25)
    assert (first.passed, first.basis, first.previous_champion, first.champion, first.alias) == (
        True, "none", None, "5", "champion")
    first = _promote({}, "3", None, {}, candidate=0.1)  # the alias was removed since: the floor decides
    assert (first.passed, first.basis, first.champion, first.alias) == (False, "none", None, "challenger")
    beat = _promote({}, "3", "3", {"global_test_pr_auc": "0.9"})  # the sites' scores of v3 stand, not its tags
    assert (beat.passed, beat.basis, beat.previous_champion, beat.champion) == (True, "evaluated", "3", "5")
    assert beat.candidate == 0.6 and math.isclose(beat.site_deltas["eu"], 0.1)
    lost = _promote({}, "3", "3", {}, candidate=0.505)
    assert (lost.passed, lost.champion, lost.alias) == (False, "3", "challenger")


def test_promotion_against_a_champion_promoted_meanwhile_uses_its_recorded_metrics() -> None:
    moved = _promote({}, "3", "4", {"global_test_pr_auc": "0.7", "site_eu_test_pr_auc": "0.7"})
    assert (moved.passed, moved.basis, moved.previous_champion, moved.champion) == (False, "recorded", "4", "4")
    assert "does not beat the champion's 0.7000" in moved.reason
    assert _promote({}, "3", "4", {"global_test_pr_auc": "0.55", "site_eu_test_pr_auc": "0.55"}).passed


def test_a_version_judged_before_keeps_its_decision() -> None:
    again = _promote({"gate": "failed", "gate_reason": "worse"}, "3", "5", {}, candidate=0.99)
    assert (again.passed, again.reason, again.basis, again.previous_champion, again.champion) == (
        False, "worse", "judged", None, "5")
    assert again.as_record() == {"passed": False, "reason": "worse", "primary_metric": "pr_auc",
                                 "candidate": {"pr_auc": 0.99}, "site_deltas": {}, "version": "5",
                                 "previous_champion": None, "champion": "5"}
