"""DDP ranks on real Dask workers with a real gloo process group: loss parity with one rank."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from distributed import LocalCluster

from insitu.conf import AggregatorConfig, TrainingConfig
from insitu.data.prepare import prepared_prefix
from insitu.federated.aggregators import build_aggregator
from insitu.models import build_model
from insitu.parallel import DataRef, TrainSpec
from insitu.parallel.launch import LaunchError, launch_on_dask
from insitu.parallel.loop import make_optimizer
from insitu.parallel.site import train_site
from insitu.specs import task_for_label
from insitu.storage import Store

N, F, WORLD, SEED = 512, 8, 2, 3
TASK = task_for_label("binary", "bool")
LOSS = {"pos_weight": 3.0}


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    with LocalCluster(n_workers=WORLD, threads_per_worker=1, processes=True, dashboard_address=None,
                      host="127.0.0.1") as c:
        yield c.scheduler_address


@pytest.fixture
def spec(tmp_path: Path) -> TrainSpec:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, F)).astype(np.float32)
    y = (x[:, 0] + 0.5 * rng.normal(size=N) > 1.0).astype(np.float32)
    d = tmp_path / prepared_prefix("toy", "job") / "train"
    d.mkdir(parents=True)
    # unequal shards with small row groups: rank 0's block ends inside the second shard's row group
    for i, sl in enumerate((slice(0, 200), slice(200, N))):
        frame = pd.DataFrame(x[sl], columns=[f"f{j}" for j in range(F)])
        frame["label"] = y[sl]
        frame.to_parquet(d / f"shard-{i}.parquet", index=False, row_group_size=64)
    cfg = TrainingConfig.model_validate({
        "model": {"hidden": [16], "dropout": 0.0}, "optimizer": {"name": "sgd", "lr": 0.1},
        "batch_size": 64, "local_epochs": 2, "strategy": "ddp", "ranks_per_site": WORLD})
    torch.manual_seed(0)
    state = build_model(cfg.model, F).state_dict()
    return TrainSpec(cfg, TASK, F, state, DataRef(Store(f"file://{tmp_path}/", {}), "toy", "job"), LOSS, SEED)


def _reference(spec: TrainSpec, mu: float = 0.0) -> tuple[dict[str, torch.Tensor], list[float]]:
    """One process, one optimizer, stepping on the union of the ranks' batches (plus FedProx's term)."""
    from insitu.data.loader import load_split

    x, y = load_split(spec.data.store, "toy", "job", "train")
    model = build_model(spec.training.model, F)
    model.load_state_dict(spec.state)
    opt = make_optimizer(model, spec.training)
    loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor(spec.loss_params["pos_weight"]))
    per_rank = N // WORLD
    rows = [np.arange(r * per_rank, (r + 1) * per_rank) for r in range(WORLD)]  # each rank's block
    b = spec.training.batch_size // WORLD
    losses = []
    for epoch in range(spec.training.local_epochs):
        order = np.random.default_rng([SEED, epoch]).permutation(len(rows[0]))
        for i in range(0, len(order), b):
            idx = np.concatenate([r[order[i:i + b]] for r in rows])
            opt.zero_grad()
            loss = loss_fn(model(torch.from_numpy(x[idx])), torch.from_numpy(y[idx]))
            if mu:  # written out here, not taken from insitu: mu/2 · ‖w − w_round‖² over the parameters
                loss = loss + mu / 2 * sum(((p - spec.state[n]) ** 2).sum() for n, p in model.named_parameters())
            loss.backward()
            opt.step()
            losses.append(float(loss))
    return model.state_dict(), losses


def test_ddp_matches_one_rank_on_the_same_global_batch(cluster: str, spec: TrainSpec) -> None:
    result = train_site(spec, cluster)
    ref, losses = _reference(spec)
    assert result.n_samples == N
    assert result.metrics["ranks"] == WORLD and result.metrics["steps"] == len(losses)
    assert result.metrics["comm_s"] > 0
    for k in ref:
        assert torch.allclose(result.state[k], ref[k], atol=1e-5), k
    # and training moved the weights (parity of an untrained model would prove nothing)
    assert not torch.allclose(result.state["core.0.weight"], spec.state["core.0.weight"])


def test_fedprox_term_trains_the_same_under_ddp_as_in_one_process(cluster: str, spec: TrainSpec) -> None:
    """The aggregator's configure hook (FedProx's mu) reaches every rank; the proximal term pulls the weights
    toward the round's global ones, and DDP's result equals one process's with the term written out."""
    spec.training = spec.training.model_copy(update={"aggregator": AggregatorConfig(name="fedprox",
                                                                                   options={"mu": 0.5})})
    spec.site_options = build_aggregator("fedprox", {"mu": 0.5}).configure(0)  # what a site's round passes in
    result = train_site(spec, cluster)
    ref, _ = _reference(spec, mu=0.5)
    for k in ref:
        assert torch.allclose(result.state[k], ref[k], atol=1e-5), k
    plain, _ = _reference(spec)
    moved = {k: float((result.state[k] - spec.state[k]).norm()) for k in ("core.0.weight", "core.3.weight")}
    moved_plain = {k: float((plain[k] - spec.state[k]).norm()) for k in moved}
    assert all(moved[k] < moved_plain[k] for k in moved), (moved, moved_plain)  # pulled toward the global


def test_single_strategy_trains_on_all_rows(spec: TrainSpec) -> None:
    single = TrainSpec(spec.training.model_copy(update={"strategy": "single", "ranks_per_site": 1}), TASK, F,
                       spec.state, spec.data, LOSS, SEED)
    result = train_site(single)
    assert result.n_samples == N and result.metrics["train_loss"] > 0


def _echo(rank: int, world: int, payload: int) -> tuple[int, int, int]:
    import torch.distributed as dist

    t = torch.tensor([rank + payload])
    dist.all_reduce(t)
    return rank, world, int(t)


def test_launch_runs_one_rank_per_worker_with_a_real_process_group(cluster: str) -> None:
    assert launch_on_dask(cluster, _echo, WORLD, 10) == [(0, 2, 21), (1, 2, 21)]


def test_launch_refuses_more_ranks_than_workers(cluster: str) -> None:
    with pytest.raises(LaunchError, match="3 ranks need 3 Dask workers .* has 2"):
        launch_on_dask(cluster, _echo, 3, 0, worker_wait_s=1)
