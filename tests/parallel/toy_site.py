"""What the parallel tests share: a toy site's prepared train split on a local store, a Dask cluster of
single-thread worker processes, and the run the ranks are compared with — one process stepping on the union of
the replicas' batches, written out here rather than taken from insitu's loop.

A plain module, imported as ``from toy_site import …`` (pytest puts each test's folder on the path).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from distributed import LocalCluster

from insitu.data.loader import load_split
from insitu.data.prepare import prepared_prefix
from insitu.parallel import TrainSpec
from insitu.parallel.loop import make_optimizer
from insitu.storage import Store

# loss of one global batch: (model, features, labels) -> scalar
BatchLoss = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


@contextmanager
def local_cluster(n_workers: int) -> Iterator[str]:
    """A Dask cluster on 127.0.0.1 of ``n_workers`` single-thread worker processes (one rank each); its
    scheduler's address."""
    with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None,
                      host="127.0.0.1") as c:
        yield c.scheduler_address


def write_train_split(root: Path, x: np.ndarray, y: np.ndarray, cuts: Sequence[int] = (),
                      row_group_size: int | None = None, dataset: str = "toy", job: str = "job") -> Store:
    """``x`` (columns ``f0``, ``f1``, …) and ``y`` (``label``) as the prepared train split of ``dataset`` in
    ``job`` under ``root``, cut into one shard per piece between ``cuts`` (as several prepared shards give);
    returns the store at ``root``."""
    d = root / prepared_prefix(dataset, job) / "train"
    d.mkdir(parents=True)
    bounds = [0, *cuts, len(y)]
    for i, (start, stop) in enumerate(zip(bounds, bounds[1:], strict=False)):
        frame = pd.DataFrame(x[start:stop], columns=[f"f{j}" for j in range(x.shape[1])])
        frame["label"] = y[start:stop]
        frame.to_parquet(d / f"shard-{i}.parquet", index=False, row_group_size=row_group_size)
    return Store(f"file://{root}/", {})


def one_process_reference(spec: TrainSpec, model: torch.nn.Module, batch_loss: BatchLoss,
                          replicas: int) -> tuple[dict[str, torch.Tensor], list[float]]:
    """``model`` (loaded with ``spec.state``) trained by one process, one optimizer, on the union of the
    data-parallel replicas' batches: replica r holds the r-th of ``replicas`` equal blocks of the train split and
    takes ``batch_size / replicas`` rows of it per step, in the order of the epoch's permutation (seeded by
    ``[spec.seed, epoch]``). Returns the trained state and each step's loss."""
    x, y = load_split(spec.data.store, spec.data.dataset, spec.data.job_id, spec.data.split)
    model.load_state_dict(spec.state)
    opt = make_optimizer(model, spec.training)
    per = len(y) // replicas
    blocks = [np.arange(r * per, (r + 1) * per) for r in range(replicas)]
    b = spec.training.batch_size // replicas
    losses = []
    for epoch in range(spec.training.local_epochs):
        order = np.random.default_rng([spec.seed, epoch]).permutation(per)
        for i in range(0, per, b):
            idx = np.concatenate([blk[order[i:i + b]] for blk in blocks])
            opt.zero_grad()
            loss = batch_loss(model, torch.from_numpy(x[idx]), torch.from_numpy(y[idx]))
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return model.state_dict(), losses
