"""The Flower side of bench/vs_flower.py, run in Flower's own virtual environment (no insitu installed there).

    <flower-venv>/bin/python bench/flower_app.py DATA.npz CONFIG.json     # prints one JSON line

It trains exactly what the insitu job trained: the same sites' prepared train rows, the same initial weights (the
job's round-0 global model, carrying the job's global mean/std), the same tabular MLP, optimiser, batch size,
local epochs, loss (BCE with the job's global pos_weight) and rounds, combined by Flower's own FedAvg under its
simulation engine (one SuperNode per site). Then it scores the final global model on the sites' pooled test rows.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch
from sklearn.metrics import average_precision_score
from torch import nn


class Standardized(nn.Module):
    """insitu's tabular_mlp, by the same parameter names: out_shift + out_scale · core((x − mean) / std)."""

    def __init__(self, n_features: int, hidden: list[int], dropout: float) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(n_features))
        self.register_buffer("std", torch.ones(n_features))
        self.register_buffer("out_shift", torch.tensor(0.0))
        self.register_buffer("out_scale", torch.tensor(1.0))
        layers: list[nn.Module] = []
        width = n_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(dropout)]
            width = h
        layers.append(nn.Linear(width, 1))
        self.core = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.core((x - self.mean) / self.std).squeeze(-1) * self.out_scale + self.out_shift


def main() -> None:
    from flwr.client import ClientApp, NumPyClient
    from flwr.common import Context, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import run_simulation

    with np.load(sys.argv[1]) as npz:  # plain arrays: Ray pickles the client function, and an open file cannot be
        data = {k: npz[k] for k in npz.files}
    cfg = json.loads(open(sys.argv[2], encoding="utf-8").read())
    sites, keys = cfg["sites"], cfg["keys"]
    init = [data[f"init/{k}"] for k in keys]
    final: dict[str, list[np.ndarray]] = {}

    def model() -> Standardized:
        return Standardized(int(data[f"{sites[0]}/x"].shape[1]), cfg["hidden"], cfg["dropout"])

    def set_weights(m: nn.Module, arrays: list[np.ndarray]) -> None:
        m.load_state_dict({k: torch.from_numpy(np.array(a)) for k, a in zip(keys, arrays, strict=True)})

    class Site(NumPyClient):
        def __init__(self, name: str, seed: int) -> None:
            self.name, self.seed = name, seed
            self.x, self.y = torch.from_numpy(data[f"{name}/x"]), torch.from_numpy(data[f"{name}/y"])

        def fit(self, parameters: list[np.ndarray], config: dict) -> tuple[list[np.ndarray], int, dict]:
            torch.set_num_threads(1)
            m = model()
            set_weights(m, parameters)
            rnd = int(config.get("round", 0))
            gen = torch.Generator().manual_seed(self.seed * 1000 + rnd)
            torch.manual_seed(self.seed * 1000 + rnd)
            opt = torch.optim.Adam(m.parameters(), lr=cfg["lr"])
            loss_fn = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(cfg["pos_weight"]))
            m.train()
            for _ in range(cfg["local_epochs"]):
                for idx in torch.randperm(len(self.y), generator=gen).split(cfg["batch_size"]):
                    opt.zero_grad()
                    loss_fn(m(self.x[idx]), self.y[idx]).backward()
                    opt.step()
            return [v.detach().numpy() for v in m.state_dict().values()], len(self.y), {}

    def client_fn(context: Context):  # noqa: ANN202 (Flower's own type)
        i = int(context.node_config["partition-id"])
        return Site(sites[i], cfg["seed"] + i).to_client()

    class KeepFinal(FedAvg):
        def aggregate_fit(self, server_round, results, failures):  # noqa: ANN001, ANN201
            params, metrics = super().aggregate_fit(server_round, results, failures)
            if params is not None:
                final["weights"] = parameters_to_ndarrays(params)
            return params, metrics

    def server_fn(context: Context) -> ServerAppComponents:
        strategy = KeepFinal(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=len(sites),
                             min_available_clients=len(sites), initial_parameters=ndarrays_to_parameters(init),
                             on_fit_config_fn=lambda rnd: {"round": rnd})
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=cfg["rounds"]))

    t0 = time.perf_counter()
    run_simulation(server_app=ServerApp(server_fn=server_fn), client_app=ClientApp(client_fn=client_fn),
                   num_supernodes=len(sites), backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0}})
    wall = time.perf_counter() - t0
    m = model()
    set_weights(m, final["weights"])
    m.eval()
    with torch.no_grad():
        scores = m(torch.from_numpy(data["test/x"])).numpy()
    print(json.dumps({"wall_s": wall, "pr_auc": float(average_precision_score(data["test/y"], scores))}))


if __name__ == "__main__":
    main()
