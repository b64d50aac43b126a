"""Regression with loss: poisson, for count labels: log link, Poisson deviance, never a negative prediction."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from sklearn.metrics import mean_absolute_error, mean_poisson_deviance, mean_squared_error, r2_score

from insitu.conf import ConfigError, SchemaConfig, TaskConfig, TrainingConfig
from insitu.federated.stats import combine, mean_std, partial_stats
from insitu.job import load_job
from insitu.models import Normalization, build_model
from insitu.parallel.loop import train_epochs
from insitu.specs import build_task, task_for_label
from insitu.specs.regression import Regression, RegressionMetrics, poisson_half_deviance

REPO = Path(__file__).resolve().parents[2]
F = 4


def _poisson(label_min: float | None = 0) -> Regression:
    task = task_for_label("regression", "int", label_min=label_min, loss="poisson")
    assert isinstance(task, Regression)
    return task


def _counts(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Counts drawn with rate exp(0.3 + x·w): doctor visits of people who differ in a few features."""
    rng = np.random.default_rng(seed)
    w = np.array([0.6, -0.4, 0.3, 0.0])
    x = rng.normal(loc=1.0, scale=2.0, size=(n, F))  # not standardised: the model's normalisation does that
    rate = np.exp(0.3 + ((x - 1.0) / 2.0) @ w)
    return x.astype(np.float32), rng.poisson(rate).astype(np.float32)


# --------------------------------------------------------------------------- the label must be a count
@pytest.mark.parametrize("label_min", [None, -1.0])
def test_poisson_refuses_a_label_that_may_be_negative(label_min: float | None) -> None:
    with pytest.raises(ValueError, match=r"loss 'poisson' is for counts.*declare min: 0 on it in conf/datasets.yaml"):
        _poisson(label_min)
    task_for_label("regression", "float", label_min=label_min, loss="mse")  # the other losses take any number


def test_a_training_config_with_poisson_on_a_label_without_min_is_refused_at_load(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf, ignore=shutil.ignore_patterns("e2e-*", ".e2e-*"))
    datasets = yaml.safe_load((conf / "datasets.yaml").read_text())
    fraud = datasets["datasets"]["fraud"]
    visits = {"description": "doctor visits", "schema": {"id": "transaction_id", "label": "visits", "columns": {
        **{k: v for k, v in fraud["schema"]["columns"].items() if k != "is_fraud"}, "visits": {"type": "int"}}},
        "shards": fraud["shards"]}
    datasets["datasets"] = {"fraud": fraud, "visits": visits}
    (conf / "datasets.yaml").write_text(yaml.safe_dump(datasets, sort_keys=False))
    training = yaml.safe_load((conf / "training" / "fraud.yaml").read_text())
    training.update(task={"name": "regression", "loss": "poisson"}, gate={"primary_metric": None})
    (conf / "training" / "visits.yaml").write_text(yaml.safe_dump(training, sort_keys=False))
    with pytest.raises(ConfigError, match=r"visits.yaml: key 'task': loss 'poisson' is for counts.*declare min: 0"):
        load_job("visits", "visits", directory=conf)
    visits["schema"]["columns"]["visits"]["min"] = 0
    (conf / "datasets.yaml").write_text(yaml.safe_dump(datasets, sort_keys=False))
    task = load_job("visits", "visits", directory=conf).task
    assert isinstance(task, Regression) and task.poisson


# --------------------------------------------------------------------------- loss, norm, metrics
def test_the_loss_is_the_mean_half_poisson_deviance_with_the_likelihoods_gradient() -> None:
    _, y = _counts(300, 1)
    eta = torch.tensor(np.random.default_rng(2).normal(0.3, 0.5, size=300), dtype=torch.float64, requires_grad=True)
    yt = torch.from_numpy(y).double()
    loss = _poisson().loss({})(eta, yt)
    assert float(loss.detach()) == pytest.approx(mean_poisson_deviance(y, np.exp(eta.detach().numpy())) / 2, rel=1e-9)
    (grad,) = torch.autograd.grad(loss, eta)
    nll = torch.nn.functional.poisson_nll_loss(eta, yt, log_input=True)
    (want,) = torch.autograd.grad(nll, eta)
    assert torch.allclose(grad, want)
    positive = yt[yt > 0]  # a perfect fit scores 0
    assert float(poisson_half_deviance(torch.log(positive), positive)) == pytest.approx(0.0, abs=1e-9)


def test_poisson_starts_at_the_log_of_the_federated_mean_count() -> None:
    _, y = _counts(500, 3)
    stats = combine([partial_stats(np.zeros((n, 1)), y[a:a + n], classes=None) for a, n in ((0, 200), (200, 300))])
    shift, scale = _poisson().output_norm(stats)
    assert shift == pytest.approx(np.log(y.mean()), rel=1e-6) and scale == 1.0
    assert _poisson().loss_params(stats) == {}
    assert _poisson().output_norm({"n": 10, "label_sum": 0.0, "label_sumsq": 0.0})[0] == pytest.approx(np.log(1e-6))


