"""The regression task at the parallel level: DDP ranks on real Dask workers (gloo) train a model that
predicts in the label's units, equal to one process stepping on the same global batches."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from toy_site import local_cluster, one_process_reference, write_train_split

from insitu.conf import TrainingConfig
from insitu.federated.stats import mean_std, partial_stats
from insitu.models import Normalization, build_model
from insitu.parallel import DataRef, TrainResult, TrainSpec
from insitu.parallel.site import train_site
from insitu.specs import TaskSpec, task_for_label

N, N_TEST, F, WORLD, SEED = 1024, 400, 6, 2, 5
TASK: TaskSpec = task_for_label("regression", "float")


def _rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A linear target plus noise, in the hundreds: y = 300 + 50 · x·w + noise (label std about 50)."""
    rng = np.random.default_rng(seed)
    w = np.random.default_rng(99).normal(size=F)  # the same truth for training and held-out rows
    w /= np.linalg.norm(w)  # x·w ~ N(0, 1)
    # features not centred nor of unit scale: the model's standardisation has work to do
    x = rng.normal(loc=2.0, scale=3.0, size=(n, F))
    y = 300 + 50 * ((x - 2.0) / 3.0) @ w + rng.normal(scale=5.0, size=n)
    return x.astype(np.float32), y.astype(np.float32)


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    with local_cluster(WORLD) as address:
        yield address


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    # The reference runs in this process: one thread, as each rank has, and the machine's 2 cores for the ranks.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _spec(tmp_path: Path) -> TrainSpec:
    """A site's prepared train split on a local store, and the job's spec built from its label statistics."""
    x, y = _rows(N, 0)
    store = write_train_split(tmp_path, x, y, cuts=[300], row_group_size=128)  # two shards
    cfg = TrainingConfig.model_validate({
        "task": "regression", "model": {"hidden": [16], "dropout": 0.0},
        "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.5},
        "batch_size": 64, "local_epochs": 4, "strategy": "ddp", "ranks_per_site": WORLD})
    # what the coordinator derives from the sites' published statistics: counts and sums only
    stats = partial_stats(x, y, classes=None)
    norm = Normalization(*mean_std(stats), *TASK.output_norm(stats))
    torch.manual_seed(0)
    state = build_model(cfg.model, F, TASK.n_outputs, norm).state_dict()
    return TrainSpec(cfg, TASK, F, state, DataRef(store, "toy", "job"),
                     TASK.loss_params(stats), SEED)


def _reference(spec: TrainSpec) -> tuple[dict[str, torch.Tensor], list[float]]:
    """One process stepping on the union of the ranks' batches, with the loss written out: the mean squared
    error of the prediction in label units, divided by the label's std."""
    scale = float(spec.loss_params["label_scale"])

    def loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (((model(x) - y) / scale) ** 2).mean()

    return one_process_reference(spec, build_model(spec.training.model, F, 1), loss, WORLD)


def _held_out_metrics(state: dict[str, torch.Tensor], spec: TrainSpec) -> tuple[dict[str, float], np.ndarray]:
    x, y = _rows(N_TEST, 1)
    model = build_model(spec.training.model, F, 1)
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        out = model(torch.from_numpy(x))
    return TASK.site_metrics(out, y, spec.loss_params), out.numpy()


@pytest.fixture(scope="module")
def trained(cluster: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[TrainSpec, TrainResult]:
    """One DDP run, shared by the tests below (the cluster's start and the run are the slow part)."""
    sp = _spec(tmp_path_factory.mktemp("regression"))
    return sp, train_site(sp, cluster)


def test_ddp_regression_matches_one_process_on_the_same_global_batches(
    trained: tuple[TrainSpec, TrainResult],
) -> None:
    sp, result = trained
    ref, losses = _reference(sp)
    assert result.n_samples == N
    assert result.metrics["ranks"] == WORLD and result.metrics["steps"] == len(losses)
    for k in ref:
        assert torch.allclose(result.state[k], ref[k], atol=1e-5), k
    # training moved the weights, and the label's shift and scale stayed what the statistics said
    assert not torch.allclose(result.state["core.0.weight"], sp.state["core.0.weight"])
    assert float(result.state["out_shift"]) == float(sp.state["out_shift"])
    assert float(result.state["out_scale"]) == float(sp.state["out_scale"])
    # the loss the ranks report is the standardised MSE: it fell from about 1 (the label's variance in stds)
    assert losses[0] > 0.5 and result.metrics["train_loss"] < 0.5 * losses[0]


def test_trained_model_predicts_in_the_labels_units(trained: tuple[TrainSpec, TrainResult]) -> None:
    sp, result = trained
    _, y = _rows(N_TEST, 1)
    label_std, label_mean = float(np.std(y)), float(np.mean(y))
    assert 40 < label_std < 60 and 290 < label_mean < 310  # the data are what the test says they are

    before, untrained = _held_out_metrics(sp.state, sp)
    after, pred = _held_out_metrics(result.state, sp)
    # Even untrained, the model is centred on the label's mean: the shift comes from the federated label
    # statistics (Standardized's out_shift), not from training.
    assert abs(float(untrained.mean()) - label_mean) < 0.3 * label_std  # 0 without the shift
    # the untrained model predicts roughly the mean plus noise; the trained one fits the line
    assert before["rmse"] > 0.8 * label_std
    assert after["rmse"] < 0.3 * label_std, (after, label_std)
    assert after["r2"] > 0.9
    # predictions in the label's units: centred on its mean and spread like it, not standardised values
    assert abs(float(pred.mean()) - label_mean) < 0.1 * label_std
    assert 0.8 * label_std < float(pred.std()) < 1.2 * label_std
    # site_metrics' RMSE is the plain one on these rows
    assert after["rmse"] == pytest.approx(float(np.sqrt(np.mean((pred.astype(np.float64) - y) ** 2))), rel=1e-6)
