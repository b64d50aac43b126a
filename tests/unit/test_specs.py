"""Learning tasks (``insitu.specs``): losses from federated label statistics, site metrics equal to
scikit-learn's on the same rows, exact global combination, the gate's metrics, and the configuration's
cross-check of task against label."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pydantic
import pytest
import torch
import yaml
from sklearn.metrics import (
    accuracy_score,
    average_precision_score,
    f1_score,
    log_loss,
    mean_absolute_error,
    mean_squared_error,
    r2_score,
    roc_auc_score,
)

from insitu.conf import ConfigError, SchemaConfig
from insitu.federated.stats import partial_stats
from insitu.job import load_job
from insitu.metrics import withheld
from insitu.specs import TASKS, TaskSpec, task_for_label

CLASSES = ["a", "b", "c", "d", "e"]


def _binary() -> TaskSpec:
    return task_for_label("binary", "bool")


def _multiclass(classes: list[str] = CLASSES) -> TaskSpec:
    return task_for_label("multiclass", "category", classes)


def _regression(**options: object) -> TaskSpec:
    return task_for_label("regression", "float", **options)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# --------------------------------------------------------------------------- binary
def test_binary_pos_weight_is_negatives_over_positives_of_the_federated_counts() -> None:
    y = np.array([0] * 90 + [1] * 10, dtype=np.float32)
    stats = partial_stats(np.zeros((100, 2)), y)  # what a site publishes: counts per class
    assert stats["label_counts"] == [90, 10]
    assert _binary().loss_params(stats) == {"pos_weight": pytest.approx(9.0)}
    # no positive anywhere: a finite weight (negatives over 1), not a division by zero
    assert _binary().loss_params({"label_counts": [40, 0]}) == {"pos_weight": pytest.approx(40.0)}


def test_binary_loss_weights_the_positive_term() -> None:
    task = _binary()
    z = torch.tensor([2.0, -1.0, 0.5])
    y = torch.tensor([1.0, 0.0, 1.0])
    s = 1 / (1 + np.exp(-z.numpy().astype(np.float64)))
    # by hand: -(w·y·log σ + (1-y)·log(1-σ)), averaged over rows
    want = -np.mean([3.0 * math.log(s[0]), math.log(1 - s[1]), 3.0 * math.log(s[2])])
    assert float(task.loss({"pos_weight": 3.0})(z, y)) == pytest.approx(want, rel=1e-6)


def test_binary_site_metrics_equal_sklearn_on_the_same_scores() -> None:
    rng = np.random.default_rng(1)
    y = (rng.random(400) < 0.3).astype(np.float32)
    z = (1.5 * y + rng.normal(size=400)).astype(np.float32)  # informative but imperfect logits
    m = _binary().site_metrics(torch.from_numpy(z), y, {"pos_weight": 2.0})
    p = 1 / (1 + np.exp(-z.astype(np.float64)))
    assert m["roc_auc"] == pytest.approx(roc_auc_score(y, p), abs=1e-12)
    assert m["pr_auc"] == pytest.approx(average_precision_score(y, p), abs=1e-12)
    assert 0.6 < m["roc_auc"] < 0.99  # neither chance nor perfect: the comparison could tell them apart
    assert m["count"] == 400 and m["positive_rate"] == pytest.approx(y.mean())
    want_loss = -np.mean(2.0 * y * np.log(p) + (1 - y) * np.log(1 - p))
    assert m["loss"] == pytest.approx(want_loss, rel=1e-5)
    # the coarsened histograms hold every row, and no non-empty bin fewer than the floor
    assert sum(m["hist_pos"]) == y.sum() and sum(m["hist_neg"]) == (1 - y).sum()
    assert all(c == 0 or c >= 20 for c in m["hist_pos"] + m["hist_neg"])


def test_binary_combine_is_the_count_weighted_mean() -> None:
    per_site = {
        "eu": {"task": "binary", "roc_auc": 0.9, "pr_auc": 0.5, "loss": 0.3, "count": 100.0, "positive_rate": 0.1,
               "hist_pos": [1, 2], "hist_neg": [3, 4]},
        "us": {"task": "binary", "roc_auc": 0.6, "pr_auc": 0.2, "loss": 0.7, "count": 300.0, "positive_rate": 0.3},
    }
    g = _binary().combine(per_site)
    assert g["roc_auc"] == pytest.approx((0.9 * 100 + 0.6 * 300) / 400)  # 0.675
    assert g["pr_auc"] == pytest.approx((0.5 * 100 + 0.2 * 300) / 400)  # 0.275
    assert g["loss"] == pytest.approx((0.3 * 100 + 0.7 * 300) / 400)  # 0.6
    assert g["positive_rate"] == pytest.approx(0.25)
    assert g["count"] == 400.0
    assert "hist_pos" not in g and "task" not in g  # lists and strings are not averaged


# --------------------------------------------------------------------------- multiclass
def test_multiclass_class_weights_are_balanced_from_counts_and_one_for_an_absent_class() -> None:
    task = _multiclass(["a", "b", "c", "d"])
    y = np.array([0] * 60 + [1] * 30 + [3] * 10, dtype=np.float32)  # class c held by no site
    stats = partial_stats(np.zeros((100, 1)), y, classes=4)
    assert stats["label_counts"] == [60, 30, 0, 10]
    w = task.loss_params(stats)["class_weights"]
    # n / (k · n_c) = 100 / (4 · n_c)
    assert w == pytest.approx([100 / 240, 100 / 120, 1.0, 100 / 40])
    with pytest.raises(ValueError, match="count 3 classes; the task has 4"):
        task.loss_params({"label_counts": [1, 2, 3]})


def test_multiclass_site_metrics_equal_sklearn() -> None:
    k = len(CLASSES)
    rng = np.random.default_rng(2)
    truth = rng.choice(4, size=300, p=[0.5, 0.3, 0.15, 0.05])  # class e (4) never true...
    logits = rng.normal(size=(300, k)) + 1.5 * np.eye(k)[truth]
    logits[:7, 4] = 10.0  # ...but predicted for a few rows: present as predicted only
    y = truth.astype(np.float32)
    weights = [0.5, 1.0, 2.0, 3.0, 1.0]
    out = torch.from_numpy(logits.astype(np.float32))
    m = _multiclass().site_metrics(out, y, {"class_weights": weights})
    pred = logits.argmax(axis=1)
    present = sorted(set(truth) | set(pred))
    assert 4 in present
    assert m["accuracy"] == pytest.approx(accuracy_score(truth, pred), abs=1e-12)
    assert m["macro_f1"] == pytest.approx(f1_score(truth, pred, average="macro", labels=present), abs=1e-12)
    assert m["log_loss"] == pytest.approx(log_loss(truth, _softmax(logits), labels=range(k)), rel=1e-5)
    assert m["count"] == 300.0
    assert np.array_equal(np.asarray(m["confusion"]), np.histogram2d(truth, pred, bins=[range(k + 1)] * 2)[0])
    # the training loss is class-weighted: Σ w_y · nll / Σ w_y (torch's weighted mean), by hand
    nll = -np.log(_softmax(logits)[np.arange(300), truth])
    w = np.asarray(weights)[truth]
    assert m["loss"] == pytest.approx(float((w * nll).sum() / w.sum()), rel=1e-5)


def _multiclass_site(truth: np.ndarray, pred: np.ndarray) -> dict[str, Any]:
    """A site's metrics for the given predictions (logits that argmax to ``pred``)."""
    logits = np.eye(len(CLASSES), dtype=np.float32)[pred] * 3.0
    return _multiclass().site_metrics(torch.from_numpy(logits), truth.astype(np.float32),
                                      {"class_weights": [1.0] * len(CLASSES)})