def test_poisson_metrics_score_exp_of_the_output_in_label_units_and_combine_exactly() -> None:
    task = _poisson()
    per_site, truths, preds = {}, [], []
    for i, (site, n) in enumerate((("eu", 200), ("us", 120))):
        _, y = _counts(n, 10 + i)
        eta = np.random.default_rng(20 + i).normal(0.2, 0.6, size=n)
        per_site[site] = task.site_metrics(torch.from_numpy(eta), y, {})
        truths.append(y.astype(np.float64))
        preds.append(np.exp(eta))
        m = per_site[site]
        assert m["rmse"] == pytest.approx(mean_squared_error(truths[-1], preds[-1]) ** 0.5, rel=1e-9)
        assert m["mae"] == pytest.approx(mean_absolute_error(truths[-1], preds[-1]), rel=1e-9)
        assert m["loss"] == pytest.approx(mean_poisson_deviance(truths[-1], preds[-1]) / 2, rel=1e-6)
        RegressionMetrics.model_validate(m)  # what a site publishes fits the protocol as mse's does
    t, p = np.concatenate(truths), np.concatenate(preds)
    g = task.combine(per_site)
    assert g["rmse"] == pytest.approx(mean_squared_error(t, p) ** 0.5, rel=1e-9)
    assert g["r2"] == pytest.approx(r2_score(t, p), rel=1e-9)
    assert g["deviance"] == pytest.approx(mean_poisson_deviance(t, p), rel=1e-6)
    assert task.gate_metric("loss").higher_is_better is False  # the Poisson fit may decide the gate


def test_mse_and_huber_keep_their_metrics_gate_and_norm() -> None:
    for loss in ("mse", "huber"):
        task = task_for_label("regression", "float", loss=loss)
        assert isinstance(task, Regression) and not task.poisson
        assert [g.name for g in task.gate_metrics] == ["rmse", "mae", "r2"]
        out = torch.tensor([-3.0, 2.0])
        assert torch.equal(task.predict(out), out)  # in label units already, negative if the model says so
        assert "deviance" not in task.combine({"eu": task.site_metrics(out, np.array([1.0, 2.0]), {"label_scale": 1})})


# --------------------------------------------------------------------------- it trains
def test_a_tiny_model_learns_counts_and_never_predicts_a_negative_one() -> None:
    task = _poisson()
    x, y = _counts(2000, 5)
    x_test, y_test = _counts(1000, 6)
    cfg = TrainingConfig.model_validate({
        "task": {"name": "regression", "loss": "poisson"}, "model": {"hidden": [16], "dropout": 0.0},
        "optimizer": {"name": "adam", "lr": 0.01}, "batch_size": 64, "local_epochs": 10, "strategy": "single"})
    stats = partial_stats(x, y, classes=None)  # what the coordinator combines from the sites: sums only
    torch.manual_seed(0)
    model = build_model(cfg.model, F, task.n_outputs, Normalization(*mean_std(stats), *task.output_norm(stats)))
    result = train_epochs(model, x, y, cfg, task.loss(task.loss_params(stats)), seed=1)
    assert result["steps"] == 10 * 32  # a few hundred steps
    model.eval()
    with torch.no_grad():
        outputs = model(torch.from_numpy(x_test))
    pred = task.predict(outputs).numpy()
    assert (pred >= 0).all()
    fitted = mean_poisson_deviance(y_test, pred)
    constant = mean_poisson_deviance(y_test, np.full(len(y_test), y.mean()))
    truth = mean_poisson_deviance(y_test, np.exp(0.3 + ((x_test - 1.0) / 2.0) @ np.array([0.6, -0.4, 0.3, 0.0])))
    assert fitted < 0.6 * constant and fitted < 1.1 * truth  # about half the constant's, near the true rates'
    metrics = task.site_metrics(outputs, y_test, {})
    assert metrics["loss"] == pytest.approx(fitted / 2, rel=1e-4)


def test_build_task_with_poisson_from_a_schema() -> None:
    schema = SchemaConfig.model_validate({"id": "id", "label": "visits", "columns": {
        "id": {"type": "string"}, "visits": {"type": "int", "min": 0, "max": 365}}})
    task = build_task(TaskConfig.model_validate({"name": "regression", "loss": "poisson"}), schema)
    assert isinstance(task, Regression) and task.poisson


def test_the_registered_model_of_a_poisson_task_serves_counts_not_log_rates() -> None:
    from insitu.models import build_model
    from insitu.specs import task_for_label

    task = task_for_label("regression", "int", label_min=0, loss="poisson")
    assert task.output_link == "exp" and task_for_label("regression", "float").output_link == "identity"
    model = build_model(TrainingConfig().model, 3, task.n_outputs).eval()
    x = torch.randn(5, 3)
    with torch.no_grad():
        log_rate = model(x)
        model.output_link = task.output_link  # as registration sets it
        served = model(x)
    assert torch.allclose(served, torch.exp(log_rate)) and (served > 0).all()
    assert "output_link" not in model.state_dict()  # the weights on the exchange and in MLflow are unchanged
