"""Lean updates: bytes on the wire and the final metric of every update encoding, side by side, on the demo's
fraud data and on the digits example.

    .venv/bin/python bench/compression.py                      # fraud 3 seeds x 20 rounds + digits 3 x 10, ~2 min
    .venv/bin/python bench/compression.py --smoke              # a tiny run that proves the script works

Everything runs in this process (no Prefect, no stores), with the code a job runs: each round every site trains
the global model (as in bench/aggregators.py for fraud: tabular_mlp 64-32, Adam, BCE with the global
pos_weight; for digits: the example's tabular_mlp 64, Adam lr 0.01, 2 local epochs, label-skewed sites), encodes
its update with :class:`insitu.federated.codecs.UpdateEncoding` (keeping its own residual for error feedback),
and the coordinator decodes and averages them (FedAvg). The bytes are the real wire bytes: ``torch.save`` of the
state dict for ``none`` (what crosses today), the safetensors payload otherwise. Within a seed every encoding
starts from the same weights and sees the same batches.

Prints a markdown table: bytes per site per round ÷ the fp32 model's bytes, the final metric (fraud: PR-AUC on a
pooled test set; digits: macro-F1), and its change against ``none`` in points (mean over seeds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import f1_score
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.aggregators import make_job, pr_auc, train_local  # noqa: E402
from insitu.conf import CompressionConfig, ModelConfig  # noqa: E402
from insitu.data.digits import digits_frames  # noqa: E402
from insitu.federated.aggregators import FedAvg, Update  # noqa: E402
from insitu.federated.codecs import UpdateEncoding, build_encoding  # noqa: E402
from insitu.federated.state_bytes import payload_to_bytes, state_to_bytes  # noqa: E402
from insitu.models import Normalization, build_model  # noqa: E402

ENCODINGS: dict[str, dict] = {
    "none": {"encoding": "none"},
    "fp16": {"encoding": "fp16"},
    "bf16": {"encoding": "bf16"},
    "int8": {"encoding": "int8"},
    "int8 channel": {"encoding": "int8", "options": {"scale": "channel"}},
    "int8 no-delta": {"encoding": "int8", "delta": False, "error_feedback": False},
    "topk 10%": {"encoding": "topk", "options": {"fraction": 0.1}},
    "topk 1%": {"encoding": "topk", "options": {"fraction": 0.01}},
    "topk 1% no-EF": {"encoding": "topk", "options": {"fraction": 0.01}, "error_feedback": False},
}


@dataclass
class Site:
    name: str
    x: torch.Tensor
    y: torch.Tensor


@dataclass
class Example:
    """One seed's federated job of one example: sites, pooled test set, model, its initial weights, training."""

    name: str
    metric: str
    sites: list[Site]
    test_x: torch.Tensor
    test_y: np.ndarray
    model: nn.Module
    init: dict[str, torch.Tensor]
    rounds: int
    seed: int

    def train(self, site: Site, seed: int) -> None: ...

    def score(self) -> float: ...


class Fraud(Example):
    pos_weight: float
    args: argparse.Namespace

    def train(self, site: Site, seed: int) -> None:
        train_local(self.model, site, {}, self.args.lr, self.args.batch, 1, self.pos_weight, seed)  # type: ignore[arg-type]

    def score(self) -> float:
        return pr_auc(self.model, self.test_x, self.test_y)


class Digits(Example):
    def train(self, site: Site, seed: int) -> None:
        opt = torch.optim.Adam(self.model.parameters(), lr=0.01)
        gen = torch.Generator().manual_seed(seed)
        self.model.train()
        for _ in range(2):
            for idx in torch.randperm(len(site.y), generator=gen).split(64):
                opt.zero_grad()
                nn.functional.cross_entropy(self.model(site.x[idx]), site.y[idx]).backward()
                opt.step()

    def score(self) -> float:
        self.model.eval()
        with torch.no_grad():
            pred = self.model(self.test_x).argmax(1).numpy()
        return float(f1_score(self.test_y, pred, average="macro"))


def fraud(args: argparse.Namespace, seed: int) -> Example:
    job = make_job(args, seed)
    ex = Fraud("fraud", "PR-AUC", [Site(s.name, s.x, s.y) for s in job.sites], job.test_x, job.test_y, job.model,
               job.init, args.rounds, seed)
    ex.pos_weight, ex.args = job.pos_weight, args
    return ex


def digits(args: argparse.Namespace, seed: int) -> Example:
    sites, test_x, test_y = [], [], []
    rng = np.random.default_rng(seed)
    for name, frame in digits_frames(seed).items():
        x = frame[[c for c in frame.columns if c.startswith("pixel_")]].to_numpy(np.float32)
        y = frame["digit"].astype(int).to_numpy()
        test = rng.random(len(y)) < 0.15
        sites.append(Site(name, torch.from_numpy(x[~test]), torch.from_numpy(y[~test])))
        test_x.append(x[test])
        test_y.append(y[test])
    pooled = torch.cat([s.x for s in sites]).double()
    torch.manual_seed(seed)
    std = torch.where(pooled.std(0) > 0, pooled.std(0), 1.0)  # a pixel never inked: left as it is
    model = build_model(ModelConfig(name="tabular_mlp", hidden=[64], dropout=0.0), 64, 10,
                        Normalization(pooled.mean(0).tolist(), std.tolist()))
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return Digits("digits", "macro-F1", sites, torch.from_numpy(np.concatenate(test_x)), np.concatenate(test_y),
                  model, init, args.digits_rounds, seed)


