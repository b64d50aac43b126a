"""The baseline: a bare torchrun DDP script, no insitu code, same model, data, sampler and steps.

    torchrun --standalone --nproc-per-node 2 bench/bare_ddp.py <dir with *.parquet> <batch> <epochs> <seed>
"""

import glob
import json
import sys
import time

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    folder, batch, epochs, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    df = pd.concat([pd.read_parquet(f) for f in sorted(glob.glob(folder + "/*.parquet"))], ignore_index=True)
    y = df.pop("label").to_numpy(np.float32)
    x = df.to_numpy(np.float32)
    per = len(y) // world
    rows = np.arange(rank * per, (rank + 1) * per)  # each rank's contiguous block, as insitu's ranks take
    xt, yt = torch.from_numpy(x[rows]), torch.from_numpy(y[rows])
    torch.manual_seed(0)
    f = x.shape[1]
    model = nn.Sequential(nn.Linear(f, 64), nn.ReLU(), nn.Dropout(0.0), nn.Linear(64, 32), nn.ReLU(),
                          nn.Dropout(0.0), nn.Linear(32, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=0.003)
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(2.0))
    local = batch // world
    seen, t0 = 0, time.perf_counter()
    for epoch in range(epochs):
        order = torch.from_numpy(np.random.default_rng([seed, epoch]).permutation(len(xt)))
        for i in range(0, len(order) - local + 1, local):
            idx = order[i : i + local]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(xt[idx]).squeeze(-1), yt[idx])
            loss.backward()
            opt.step()
            seen += len(idx)
    elapsed = time.perf_counter() - t0
    if rank == 0:
        print(json.dumps({"samples_per_s": seen * world / elapsed, "train_seconds": elapsed}), flush=True)
    dist.barrier()
    del ddp, model, opt
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
