"""insitu against Flower, side by side: the same data, model, optimiser and rounds; wall time and the metric.

    .venv/bin/python bench/vs_flower.py                    # 3 sites × 20,000 rows, 5 rounds: ~8 min on 2 cores
    .venv/bin/python bench/vs_flower.py --smoke            # a tiny job: proves the script works

In one run: a fresh local platform (``Platform.up``) runs the demo job (fraud, 3 sites) as a signed ``retrain``,
with FedAvg and one process per site (``strategy: single``) so that both sides train alike; then Flower 1.42
trains the same sites' *prepared* train rows (read back from each site's store), from the job's own initial
global model, with the same tabular MLP, Adam, batch size, local epochs, BCE with the job's pos_weight and
rounds, under its simulation engine (``flwr.simulation.run_simulation``, one SuperNode per site, in a virtual
environment of its own that the script creates at ``--venv`` the first time: Flower pins other versions of
several of insitu's dependencies). Both final models are scored by PR-AUC, insitu's on each site's test rows
as its job does (the summary's global metric), Flower's on the same rows pooled; they agree when within
``--tolerance``.

Prints a markdown table and one JSON line: insitu's ``retrain`` run wall time and Flower's, their ratio, and
both PR-AUCs. Flower's deployment engine (a SuperLink and SuperNodes as separate processes) is not run here.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.demo_job import prefect_at, seed_and_deploy, wait_final  # noqa: E402
from deployments.platform import Platform  # noqa: E402

FLOWER = ["flwr[simulation]==1.42.0", "torch==2.13.0", "scikit-learn", "numpy"]
SITES = ["eu", "us", "apac"]
TRAINING = "vs-flower"


def ensure_venv(venv: Path) -> Path:
    """Flower's own virtual environment (created and filled once); its python."""
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([str(python), "-c", "import flwr, ray, torch, sklearn"],
                                          capture_output=True, check=False).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *FLOWER], check=True)
    return python