def test_multiclass_combine_is_exact_on_pooled_rows_not_a_mean_of_f1s() -> None:
    rng = np.random.default_rng(3)
    sites = {}
    # Sites see different classes and different error rates: a class's F1 on one site says little about
    # its F1 on the pooled rows, so the weighted mean of site F1s is not the pooled F1.
    for name, n, probs, err in (("eu", 200, [0.7, 0.3, 0, 0, 0], 0.1), ("us", 60, [0, 0, 0.5, 0.5, 0], 0.5),
                                ("apac", 120, [0.2, 0.2, 0.2, 0.2, 0.2], 0.3)):
        truth = rng.choice(5, size=n, p=probs)
        pred = np.where(rng.random(n) < err, rng.integers(0, 5, size=n), truth)
        sites[name] = (truth, pred)
    per_site = {s: _multiclass_site(t, p) for s, (t, p) in sites.items()}
    g = _multiclass().combine(per_site)
    truth = np.concatenate([t for t, _ in sites.values()])
    pred = np.concatenate([p for _, p in sites.values()])
    pooled_f1 = f1_score(truth, pred, average="macro")
    assert g["macro_f1"] == pytest.approx(pooled_f1, abs=1e-12)
    assert g["accuracy"] == pytest.approx(accuracy_score(truth, pred), abs=1e-12)
    assert g["count"] == len(truth)
    weighted_mean_f1 = sum(m["macro_f1"] * m["count"] for m in per_site.values()) / len(truth)
    assert abs(weighted_mean_f1 - pooled_f1) > 0.02  # the case really tells the two apart
    # log loss is a mean over rows: the count-weighted mean is the pooled one
    pooled_ll = sum(m["log_loss"] * m["count"] for m in per_site.values()) / len(truth)
    logits = np.eye(5)[pred] * 3.0
    assert g["log_loss"] == pytest.approx(log_loss(truth, _softmax(logits), labels=range(5)), rel=1e-5)
    assert g["log_loss"] == pytest.approx(pooled_ll)


