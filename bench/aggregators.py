"""The aggregators side by side on a simulated federated fraud job: same data, seeds and initial weights.

    .venv/bin/python bench/aggregators.py --out /tmp/aggregators.json     # 3 seeds x 20 rounds, < 1 min

Everything runs in this process (no Prefect, no stores): three sites (eu, us, apac) get the demo's synthetic
fraud data, non-IID by construction (each site its own fraud rate, amount scale, countries and category mix;
here also its own size, 50/30/20 % of the rows, so sample weighting matters). Rows are corrupted, validated and
featurized with the fraud schema of conf/datasets.yaml and split by the platform's keyed hash, as in a job. Each
round every site trains the global model (the built-in tabular_mlp, 64-32, carrying the global feature mean/std)
for one local epoch (Adam, BCE with the global pos_weight, plus the proximal term when the aggregator asks for one
through ``configure``); the aggregator makes the next global model, scored on a pooled test set of every site's
held-out rows (PR-AUC). Per seed the data, initial weights and shuffles change; within a seed every aggregator
starts from the same weights and sees the same batches.

Prints a markdown table: rounds to reach the target PR-AUC (by default 0.9 x FedAvg's best in the same seed's
job; median over seeds, then per seed, "-" for never), final and best PR-AUC (mean ± sd over seeds), wall time.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import average_precision_score
from torch import nn

from insitu.conf import ModelConfig, SchemaConfig, SplitConfig, load_datasets
from insitu.data.features import assign_split, featurize
from insitu.data.schema import validate
from insitu.data.synthetic import generate, inject_malformed
from insitu.federated.aggregators import AGGREGATORS, Aggregator, Update, build_aggregator, proximal_term
from insitu.models import Normalization, build_model

REPO = Path(__file__).resolve().parent.parent
SITES = {"eu": 0.5, "us": 0.3, "apac": 0.2}  # share of the rows
ORDER = ["fedavg", "fedprox", "fedadam", "fedyogi", "fedadagrad", "median", "trimmed_mean"]


@dataclass
class SiteData:
    name: str
    x: torch.Tensor
    y: torch.Tensor


def _site_rows(site: str, rows: int, seed: int, shard: int, schema: SchemaConfig) -> tuple[np.ndarray, ...]:
    """One shard of one site through the platform's own path: corrupt a few rows as `insitu seed` does,
    validate (quarantining them), featurize, split by the keyed hash of the row id."""
    raw, _ = inject_malformed(generate(site, rows, seed, shard=shard), 0.005, seed + shard)
    good, _ = validate(raw, schema)
    x, y = featurize(good, schema)
    return x, y, assign_split(good[schema.id], SplitConfig(), seed)


def make_data(rows: int, test_rows: int, seed: int) -> tuple[list[SiteData], np.ndarray, np.ndarray]:
    """The sites' training rows (shard 0's train split) and a pooled test set (shard 1's test split).

    The test rows come from a shard of their own so that the test set can be larger than the training
    sets: a few hundred fraud cases are needed for a PR-AUC that does not jump by chance between rounds.
    """
    schema = load_datasets(REPO / "conf" / "datasets.yaml", only="fraud").datasets["fraud"].schema_
    sites, test_x, test_y = [], [], []
    for site, share in SITES.items():
        x, y, split = _site_rows(site, int(rows * share), seed, 0, schema)
        sites.append(SiteData(site, torch.from_numpy(x[split == "train"]), torch.from_numpy(y[split == "train"])))
        # Every site equally represented in the test set (as many test rows each): the target is one model
        # that is good everywhere, not on the largest site.
        x, y, split = _site_rows(site, int(test_rows / SplitConfig().test / len(SITES)), seed, 1, schema)
        test_x.append(x[split == "test"])
        test_y.append(y[split == "test"])
    return sites, np.concatenate(test_x), np.concatenate(test_y)


def train_local(model: nn.Module, data: SiteData, site_config: dict[str, float], lr: float, batch: int,
                epochs: int, pos_weight: float, seed: int) -> None:
    reference = {k: v.detach().clone() for k, v in model.named_parameters()}
    mu = site_config.get("proximal_mu", 0.0)
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(pos_weight))
    opt = torch.optim.Adam(model.parameters(), lr=lr)  # a fresh optimiser each round, as on a site
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(data.y), generator=gen).split(batch):
            opt.zero_grad()
            loss = loss_fn(model(data.x[idx]), data.y[idx])
            if mu > 0:
                loss = loss + proximal_term(model, reference, mu)
            loss.backward()
            opt.step()


def pr_auc(model: nn.Module, x: torch.Tensor, y: np.ndarray) -> float:
    model.eval()
    with torch.no_grad():
        return float(average_precision_score(y, model(x).numpy()))


def run(agg: Aggregator, job: Job, args: argparse.Namespace) -> dict:
    """``args.rounds`` rounds of one aggregator from the job's initial weights; PR-AUC after each round."""
    t0 = time.perf_counter()
    global_state = {k: v.clone() for k, v in job.init.items()}
    server_state = None
    curve = []
    for rnd in range(1, args.rounds + 1):
        site_config = agg.configure(rnd)
        updates = []
        for i, site in enumerate(job.sites):
            job.model.load_state_dict(global_state)
            # The same seed per (round, site) for every aggregator: shuffles and dropout masks match.
            seed = job.seed * 100_003 + rnd * 101 + i
            torch.manual_seed(seed)
            train_local(job.model, site, site_config, args.lr, args.batch, args.local_epochs, job.pos_weight, seed)
            updates.append(Update(site.name, {k: v.detach().clone() for k, v in job.model.state_dict().items()},
                                  len(site.y)))
        global_state, server_state = agg.aggregate(rnd, global_state, updates, server_state)
        job.model.load_state_dict(global_state)
        curve.append(pr_auc(job.model, job.test_x, job.test_y))
    return {"aggregator": agg.name, "options": agg.options.model_dump(), "curve": curve,
            "final_pr_auc": curve[-1], "best_pr_auc": max(curve), "wall_s": time.perf_counter() - t0}


@dataclass
class Job:
    """One seed's federated job: the sites' data, the pooled test set, the model and its initial weights."""

    seed: int
    sites: list[SiteData]
    test_x: torch.Tensor
    test_y: np.ndarray
    model: nn.Module
    init: dict[str, torch.Tensor]
    pos_weight: float


def make_job(args: argparse.Namespace, seed: int) -> Job:
    sites, test_x, test_y = make_data(args.rows, args.test_rows, seed)
    pooled = torch.cat([s.x for s in sites])
    # The global mean/std and class balance: what the platform computes from the sites' federated statistics.
    mean, std = pooled.double().mean(0), pooled.double().std(0, unbiased=False).clamp_min(1e-6)
    labels = torch.cat([s.y for s in sites])
    pos_weight = float((labels == 0).sum() / labels.sum().clamp_min(1))
    torch.manual_seed(seed)
    model = build_model(ModelConfig(name="tabular_mlp", hidden=[64, 32], dropout=0.1), pooled.shape[1], 1,
                        Normalization(mean.tolist(), std.tolist()))
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return Job(seed, sites, torch.from_numpy(test_x), test_y, model, init, pos_weight)


def rounds_to(curve: list[float], target: float) -> int | None:
    return next((r for r, v in enumerate(curve, start=1) if v >= target), None)


def parse_options(pairs: list[str]) -> dict[str, dict[str, float]]:
    """``--set fedadam.eta=0.1`` into ``{"fedadam": {"eta": 0.1}}``."""
    out: dict[str, dict[str, float]] = {}
    for p in pairs:
        key, _, value = p.partition("=")
        name, _, option = key.partition(".")
        if not value or not option:
            raise SystemExit(f"--set {p!r}: expected AGGREGATOR.OPTION=VALUE")
        try:
            out.setdefault(name, {})[option] = float(value)
        except ValueError:
            raise SystemExit(f"--set {p!r}: {value!r} is not a number") from None
    return out


def summarise(name: str, runs: list[dict]) -> dict:
    """One aggregator over the seeds: median rounds to target (not reached counts as never), mean PR-AUCs."""
    reached = [r["rounds_to_target"] for r in runs]
    ordered = sorted(reached, key=lambda v: math.inf if v is None else v)
    finals, bests = [r["final_pr_auc"] for r in runs], [r["best_pr_auc"] for r in runs]
    return {"aggregator": name, "rounds_to_target": ordered[(len(ordered) - 1) // 2],
            "rounds_to_target_per_seed": reached,
            "final_pr_auc": statistics.fmean(finals), "final_pr_auc_sd": statistics.pstdev(finals),
            "best_pr_auc": statistics.fmean(bests), "best_pr_auc_sd": statistics.pstdev(bests),
            "wall_s": sum(r["wall_s"] for r in runs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=15_000, help="rows over all sites, before the train/val/test split")
    ap.add_argument("--test-rows", type=int, default=30_000, help="pooled test rows (from other shards)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seeds", type=int, default=3, help="independent jobs (data, initial weights, shuffles)")
    ap.add_argument("--seed", type=int, default=7, help="the first seed; the others follow it")
    ap.add_argument("--aggregators", default=",".join(ORDER))
    ap.add_argument("--set", action="append", default=[], metavar="AGG.OPTION=VALUE",
                    help="an aggregator option, e.g. fedadam.eta=0.1 (repeatable)")
    ap.add_argument("--target", type=float, default=None,
                    help="PR-AUC target; default 0.9 x FedAvg's best PR-AUC in the same seed's job")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="also write the results (with curves) as JSON here")
    ap.add_argument("--smoke", action="store_true", help="tiny run to prove the script works")
    args = ap.parse_args()
    if args.smoke:
        args.rows, args.test_rows, args.rounds, args.seeds = 3000, 1000, 2, 2
    names = [n.strip() for n in args.aggregators.split(",") if n.strip()]
    unknown = [n for n in names if n not in AGGREGATORS]
    if unknown:
        ap.error(f"unknown aggregators {unknown}; known: {list(AGGREGATORS)}")
    if args.target is None and "fedavg" not in names:
        ap.error("the default target is relative to fedavg: run fedavg too, or pass --target")
    options = parse_options(args.set)
    try:  # bad options fail here, before any training
        aggregators = [build_aggregator(n, options.get(n)) for n in names]
    except ValueError as e:
        ap.error(str(e))
    torch.set_num_threads(1)  # what a small site worker gets; also keeps runs comparable across machines

    jobs = []
    for seed in range(args.seed, args.seed + args.seeds):
        job = make_job(args, seed)
        if not jobs:  # untimed warm-up (torch's first-call set-up) so the first timed run is not inflated
            train_local(job.model, SiteData("warm-up", job.sites[0].x[:512], job.sites[0].y[:512]),
                        {"proximal_mu": 0.01}, args.lr, args.batch, 1, job.pos_weight, seed=0)
        results = [run(agg, job, args) for agg in aggregators]
        fedavg_best = next((r["best_pr_auc"] for r in results if r["aggregator"] == "fedavg"), None)
        target = args.target if args.target is not None else 0.9 * fedavg_best
        for r in results:
            r["rounds_to_target"] = rounds_to(r["curve"], target)
        jobs.append({"seed": seed, "target": target, "train_rows": {s.name: len(s.y) for s in job.sites},
                     "test_rows": len(job.test_y), "test_fraud": int(job.test_y.sum()), "results": results})
    summary = [summarise(n, [j["results"][i] for j in jobs]) for i, n in enumerate(names)]

    first = jobs[0]
    targets = ", ".join(f"{j['target']:.3f}" for j in jobs)
    print(f"{len(SITES)} sites (training rows, seed {first['seed']}: {first['train_rows']}; "
          f"{first['test_rows']} pooled test rows, {first['test_fraud'] / first['test_rows']:.1%} fraud), "
          f"{args.rounds} rounds, seeds "
          f"{args.seed}..{args.seed + args.seeds - 1}, target PR-AUC "
          f"{targets} (per seed)\n")
    print("| aggregator | rounds to target (median; per seed) | final PR-AUC | best PR-AUC | wall s |")
    print("|---|---:|---:|---:|---:|")
    for s in summary:
        per = ", ".join("-" if v is None else str(v) for v in s["rounds_to_target_per_seed"])
        median = s["rounds_to_target"] if s["rounds_to_target"] is not None else f"> {args.rounds}"
        print(f"| {s['aggregator']} | {median} ({per}) | {s['final_pr_auc']:.3f} ± {s['final_pr_auc_sd']:.3f} "
              f"| {s['best_pr_auc']:.3f} ± {s['best_pr_auc_sd']:.3f} | {s['wall_s']:.1f} |")
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) if isinstance(v, Path) else v
                                                 for k, v in vars(args).items()},
                                        "summary": summary, "jobs": jobs}, indent=2))


if __name__ == "__main__":
    main()
