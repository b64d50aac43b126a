"""The coordinator with many sites: memory and seconds of one round at 3, 16, 64 and 256 sites.

    .venv/bin/python bench/coordinator_scale.py                       # ~4M-parameter model, int8 updates, ~5 min
    .venv/bin/python bench/coordinator_scale.py --smoke               # tiny, proves the script works

The sites are simulated as what the coordinator sees of them: writers of real encoded updates (int8, delta, by
:class:`insitu.federated.codecs.UpdateEncoding`, through :class:`insitu.federated.exchange.Exchange`) to an S3
endpoint over the network (the platform's own, moto in server mode, in a subprocess). The coordinator's code is
unchanged: each measurement is one call of :func:`insitu.federated.rounds.run_round` in a fresh process (its
peak RSS is then its own), which collects the updates, enforces the byte budgets, reads, decodes and checks
every update, aggregates and publishes the next global model. FedAvg folds each update into a running mean as
it reads it; the coordinate-wise median needs every update at once (measured up to ``--median-max`` sites).

Prints one JSON line per measurement and a markdown table: seconds per round, seconds per site, and the peak
memory the round added to the process (peak RSS − RSS before the round) as a multiple of the fp32 model.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from insitu.federated.aggregators import build_aggregator  # noqa: E402
from insitu.federated.codecs import UpdateEncoding, build_codec  # noqa: E402
from insitu.federated.exchange import Exchange  # noqa: E402
from insitu.federated.rounds import run_round  # noqa: E402
from insitu.storage import Store  # noqa: E402
from tests.s3_endpoint import S3Endpoint  # noqa: E402

BUCKET = "scale-exchange"
ENCODING = UpdateEncoding(build_codec("int8"))


def model(width: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"l1.weight": torch.randn(2 * width, width, generator=g) * 0.02, "l1.bias": torch.zeros(2 * width),
            "l2.weight": torch.randn(width, 2 * width, generator=g) * 0.02, "l2.bias": torch.zeros(width),
            "steps": torch.tensor(0)}


def store(url: str) -> Store:
    return Store(f"s3://{BUCKET}/", {"key": "bench", "secret": "bench", "client_kwargs": {"endpoint_url": url}})


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()


def reset_peak() -> None:
    """Start the kernel's peak-RSS count (VmHWM) afresh: the warm-up's own peak is not the round's (Linux)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def publish(url: str, job: str, sites: list[str], width: int) -> None:
    """The global model of round 0, and every site's int8 update of it."""
    g0 = model(width)
    Exchange(store(url), job, "coordinator").put_state("weights", "round-0000", g0, round=0)
    base = Exchange(store(url), job, "coordinator").get_json("weights", "round-0000.manifest.json")["sha256"]
    for i, s in enumerate(sites):
        g = torch.Generator().manual_seed(i + 1)
        trained = {k: v + 1e-3 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v + 1
                   for k, v in g0.items()}
        payload, _ = ENCODING.encode(trained, g0)
        Exchange(store(url), job, s).put_state("update", "round-0000", payload, reference=g0, encoding=ENCODING,
                                               n_samples=100 + i, round=0, base_sha256=base)


def coordinate(url: str, job: str, sites: list[str], aggregator: str) -> dict:
    """One round as the coordinator runs it; in its own process (see main)."""
    ex = Exchange(store(url), job, "coordinator")
    # Warm-up, untimed: the imports, the S3 client and its connection pool, the allocator's first arenas (what any
    # coordinator has paid before its first round) are not the round's.
    g0, _ = ex.get_state("weights", "round-0000", "coordinator")
    ex.get_state("update", "round-0000", sites[0], reference=g0, encoding=ENCODING)
    ex.ledger()
    del g0
    gc.collect()
    before = rss_bytes()
    reset_peak()
    t0 = time.perf_counter()
    res = run_round(ex, 0, sites, min_sites=len(sites), deadline_s=60, aggregator=build_aggregator(aggregator),
                    encoding=ENCODING)
    seconds = time.perf_counter() - t0
    peak = peak_bytes()
    assert res.sites == sites, res
    return {"seconds": seconds, "added_bytes": max(0, peak - before)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sites", default="3,16,64,256")
    ap.add_argument("--width", type=int, default=1024, help="model: 2 layers of width x 2*width (~4.2M at 1024)")
    ap.add_argument("--median-max", type=int, default=64, help="the median holds every update: up to this many")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--coordinate", nargs=3, metavar=("URL", "JOB", "AGG"), help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.coordinate:  # the child: one round, measured
        url, job, agg = args.coordinate
        print(json.dumps(coordinate(url, job, [f"s{i:03d}" for i in range(args.n)], agg)))
        return
    if args.smoke:
        args.sites, args.width, args.median_max = "3,8", 64, 8
    counts = [int(n) for n in args.sites.split(",")]
    fp32 = sum(v.numel() * 4 for v in model(args.width).values() if v.is_floating_point())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        endpoint = S3Endpoint(Path(tmp) / "s3.log", None)
        try:
            import s3fs

            s3fs.S3FileSystem(key="bench", secret="bench", client_kwargs={"endpoint_url": endpoint.url}).mkdir(BUCKET)
            for n in counts:
                sites = [f"s{i:03d}" for i in range(n)]
                for agg in ("fedavg", "median"):
                    if agg == "median" and n > args.median_max:
                        continue
                    job = f"scale-{agg}-{n}"
                    publish(endpoint.url, job, sites, args.width)
                    out = subprocess.run([sys.executable, __file__, "--coordinate", endpoint.url, job, agg,
                                          "--n", str(n)], capture_output=True, text=True, check=False)
                    if out.returncode != 0:
                        raise SystemExit(out.stderr[-3000:])
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                    row = {"sites": n, "aggregator": agg, "seconds": r["seconds"], "s_per_site": r["seconds"] / n,
                           "added_x_model": r["added_bytes"] / fp32, "model_fp32_bytes": fp32}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
        finally:
            endpoint.stop()
    print(f"\nmodel {fp32 / 2**20:.1f} MiB fp32; updates int8 delta ({fp32 / 4 / 2**20:.1f} MiB each)")
    print("| sites | aggregator | s per round | s per site | memory added ÷ fp32 model |")
    print("|---:|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['sites']} | {r['aggregator']} | {r['seconds']:.2f} | {r['s_per_site']:.3f} | "
              f"{r['added_x_model']:.2f} |")
    print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
