"""The training loop every strategy shares: one rank's batches of the site's global batch.

Each rank trains on its own block of the site's rows (``insitu.data.loader.load_rank_part``: equal
sizes, so every rank runs the same number of steps, as DDP needs) and visits it in a seeded order that
is the same on every rank. A step of ``world`` ranks with ``batch_size // world`` rows each therefore
equals one step of one rank on the union of those rows — the basis of the loss-parity test.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from insitu.conf import TrainingConfig
from insitu.parallel.types import StepFn

if TYPE_CHECKING:
    from insitu.parallel.checkpoint import Checkpointer


def make_optimizer(model: nn.Module, cfg: TrainingConfig) -> torch.optim.Optimizer:
    o = cfg.optimizer
    if o.name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
    if o.name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=o.lr, weight_decay=o.weight_decay)
    return torch.optim.Adam(model.parameters(), lr=o.lr, weight_decay=o.weight_decay)


def train_epochs(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    cfg: TrainingConfig,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    seed: int,
    world: int = 1,
    comm_seconds: Callable[[], float] | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    checkpointer: Checkpointer | None = None,
    after_backward: Callable[[], None] | None = None,
    step: StepFn | None = None,
    drop_last: bool = False,
) -> dict[str, float]:
    """Train ``model`` (what this rank's strategy made of it) on this rank's rows for ``cfg.local_epochs`` epochs.

    ``x``/``y`` are this rank's rows already (``world`` is the number of data-parallel replicas: each takes
    ``batch_size // world`` rows per step); ``loss_fn(outputs, y)`` is the task's loss, unless the strategy has
    its own ``step`` (a pipeline: forward and backward through the stages). ``after_backward``
    runs between each step's backward and the optimizer step: the aggregator's site hook (FedProx adds its proximal
    term's gradient there, see :meth:`Aggregator.site_gradient_hook`). With a
    ``checkpointer``, resumes from its newest checkpoint and saves one every ``every_steps`` steps and at each
    epoch's end. Returns loss (``loss_sum``/``loss_rows``: over the rows whose loss this rank saw), steps,
    throughput, communication time and the step it resumed from.
    """
    torch.manual_seed(seed)
    dev = next(model.parameters()).device  # cuda:N on GPU sites (nccl), cpu otherwise
    xt = torch.from_numpy(np.ascontiguousarray(x)).to(dev)
    yt = torch.from_numpy(np.ascontiguousarray(y)).to(dev)
    opt = make_optimizer(model, cfg)
    local_batch = max(1, cfg.batch_size // world)
    resumed = checkpointer.restore(model, opt) if checkpointer else None
    start_epoch, start_batch = (resumed["epoch"], resumed["batch"]) if resumed else (0, 0)
    global_step = resumed["global_step"] if resumed else 0
    every = checkpointer.ref.every_steps if checkpointer else 0
    model.train()
    steps, loss_rows, seen, step_time, ckpt_s = 0, 0, 0, 0.0, 0.0
    loss_total = torch.zeros((), dtype=torch.float64, device=dev)
    t_start = time.perf_counter()
    for epoch in range(start_epoch, cfg.local_epochs):
        order = torch.from_numpy(np.random.default_rng([seed, epoch]).permutation(len(xt))).to(dev)
        # Every rank has the same number of rows (load_rank_part), so even the last, partial batch has the
        # same size on every rank and DDP stays in step.
        starts = [i for i in range(0, len(order), local_batch) if not drop_last or i + local_batch <= len(order)]
        for b, i in enumerate(starts):
            if epoch == start_epoch and b < start_batch:
                continue  # done before the checkpoint we resumed from
            idx = order[i : i + local_batch]
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            if step is not None:
                loss = step(xt[idx], yt[idx])
            else:
                loss = loss_fn(model(xt[idx]), yt[idx])
                loss.backward()
            if after_backward is not None:
                after_backward()
            opt.step()
            dt = time.perf_counter() - t0
            steps += 1
            step_time += dt
            if loss is not None:
                # Summed on the device: reading it every step (.item()) would make a GPU wait for each step.
                loss_total += loss.detach().to(torch.float64) * len(idx)
                loss_rows += len(idx)
            seen += len(idx)
            global_step += 1
            if on_step is not None:  # "loss": a 0-d tensor (or nan); read it only when logging
                on_step({"step": float(global_step), "loss": loss.detach() if loss is not None else float("nan"),
                         "step_s": dt})
            end_of_epoch = b == len(starts) - 1
            # No checkpoint after the last step: the round's result is published right after, and a
            # re-run skips rounds whose update is already on the exchange.
            last = end_of_epoch and epoch == cfg.local_epochs - 1
            if checkpointer and not last and (end_of_epoch or (every and global_step % every == 0)):
                nxt = (epoch + 1, 0) if end_of_epoch else (epoch, b + 1)
                c0 = time.perf_counter()
                checkpointer.save(model, opt, {"epoch": nxt[0], "batch": nxt[1], "global_step": global_step})
                ckpt_s += time.perf_counter() - c0
    elapsed = time.perf_counter() - t_start - ckpt_s
    loss_sum = float(loss_total)
    return {
        "train_loss": loss_sum / loss_rows if loss_rows else float("nan"),
        "loss_sum": loss_sum,
        "loss_rows": float(loss_rows),
        "steps": float(steps),
        "samples_per_s": seen * world / elapsed if elapsed > 0 else 0.0,
        "step_time_s": step_time / max(steps, 1),
        "comm_s": comm_seconds() if comm_seconds else 0.0,
        "train_seconds": elapsed,
        "checkpoint_s": ckpt_s,
        "resumed_from_step": float(resumed["global_step"]) if resumed else 0.0,
        "global_steps": float(global_step),
    }