# --------------------------------------------------------------------------- regression
def _regression_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    truth = 300 + 50 * rng.normal(size=n)
    pred = truth + rng.normal(loc=5.0, scale=20.0, size=n)  # biased and noisy: r2 well inside (0, 1)
    return truth, pred


def test_regression_output_norm_is_the_labels_mean_and_std() -> None:
    truth, _ = _regression_data(500, 4)
    parts = [partial_stats(np.zeros((n, 1)), truth[a:a + n], classes=None) for a, n in ((0, 200), (200, 300))]
    from insitu.federated.stats import combine

    stats = combine(parts)
    shift, scale = _regression().output_norm(stats)
    assert shift == pytest.approx(np.mean(truth), rel=1e-12)
    assert scale == pytest.approx(np.std(truth), rel=1e-9)  # population std, as the pooled rows give it
    assert _regression().loss_params(stats) == {"label_scale": pytest.approx(np.std(truth), rel=1e-9)}
    with pytest.raises(ValueError, match="no samples"):
        _regression().output_norm({"n": 0, "label_sum": 0.0, "label_sumsq": 0.0})


def test_regression_site_metrics_equal_sklearn() -> None:
    truth, pred = _regression_data(400, 5)
    m = _regression().site_metrics(torch.from_numpy(pred.astype(np.float32)), truth.astype(np.float32),
                                   {"label_scale": 50.0})
    t32, p32 = truth.astype(np.float32).astype(np.float64), pred.astype(np.float32).astype(np.float64)
    assert m["rmse"] == pytest.approx(mean_squared_error(t32, p32) ** 0.5, rel=1e-9)
    assert m["mae"] == pytest.approx(mean_absolute_error(t32, p32), rel=1e-9)
    assert m["r2"] == pytest.approx(r2_score(t32, p32), rel=1e-9)
    assert 0.5 < m["r2"] < 0.95
    assert m["count"] == 400.0
    assert m["loss"] == pytest.approx(mean_squared_error(t32, p32) / 50.0**2, rel=1e-5)  # MSE, standardised


