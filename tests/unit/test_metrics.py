"""Binary metrics, their row floor, and their sample-weighted combination across sites."""

from __future__ import annotations

import math

import numpy as np
import pytest

from insitu.metrics import binary_metrics, weighted_global, withheld, withheld_sites


def test_weighted_global_hand_computed() -> None:
    per_site = {
        "eu": {"roc_auc": 0.8, "loss": 0.5, "count": 100.0},
        "us": {"roc_auc": 0.6, "loss": 0.3, "count": 300.0},
    }
    out = weighted_global(per_site)
    # 0.25*0.8 + 0.75*0.6 = 0.65 ; 0.25*0.5 + 0.75*0.3 = 0.35
    assert out == pytest.approx({"roc_auc": 0.65, "loss": 0.35, "count": 400.0})
    assert set(out) == {"roc_auc", "loss", "count"}


def test_weighted_global_three_sites() -> None:
    per_site = {
        "a": {"loss": 1.0, "count": 100.0},
        "b": {"loss": 2.0, "count": 200.0},
        "c": {"loss": 4.0, "count": 700.0},
    }
    # (1*100 + 2*200 + 4*700) / 1000 = 3.3
    assert weighted_global(per_site)["loss"] == pytest.approx(3.3)


def test_nan_values_are_left_out_of_that_metric_only() -> None:
    per_site = {
        "eu": {"roc_auc": float("nan"), "loss": 0.2, "count": 100.0},
        "us": {"roc_auc": 0.7, "loss": 0.6, "count": 300.0},
    }
    out = weighted_global(per_site)
    assert out["roc_auc"] == pytest.approx(0.7)  # only us has an AUC
    assert out["loss"] == pytest.approx(0.5)  # 0.25*0.2 + 0.75*0.6, eu still counts here
    assert out["count"] == 400.0


def test_all_nan_metric_stays_nan_and_missing_metric_is_skipped() -> None:
    per_site = {
        "eu": {"pr_auc": float("nan"), "count": 100.0},
        "us": {"pr_auc": float("nan"), "loss": 1.0, "count": 300.0},
    }
    out = weighted_global(per_site)
    assert math.isnan(out["pr_auc"])
    assert out["loss"] == pytest.approx(1.0)  # eu has no loss: us alone
    assert out["count"] == 400.0
    assert weighted_global({}) == {"count": 0.0}


def test_binary_metrics_hand_computed() -> None:
    y = np.array([0, 0, 1, 1])
    scores = np.array([0.1, 0.4, 0.35, 0.8])
    m = binary_metrics(y, scores, loss=0.42)
    assert m["roc_auc"] == pytest.approx(0.75)  # 3 of 4 positive/negative pairs ordered right
    assert m["pr_auc"] == pytest.approx(0.5 * 1.0 + 0.5 * (2 / 3))
    assert m["loss"] == 0.42 and m["count"] == 4.0 and m["positive_rate"] == 0.5


def test_binary_metrics_accepts_bool_and_float_labels() -> None:
    m = binary_metrics(np.array([True, False, True]), np.array([0.9, 0.1, 0.8]), loss=np.float32(0.1))
    assert m["roc_auc"] == 1.0 and m["pr_auc"] == 1.0
    assert isinstance(m["loss"], float)
    m2 = binary_metrics(np.array([1.0, 0.0, 0.0]), np.array([0.2, 0.9, 0.1]), loss=0.0)
    assert m2["roc_auc"] == pytest.approx(0.5)


@pytest.mark.parametrize("label", [0, 1])
def test_single_class_gives_nan_aucs(label: int) -> None:
    y = np.full(5, label)
    m = binary_metrics(y, np.linspace(0, 1, 5), loss=0.3)
    assert math.isnan(m["roc_auc"]) and math.isnan(m["pr_auc"])
    assert m["count"] == 5.0 and m["positive_rate"] == float(label) and m["loss"] == 0.3


def test_empty_split() -> None:
    m = binary_metrics(np.array([]), np.array([]), loss=float("nan"))
    assert m["count"] == 0.0
    assert math.isnan(m["roc_auc"]) and math.isnan(m["pr_auc"]) and math.isnan(m["positive_rate"])


def test_withheld_sites_are_left_out_of_every_global_metric_and_named(caplog: pytest.LogCaptureFixture) -> None:
    per_site = {
        "eu": {"roc_auc": 0.8, "loss": 0.5, "positive_rate": 0.1, "count": 100.0},
        "us": withheld(),  # fewer test rows than the floor: nothing but the marker
        "apac": {},  # what the coordinator keeps of a marker when it keeps numbers only
        "mx": {"roc_auc": 0.1, "loss": 9.0, "positive_rate": 1.0, "count": 5.0},  # under the floor all the same
    }
    assert withheld() == {"withheld": "fewer than 20 rows"}
    assert withheld_sites(per_site) == ["us", "apac", "mx"]
    with caplog.at_level("WARNING", logger="insitu.metrics"):
        out = weighted_global(per_site)
    assert out == {"roc_auc": 0.8, "loss": 0.5, "positive_rate": 0.1, "count": 100.0}
    assert "['us', 'apac', 'mx']" in caplog.text and "fewer than 20 test rows" in caplog.text
    assert weighted_global({"us": withheld()}) == {"count": 0.0}


def test_the_floor_can_be_raised_by_the_caller() -> None:
    per_site = {"eu": {"loss": 1.0, "count": 40.0}, "us": {"loss": 3.0, "count": 60.0}}
    assert weighted_global(per_site, min_rows=50) == {"loss": 3.0, "count": 60.0}
