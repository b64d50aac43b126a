"""DDP ranks on real Dask workers with a real gloo process group: loss parity with one rank."""

from __future__ import annotations

import glob
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from toy_site import local_cluster, one_process_reference, write_train_split

from insitu.conf import AggregatorConfig, TrainingConfig
from insitu.federated.aggregators import build_aggregator
from insitu.models import build_model
from insitu.parallel import DataRef, TrainSpec
from insitu.parallel.launch import LaunchError, launch_on_dask
from insitu.parallel.site import train_site
from insitu.specs import task_for_label

N, F, WORLD, SEED = 512, 8, 2, 3
TASK = task_for_label("binary", "bool")
LOSS = {"pos_weight": 3.0}


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    with local_cluster(WORLD) as address:
        yield address


@pytest.fixture
def spec(tmp_path: Path) -> TrainSpec:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, F)).astype(np.float32)
    y = (x[:, 0] + 0.5 * rng.normal(size=N) > 1.0).astype(np.float32)
    # unequal shards with small row groups: rank 0's block ends inside the second shard's row group
    store = write_train_split(tmp_path, x, y, cuts=[200], row_group_size=64)
    cfg = TrainingConfig.model_validate({
        "model": {"hidden": [16], "dropout": 0.0}, "optimizer": {"name": "sgd", "lr": 0.1},
        "batch_size": 64, "local_epochs": 2, "strategy": "ddp", "ranks_per_site": WORLD})
    torch.manual_seed(0)
    state = build_model(cfg.model, F).state_dict()
    return TrainSpec(cfg, TASK, F, state, DataRef(store, "toy", "job"), LOSS, SEED)


def _reference(spec: TrainSpec, mu: float = 0.0) -> tuple[dict[str, torch.Tensor], list[float]]:
    """One process stepping on the union of the ranks' batches (plus FedProx's term, written out here)."""
    bce = torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor(spec.loss_params["pos_weight"]))

    def loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        value = bce(model(x), y)
        if mu:  # mu/2 · ‖w − w_round‖² over the parameters, not taken from insitu
            value = value + mu / 2 * sum(((p - spec.state[n]) ** 2).sum() for n, p in model.named_parameters())
        return value

    return one_process_reference(spec, build_model(spec.training.model, F), loss, WORLD)


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


def _gloo_threads() -> int:
    """gloo's transport threads in this process (one per live gloo device)."""
    return sum(Path(p).read_text().strip() == "gloo_tcp_loop" for p in glob.glob("/proc/self/task/*/comm"))


def test_a_finished_rank_leaves_no_process_group_running_in_its_worker(cluster: str, spec: TrainSpec) -> None:
    """Without the collection after each rank, every round left a gloo thread running in each idle worker (seen
    with a client connected throughout, as the site's flow run is)."""
    from distributed import Client

    spec.training = spec.training.model_copy(update={"local_epochs": 1})  # few allocations: no collection meanwhile
    with Client(cluster) as c:
        left = []
        for _ in range(3):
            train_site(spec, cluster)
            left.append(c.run(_gloo_threads))
    assert all(len(n) == WORLD and not any(n.values()) for n in left), left