def test_regression_combine_is_exact_on_pooled_rows() -> None:
    per_site, truths, preds = {}, [], []
    # different label levels per site: pooled R² is not a weighted mean of the sites' R²
    for i, (name, n, offset) in enumerate((("eu", 150, 0.0), ("us", 90, 200.0), ("apac", 60, -100.0))):
        truth, pred = _regression_data(n, 10 + i)
        truth, pred = truth + offset, pred + offset
        per_site[name] = _regression().site_metrics(torch.from_numpy(pred), truth, {"label_scale": 50.0})
        truths.append(truth)
        preds.append(pred)
    t, p = np.concatenate(truths), np.concatenate(preds)
    g = _regression().combine(per_site)
    assert g["rmse"] == pytest.approx(mean_squared_error(t, p) ** 0.5, rel=1e-9)
    assert g["mae"] == pytest.approx(mean_absolute_error(t, p), rel=1e-9)
    assert g["r2"] == pytest.approx(r2_score(t, p), rel=1e-9)
    assert g["count"] == len(t)
    weighted_r2 = sum(m["r2"] * m["count"] for m in per_site.values()) / len(t)
    assert abs(weighted_r2 - g["r2"]) > 0.05


def test_huber_and_mse_differ_on_an_outlier() -> None:
    y = torch.tensor([100.0, 200.0, 300.0, 400.0])
    out = y.clone()
    out[3] += 10 * 50.0  # one prediction 10 label-stds off
    params = {"label_scale": 50.0}
    mse = float(_regression(loss="mse").loss(params)(out, y))
    huber = float(_regression(loss="huber", huber_delta=1.0).loss(params)(out, y))
    # standardised residuals (0, 0, 0, 10): MSE = 10²/4, Huber(δ=1) = (10 - 0.5)/4
    assert mse == pytest.approx(25.0)
    assert huber == pytest.approx(2.375)
    huber2 = float(_regression(loss="huber", huber_delta=2.0).loss(params)(out, y))
    assert huber2 == pytest.approx(2.0 * (10 - 1.0) / 4)  # δ·(|r| - δ/2), averaged


# --------------------------------------------------------------------------- every task
def test_global_metrics_leave_out_withheld_sites() -> None:
    task = _regression()
    truth, pred = _regression_data(200, 20)
    a = task.site_metrics(torch.from_numpy(pred[:100]), truth[:100], {"label_scale": 50.0})
    b = task.site_metrics(torch.from_numpy(pred[100:180]), truth[100:180], {"label_scale": 50.0})
    # a site with only 10 rows publishing its sums anyway, and with a large error: it would move the result
    small = task.site_metrics(torch.from_numpy(pred[180:190] + 500), truth[180:190], {"label_scale": 50.0})
    assert small["count"] == 10
    per_site = {"eu": a, "us": b, "apac": withheld(), "latam": small}
    g = task.global_metrics(per_site)
    assert g == pytest.approx(task.combine({"eu": a, "us": b}), nan_ok=True)
    assert g["rmse"] == pytest.approx(mean_squared_error(truth[:180], pred[:180]) ** 0.5, rel=1e-9)
    assert task.combine({"eu": a, "us": b, "latam": small})["rmse"] > g["rmse"] * 1.5

    mc = _multiclass()
    rng = np.random.default_rng(21)
    t = rng.integers(0, 5, size=60)
    ok = _multiclass_site(t[:40], t[:40])  # all right
    few = _multiclass_site(t[40:55], (t[40:55] + 1) % 5)  # 15 rows, all wrong
    g = mc.global_metrics({"eu": ok, "us": few, "apac": withheld()})
    assert g["accuracy"] == 1.0 and g["count"] == 40

    bc = _binary()
    g = bc.global_metrics({"eu": {"roc_auc": 0.8, "count": 50.0}, "us": {"roc_auc": 0.1, "count": 19.0},
                           "apac": withheld()})
    assert g["roc_auc"] == pytest.approx(0.8) and g["count"] == 50.0


@pytest.mark.parametrize(("name", "label", "classes", "first", "others"), [
    ("binary", "bool", None, "pr_auc", ["roc_auc"]),
    ("multiclass", "category", CLASSES, "macro_f1", ["accuracy", "log_loss"]),
    ("regression", "float", None, "rmse", ["mae", "r2"]),
])
def test_gate_metric_defaults_to_the_first_and_names_the_known_ones(
    name: str, label: str, classes: list[str] | None, first: str, others: list[str]
) -> None:
    task = task_for_label(name, label, classes)
    assert task.gate_metric(None).name == first
    for o in others:
        assert task.gate_metric(o).name == o
    with pytest.raises(ValueError) as e:
        task.gate_metric("nonsense")
    for known in [first, *others]:
        assert repr(known) in str(e.value)
    assert "'nonsense'" in str(e.value)


