"""The benchmarks run (at a tiny size): CI proves they work; the numbers in the README come from full runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(script: str, *args: str, tmp: Path) -> object:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}
    out = subprocess.run([sys.executable, str(REPO / "bench" / script), *args], env=env, capture_output=True,
                         text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_ddp_overhead_prints_a_ratio(tmp_path: Path) -> None:
    r = _run("ddp_overhead.py", "--rows", "4000", "--epochs", "1", "--repeat", "1", tmp=tmp_path)
    assert r["insitu_samples_per_s"] > 0 and r["bare_torchrun_samples_per_s"] > 0
    assert 0 < r["throughput_ratio"] < 10


def test_prep_throughput_prints_ratio_and_growth(tmp_path: Path) -> None:
    r = _run("prep_throughput.py", "--rows", "2000", "--shards", "2", "--scales", "1,2", tmp=tmp_path)
    assert [x["rows"] for x in r] == [2000, 4000]
    assert all(x["dask_rows_per_s"] > 0 and x["pandas_rows_per_s"] > 0 for x in r)


def test_aggregators_prints_a_table_and_writes_json(tmp_path: Path) -> None:
    out_file = tmp_path / "aggregators.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    # mu=1: a proximal term strong enough to change the curve, so the configure -> site loop wiring shows.
    out = subprocess.run([sys.executable, str(REPO / "bench" / "aggregators.py"), "--smoke", "--set", "fedprox.mu=1",
                          "--out", str(out_file)], env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    names = ["fedavg", "fedprox", "fedadam", "fedyogi", "fedadagrad", "median", "trimmed_mean"]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "aggregator" not in line]
    assert [r.split("|")[1].strip() for r in rows] == names
    r = json.loads(out_file.read_text())
    assert [s["aggregator"] for s in r["summary"]] == names
    assert len(r["jobs"]) == 2  # --smoke: two seeds of two rounds
    for job in r["jobs"]:
        res = {x["aggregator"]: x for x in job["results"]}
        assert job["target"] == 0.9 * res["fedavg"]["best_pr_auc"]
        assert res["fedprox"]["options"] == {"mu": 1.0}
        assert res["fedprox"]["curve"] != res["fedavg"]["curve"]
        for x in res.values():
            assert len(x["curve"]) == 2 and all(0 < v <= 1 for v in x["curve"])
            reached = [i + 1 for i, v in enumerate(x["curve"]) if v >= job["target"]]
            assert x["rounds_to_target"] == (reached[0] if reached else None)


def test_compression_prints_bytes_and_metric_per_encoding(tmp_path: Path) -> None:
    out_file = tmp_path / "compression.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, str(REPO / "bench" / "compression.py"), "--smoke", "--out", str(out_file)],
                         env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {(r["example"], r["encoding"]): r for r in json.loads(out_file.read_text())["rows"]}
    assert {e for e, _ in rows} == {"fraud", "digits"}
    for example in ("fraud", "digits"):
        assert rows[(example, "none")]["ratio"] > 1.0  # torch.save of the fp32 state: its bytes and a container
        assert 0.24 < rows[(example, "int8")]["ratio"] <= 0.27
        assert 0.49 < rows[(example, "fp16")]["ratio"] < 0.52
        assert rows[(example, "topk 1%")]["ratio"] <= 0.05
    assert "| fraud (" in out.stdout and "| digits (" in out.stdout


def test_coordinator_scale_prints_seconds_and_memory_per_site_count(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, str(REPO / "bench" / "coordinator_scale.py"), "--smoke"], env=env,
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])["rows"]
    assert [(r["sites"], r["aggregator"]) for r in rows] == [(3, "fedavg"), (3, "median"), (8, "fedavg"),
                                                            (8, "median")]
    assert all(r["seconds"] > 0 and r["added_x_model"] >= 0 for r in rows)


def test_strategies_prints_throughput_and_memory_tables(tmp_path: Path) -> None:
    out_file = tmp_path / "strategies.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    # Two strategies: the script's tables and its side-by-side checks; every strategy itself is tested in
    # tests/parallel (the other two cost CI a minute and a half here, mostly process starts).
    tiny = ["--rows", "1024", "--d-model", "16", "--n-heads", "2", "--n-layers", "2", "--batch", "64", "--repeat", "1",
            "--bare-warmup-steps", "0", "--strategies", "ddp,fsdp"]
    out = subprocess.run([sys.executable, str(REPO / "bench" / "strategies.py"), *tiny, "--out", str(out_file)],
                         env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    names = ["ddp", "fsdp"]
    tables = [line for line in out.stdout.splitlines() if line.startswith("| ") and "strategy" not in line
              and "---" not in line]
    assert [r.split("|")[1].strip() for r in tables] == names * 2  # throughput, then memory
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r == json.loads(out_file.read_text())
    rows = {x["strategy"]: x for x in r["strategies"]}
    assert list(rows) == names
    for x in rows.values():
        assert x["insitu_samples_per_s"] > 0 and x["bare_samples_per_s"] > 0
        assert 0 < x["ratio_min"] <= x["ratio_median"] <= x["ratio_max"]
        # Both sides trained the same rows from the same weights: the same loss.
        assert abs(x["insitu_train_loss"] - x["bare_train_loss"]) < 1e-3
        # insitu's strategy and the bare script hold the same tensors on every rank.
        assert x["bytes_per_rank"] == x["bare_bytes_per_rank"]
    ddp = rows["ddp"]["bytes_per_rank_max"]
    assert rows["fsdp"]["bytes_per_rank_max"] < ddp and rows["fsdp"]["target_met"]


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_gpu_check_tiny_runs_on_cpu_under_torchrun(tmp_path: Path, strategy: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    torchrun = str(Path(sys.executable).parent / "torchrun")
    out = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", str(REPO / "bench" / "gpu_check.py"),
                          "--strategy", strategy, "--size", "tiny"],
                         env=env, capture_output=True, text=True, timeout=180, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "tokens/s" in out.stdout and "MFU n/a" in out.stdout
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["strategy"] == strategy and r["ranks"] == 2 and r["backend"] == "gloo"
    assert r["tokens_per_s"] > 0 and r["step_s"] > 0 and r["mfu"] is None
    assert r["tokens_per_s"] == pytest.approx(16 * 2 * 8 / r["step_s"])
    assert r["loss_last"] < r["loss_first"]  # it trains


def test_async_vs_sync_prints_both_modes_at_the_same_versions(tmp_path: Path) -> None:
    rows = _run("async_vs_sync.py", "--smoke", tmp=tmp_path)
    assert isinstance(rows, list) and [r["mode"] for r in rows] == ["sync", "async", "async", "async", "async"]
    assert [r["versions"] for r in rows] == [2, 2, 2, 2, 6]
    sync, *asyncs = rows
    assert sync["applied"] == 2 * 3 and sync["refused"] == 0  # --smoke: 2 rounds of 3 sites
    for r in rows:
        assert r["wall_s"] > 0 and 0 < r["final_pr_auc"] <= 1
    # the slow site (0.3 s per update) sets every sync round's pace; async does not wait for it
    assert sync["wall_s"] >= 2 * 0.3
    assert all(r["wall_s"] < sync["wall_s"] for r in asyncs[:3])


def test_wan_relay_only_prints_added_latency_and_throughput_ratio(tmp_path: Path) -> None:
    r = _run("wan.py", "--relay-only", "--pings", "50", "--mbytes", "16", "--repeat", "1", tmp=tmp_path)
    relay = r["relay_at_zero_profile"]
    assert relay["round_trip_ms_direct"] > 0 and relay["round_trip_ms_relay"] > 0
    assert 0 < relay["throughput_ratio"] < 10


def test_warm_start_prints_cold_and_forked_starts_side_by_side(tmp_path: Path) -> None:
    r = _run("warm_start.py", "--role", "coordinator", "--starts", "1", tmp=tmp_path)
    assert r["modules"][0] == "deployments.runner" and "flows.retrain" in r["modules"]
    assert r["cold_wall_s"] > 0 and r["warm_wall_s"] > 0 and r["fork_server_preload_wall_s"] > 0
    # a fork finds the imports done: it spends less CPU than a new Python importing them
    assert r["warm_cpu_s"] < r["cold_cpu_s"], r
