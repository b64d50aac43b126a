"""What a finished round says: the sites it went on without, and whether it was slow (pure decisions)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from insitu.conf import AlertsConfig
from insitu.federated.round_alerts import SITE_DROPPED, SLOW_ROUND, dropped, slow


def test_each_site_a_round_went_on_without_is_named_with_why() -> None:
    alerts = dropped(3, ["eu", "us"], {"us": "claims more rows than it committed"}, 120)
    assert [(a.kind, a.site) for a in alerts] == [(SITE_DROPPED, "us"), (SITE_DROPPED, "eu")]
    assert "round 3 went on without us: its update was rejected: claims more rows" in alerts[0].detail
    assert "no update from it in the round (its run ended, or the 120s deadline passed)" in alerts[1].detail
    assert dropped(3, [], {}, 120) == []


def test_a_round_is_slow_against_the_median_of_the_rounds_before_it_not_the_first() -> None:
    assert slow(1, 100.0, {0: 5.0}, 3.0, ["eu"]) is None  # round 0 (the start) is no yardstick
    assert slow(2, 14.0, {0: 60.0, 1: 5.0}, 3.0, ["eu"]) is None  # 2.8× < 3×
    alert = slow(2, 16.0, {0: 60.0, 1: 5.0}, 3.0, ["eu", "us"])
    assert alert is not None and alert.kind == SLOW_ROUND and alert.site == ""
    assert "round 2 took 16.0s, 3.2× the job's median round (5.0s; alert above 3×); sites in it: eu, us" \
        in alert.detail
    named = slow(2, 16.0, {0: 60.0, 1: 5.0}, 3.0, ["eu", "us"], last="eu")
    assert named is not None and named.site == "eu" and "the last update came from eu" in named.detail
    assert slow(4, 16.0, {0: 60.0, 1: 5.0, 2: 6.0, 3: 20.0}, 3.0, ["eu"]) is None  # median 6.0: 2.7×


def test_the_alerts_config_names_its_mistakes() -> None:
    assert AlertsConfig().webhook is None and "slow-round" in AlertsConfig().events
    with pytest.raises(ValidationError, match="slow_round_factor"):
        AlertsConfig.model_validate({"slow_round_factor": 1.0})
    with pytest.raises(ValidationError, match="events"):
        AlertsConfig.model_validate({"events": ["site-exploded"]})
    with pytest.raises(ValidationError, match="url"):
        AlertsConfig.model_validate({"webhook": {"url": "not a url"}})


def test_each_kind_becomes_one_automation_with_a_json_body() -> None:
    from deployments.alerts import automation_for
    from insitu.conf import ALERT_KINDS

    for kind in ALERT_KINDS:
        a = automation_for(kind, "00000000-0000-0000-0000-000000000000")
        assert a.name == f"insitu-alert-{kind}"
        (action,) = a.actions
        assert '"alert"' in action.body and '"job"' in action.body and '"site"' in action.body
        expected = a.trigger.expect
        assert expected == ({f"insitu.alert.{kind}"} if not kind.startswith("site-run") else expected)
    assert automation_for("site-run-failed", "0" * 32).trigger.expect == {"prefect.flow-run.Failed",
                                                                          "prefect.flow-run.Crashed"}