def test_gate_metric_directions() -> None:
    assert _binary().gate_metric("pr_auc").improvement(0.6, 0.5) == pytest.approx(0.1)
    rmse = _regression().gate_metric("rmse")
    assert rmse.improvement(9.0, 10.0) == pytest.approx(1.0)  # lower is better
    assert rmse.meets(9.0, 10.0) and not rmse.meets(11.0, 10.0)
    assert rmse.meets(11.0, None) and not rmse.meets(float("nan"), None)


def test_task_refuses_a_label_of_the_wrong_type() -> None:
    with pytest.raises(ValueError, match="task 'regression' needs a label column of type float or int"):
        task_for_label("regression", "bool")
    with pytest.raises(ValueError, match="task 'multiclass' needs a label column of type category"):
        task_for_label("multiclass", "float")
    assert sorted(TASKS) == ["binary", "multiclass", "regression"]


# --------------------------------------------------------------------------- configuration
@pytest.fixture
def conf(conf_copy: Path) -> Path:
    """A private copy of the fixture ``conf/`` that a test adds its training configs (and a dataset) to."""
    return conf_copy


def _training(conf: Path, name: str, **changes: Any) -> Path:
    """``conf/training/<name>.yaml``: the fraud config with top-level ``changes`` (dicts are merged)."""
    data = yaml.safe_load((conf / "training" / "fraud.yaml").read_text())
    for k, v in changes.items():
        data[k] = {**data[k], **v} if isinstance(v, dict) and isinstance(data.get(k), dict) else v
    path = conf / "training" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_conf_refuses_multiclass_on_a_bool_label(conf: Path) -> None:
    path = _training(conf, "mc", task="multiclass", gate={"primary_metric": None})
    with pytest.raises(ConfigError) as e:
        load_job("mc", "fraud", directory=conf)
    msg = str(e.value)
    assert str(path) in msg and "key 'task'" in msg
    assert "needs a label column of type category" in msg and "'is_fraud' has type bool" in msg


def test_conf_refuses_a_gate_metric_of_another_task(conf: Path) -> None:
    path = _training(conf, "rm", gate={"primary_metric": "rmse"})
    with pytest.raises(ConfigError) as e:
        load_job("rm", "fraud", directory=conf)
    msg = str(e.value)
    assert str(path) in msg and "key 'gate.primary_metric'" in msg
    assert "['pr_auc', 'roc_auc']" in msg and "'rmse'" in msg


def test_conf_loads_multiclass_on_a_category_label(conf: Path) -> None:
    datasets = yaml.safe_load((conf / "datasets.yaml").read_text())
    datasets["datasets"]["wine"] = {
        "schema": {"id": "id", "label": "quality", "columns": {
            "id": {"type": "string"}, "acidity": {"type": "float"},
            "quality": {"type": "category", "values": ["low", "mid", "high"]}}},
        "shards": [{"id": "eu-w", "site": "eu", "path": "raw/wine/a.parquet"},
                   {"id": "us-w", "site": "us", "path": "raw/wine/b.parquet"}],
    }
    (conf / "datasets.yaml").write_text(yaml.safe_dump(datasets, sort_keys=False))
    _training(conf, "wine", task="multiclass", gate={"primary_metric": "accuracy", "absolute_floor": None})
    c = load_job("wine", "wine", directory=conf)
    task = c.task
    assert task.name == "multiclass" and task.n_outputs == 3
    assert task.gate_metric(c.training.gate.primary_metric).name == "accuracy"


def test_schema_refuses_a_string_label() -> None:
    with pytest.raises(pydantic.ValidationError, match="label column 'label' has type: string"):
        SchemaConfig.model_validate({"id": "id", "label": "label",
                                     "columns": {"id": {"type": "string"}, "label": {"type": "string"}}})