def training_config(conf: Path, rounds: int) -> dict:
    """The demo's training config, combined by FedAvg with one process per site (as Flower's clients train)."""
    cfg = yaml.safe_load((conf / "training" / "fraud.yaml").read_text())
    cfg.update({"rounds": rounds, "aggregator": "fedavg", "strategy": "single", "ranks_per_site": 1,
                "registry": {"model_name": "insitu-vs-flower"}})
    # every round runs and the last one is the model, as in Flower
    cfg["validation"] = {**cfg.get("validation", {}), "patience": 0, "select": "last"}
    (conf / "training" / f"{TRAINING}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return cfg


def run_insitu(p: Platform, rows: int, rounds: int) -> dict:
    from prefect.client.orchestration import get_client

    from insitu.governance.request import sign_for

    with prefect_at(p):
        seed_and_deploy(p, rows)
        job = f"vs-flower-{uuid.uuid4().hex[:6]}"
        request = sign_for(p.principal_key_file("alice"), "alice", TRAINING, "fraud", "fraud-detection", job_id=job,
                           conf_directory=p.conf_dir).model_dump(mode="json")
        params = {"training": TRAINING, "dataset": "fraud", "job_id": job, "request": request}
        t0 = time.perf_counter()
        with get_client(sync_client=True) as c:
            dep = c.read_deployment_by_name("retrain/coordinator")
            run_id = c.create_flow_run_from_deployment(dep.id, parameters={"params": params}).id
        (run,) = wait_final([run_id], poll_s=1.0)
        submitted_to_final = time.perf_counter() - t0
    if not run.state.is_completed():
        raise SystemExit(f"the insitu job {job} ended {run.state.type}: {run.state.message}")
    return {"job_id": job, "wall_s": (run.end_time - run.start_time).total_seconds(),
            "submitted_to_final_s": submitted_to_final}


def job_data(p: Platform, job: str, out: Path) -> dict:
    """What the insitu job trained from, for Flower: each site's prepared train rows, the pooled test rows, the
    round-0 global model and the job's pos_weight; and the job's final PR-AUC."""
    from insitu.data.loader import load_split
    from insitu.federated.exchange import Exchange
    from insitu.federated.kinds import COORDINATOR
    from insitu.federated.paths import GLOBAL_STATS, SUMMARY, global_weights
    from insitu.storage import Store

    ex = Exchange(Store("s3://insitu-exchange/", p.storage_options("exchange", COORDINATOR)), job, COORDINATOR)
    init, _ = ex.get_state(global_weights(0), writer=COORDINATOR)
    stats = ex.get_json(GLOBAL_STATS, writer=COORDINATOR)
    summary = ex.get_json(SUMMARY, writer=COORDINATOR)
    arrays: dict[str, np.ndarray] = {f"init/{k}": v.numpy() for k, v in init.items()}
    tests_x, tests_y = [], []
    for s in SITES:
        store = Store(f"s3://insitu-{s}/", p.storage_options(s, s))
        arrays[f"{s}/x"], arrays[f"{s}/y"] = load_split(store, "fraud", job, "train")
        x, y = load_split(store, "fraud", job, "test")
        tests_x.append(x)
        tests_y.append(y)
    arrays["test/x"], arrays["test/y"] = np.concatenate(tests_x), np.concatenate(tests_y)
    np.savez(out, **arrays)
    return {"keys": list(init), "pos_weight": float(stats["loss_params"]["pos_weight"]),
            "pr_auc": float(summary["global_metrics"]["pr_auc"]),
            "train_rows": {s: int(len(arrays[f"{s}/y"])) for s in SITES}, "test_rows": int(len(arrays["test/y"]))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20_000, help="rows per site")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--venv", type=Path, default=REPO / ".bench" / "flower-venv")
    ap.add_argument("--tolerance", type=float, default=0.05, help="PR-AUCs agree within this")
    ap.add_argument("--smoke", action="store_true", help="tiny job (2,000 rows per site, 1 round)")
    args = ap.parse_args()
    if args.smoke:
        args.rows, args.rounds = 2000, 1
    python = ensure_venv(args.venv)
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "conf"
        shutil.copytree(REPO / "conf", conf)
        cfg = training_config(conf, args.rounds)
        p = Platform(Path(tmp) / "state", conf, free_ports=True)
        p.apply_env()  # the operator's variables: each site's store keys to seed it, the exchange's to read it
        p.up()
        p.apply_env()
        try:
            ours = run_insitu(p, args.rows, args.rounds)
            data = job_data(p, ours["job_id"], Path(tmp) / "data.npz")
        finally:
            p.down()
        flower_cfg = {"sites": SITES, "keys": data["keys"], "hidden": cfg["model"]["hidden"],
                      "dropout": cfg["model"]["dropout"], "lr": cfg["optimizer"]["lr"],
                      "batch_size": cfg["batch_size"], "local_epochs": cfg["local_epochs"], "rounds": args.rounds,
                      "pos_weight": data["pos_weight"], "seed": cfg["seed"]}
        (Path(tmp) / "flower.json").write_text(json.dumps(flower_cfg))
        t0 = time.perf_counter()
        out = subprocess.run([str(python), str(REPO / "bench" / "flower_app.py"), str(Path(tmp) / "data.npz"),
                              str(Path(tmp) / "flower.json")], capture_output=True, text=True, check=False, cwd=tmp)
        process_s = time.perf_counter() - t0
        if out.returncode != 0:
            raise SystemExit(out.stderr[-4000:])
        flower = json.loads(out.stdout.strip().splitlines()[-1])
    result = {"rows_per_site": args.rows, "rounds": args.rounds, "train_rows": data["train_rows"],
              "test_rows": data["test_rows"], "insitu_wall_s": ours["wall_s"],
              "insitu_submitted_to_final_s": ours["submitted_to_final_s"], "flower_sim_wall_s": flower["wall_s"],
              "flower_process_s": process_s, "ratio": ours["wall_s"] / flower["wall_s"],
              "insitu_pr_auc": data["pr_auc"], "flower_pr_auc": flower["pr_auc"],
              "agree": abs(data["pr_auc"] - flower["pr_auc"]) <= args.tolerance}
    print(f"| | insitu (platform, retrain run) | Flower 1.42 (simulation engine) | ratio |\n|---|---:|---:|---:|\n"
          f"| wall time | {result['insitu_wall_s']:.1f} s | {result['flower_sim_wall_s']:.1f} s | "
          f"{result['ratio']:.1f} × |\n| PR-AUC | {result['insitu_pr_auc']:.4f} | {result['flower_pr_auc']:.4f} | "
          f"agree within {args.tolerance}: {result['agree']} |")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