def run(ex: Example, encoding: UpdateEncoding | None) -> dict:
    """Every round of one job with one encoding: the sites' mean wire bytes per round and the final metric."""
    global_state = {k: v.clone() for k, v in ex.init.items()}
    residuals: dict[str, torch.Tensor | None] = {s.name: None for s in ex.sites}
    sent = []
    for rnd in range(ex.rounds):
        updates = []
        for i, site in enumerate(ex.sites):
            ex.model.load_state_dict(global_state)
            seed = ex.seed * 100_003 + rnd * 101 + i
            torch.manual_seed(seed)
            ex.train(site, seed)
            trained = {k: v.detach().clone() for k, v in ex.model.state_dict().items()}
            if not all(bool(torch.isfinite(v).all()) for v in trained.values()):
                # What a site's own check refuses before publishing: the job would fail here.
                return {"ratio": statistics.mean(sent) / _fp32(global_state), "bytes": statistics.mean(sent),
                        "fp32_bytes": _fp32(global_state), "metric": float("nan"), "failed_round": rnd}
            if encoding is None:
                sent.append(len(state_to_bytes(trained)))
                received = trained
            else:
                payload, residuals[site.name] = encoding.encode(trained, global_state, residuals[site.name])
                sent.append(len(payload_to_bytes(payload)))
                received = encoding.decode(payload, global_state)
            updates.append(Update(site.name, received, len(site.y)))
        global_state, _ = FedAvg().aggregate(rnd, global_state, updates, None)
    ex.model.load_state_dict(global_state)
    fp32 = _fp32(global_state)
    return {"ratio": statistics.mean(sent) / fp32, "bytes": statistics.mean(sent), "fp32_bytes": fp32,
            "metric": ex.score()}


def _fp32(state: dict[str, torch.Tensor]) -> int:
    return sum(v.numel() * 4 for v in state.values() if v.is_floating_point())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=15_000, help="fraud: rows over all sites")
    ap.add_argument("--test-rows", type=int, default=30_000, help="fraud: pooled test rows")
    ap.add_argument("--rounds", type=int, default=20, help="fraud rounds")
    ap.add_argument("--digits-rounds", type=int, default=10)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    ap.add_argument("--smoke", action="store_true", help="tiny run to prove the script works")
    args = ap.parse_args()
    if args.smoke:
        args.rows, args.test_rows, args.rounds, args.digits_rounds, args.seeds = 3000, 1000, 2, 2, 1
    torch.set_num_threads(1)
    encodings = {name: build_encoding(CompressionConfig(**conf)) for name, conf in ENCODINGS.items()}
    results: dict[str, dict[str, list[dict]]] = {}
    for make in (fraud, digits):
        for seed in range(args.seed, args.seed + args.seeds):
            ex = make(args, seed)
            for name, enc in encodings.items():
                results.setdefault(ex.name, {}).setdefault(name, []).append(run(ex, enc))
    rows = []
    print("| example | encoding | bytes ÷ fp32 model | final metric | vs none (points) |")
    print("|---|---|---|---|---|")
    for example, by_enc in results.items():
        base = statistics.mean(r["metric"] for r in by_enc["none"])
        metric = "PR-AUC" if example == "fraud" else "macro-F1"
        for name, runs in by_enc.items():
            failed = [r["failed_round"] for r in runs if "failed_round" in r]
            if failed:  # NaN weights: a site's check refuses the update, the job fails
                print(f"| {example} | {name} | {statistics.mean(r['ratio'] for r in runs):.3f} | fails: NaN "
                      f"weights in round {min(failed)} ({len(failed)} of {len(runs)} seeds) | - |")
                rows.append({"example": example, "encoding": name, "failed_rounds": failed})
                continue
            m = statistics.mean(r["metric"] for r in runs)
            ratio = statistics.mean(r["ratio"] for r in runs)
            rows.append({"example": example, "encoding": name, "ratio": ratio, "metric": m,
                         "delta_points": 100 * (m - base), "fp32_bytes": runs[0]["fp32_bytes"]})
            print(f"| {example} ({runs[0]['fp32_bytes']:,} B fp32) | {name} | {ratio:.3f} | {metric} {m:.4f} | "
                  f"{100 * (m - base):+.2f} |")
    print(f"fraud: {args.rounds} rounds, {args.rows:,} rows; digits: {args.digits_rounds} rounds; seeds "
          f"{args.seed}..{args.seed + args.seeds - 1}; FedAvg; mean over seeds")
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
