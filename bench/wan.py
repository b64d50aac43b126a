"""What a wide-area link costs a job, and what the border relay itself costs.

    .venv/bin/python bench/wan.py --relay-only          # the relay at a zero profile vs direct, on loopback
    .venv/bin/python bench/wan.py                       # + the demo job at RTT 0/20/80/200 ms and 10/100 Mbit/s

``--relay-only``: request/response latency (1 KiB each way, one connection, median of ``--pings``) and the
throughput of one ``--mbytes`` transfer, each direct and through a relay at a zero profile, alternating, in one run.

The job table: a fresh platform (a temporary state directory, free ports) with every site behind a relay; for each
profile, set on every border of the running platform (``insitu wan set``), one demo job runs (``--rounds``,
``--rows`` per site). Per profile: the ``retrain`` run's wall time, the median time between two aggregations
(a round), and the control plane's round trips and bytes per site per round, counted by the relays (the exchange's
store and the Prefect API separately).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deployments.platform.wan_relay import stats_file  # noqa: E402

PROFILES: list[tuple[str, dict[str, float]]] = [
    ("rtt 0 ms", {}), ("rtt 20 ms", {"rtt_ms": 20}), ("rtt 80 ms", {"rtt_ms": 80}), ("rtt 200 ms", {"rtt_ms": 200}),
    ("100 Mbit/s", {"mbit": 100}), ("10 Mbit/s", {"mbit": 10}),
]


# --------------------------------------------------------------------------- the relay alone
async def _serve() -> tuple[asyncio.Server, int]:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            head = await r.read(4)
            if len(head) < 4:
                break
            n = int.from_bytes(head, "big")
            if n == 0:  # a bulk upload follows until EOF; answer with its size
                total = 0
                while chunk := await r.read(1 << 20):
                    total += len(chunk)
                w.write(total.to_bytes(8, "big"))
                await w.drain()
                break
            await r.readexactly(n)
            w.write(b"x" * n)
            await w.drain()
        w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _pings(port: int, n: int) -> list[float]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        w.write((1024).to_bytes(4, "big") + b"y" * 1024)
        await w.drain()
        await r.readexactly(1024)
        out.append((time.perf_counter() - t) * 1000)
    w.close()
    return out


async def _bulk(port: int, nbytes: int) -> float:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    block = os.urandom(1 << 20)
    t = time.perf_counter()
    w.write((0).to_bytes(4, "big"))
    sent = 0
    while sent < nbytes:
        w.write(block)
        await w.drain()
        sent += len(block)
    w.write_eof()
    assert int.from_bytes(await r.readexactly(8), "big") == sent
    took = time.perf_counter() - t
    w.close()
    return sent / took / 1e6


def relay_only(pings: int, mbytes: int, repeat: int) -> dict[str, Any]:
    """Zero-profile relay vs direct: added latency per round trip and throughput ratio (a separate relay process)."""
    import subprocess

    async def main() -> dict[str, Any]:
        server, port = await _serve()
        cfg = Path(tempfile.mkdtemp(prefix="wan-bench-")) / "relay.json"
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            relay_port = s.getsockname()[1]
        cfg.write_text(json.dumps({"listen": [[relay_port, "127.0.0.1", port]], "wan": {}}))
        proc = subprocess.Popen([sys.executable, "-m", "deployments.platform.wan_relay", "--config", str(cfg)],
                                cwd=Path(__file__).resolve().parents[1], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            for _ in range(100):
                try:
                    _, w = await asyncio.open_connection("127.0.0.1", relay_port)
                    w.close()
                    break
                except OSError:
                    await asyncio.sleep(0.1)
            lat: dict[str, list[float]] = {"direct": [], "relay": []}
            thr: dict[str, list[float]] = {"direct": [], "relay": []}
            for _ in range(repeat):  # alternating, so drift of the machine hits both alike
                for name, p in (("direct", port), ("relay", relay_port)):
                    lat[name].append(statistics.median(await _pings(p, pings)))
                    thr[name].append(await _bulk(p, mbytes << 20))
        finally:
            proc.terminate()
            proc.wait(10)
            server.close()
            shutil.rmtree(cfg.parent, ignore_errors=True)
        d_lat, r_lat = statistics.median(lat["direct"]), statistics.median(lat["relay"])
        d_thr, r_thr = statistics.median(thr["direct"]), statistics.median(thr["relay"])
        return {"round_trip_ms_direct": round(d_lat, 3), "round_trip_ms_relay": round(r_lat, 3),
                "relay_adds_ms": round(r_lat - d_lat, 3), "throughput_MBps_direct": round(d_thr, 1),
                "throughput_MBps_relay": round(r_thr, 1), "throughput_ratio": round(r_thr / d_thr, 3)}

    return asyncio.run(main())


# --------------------------------------------------------------------------- the job at each profile
def _traffic(p: Any) -> dict[str, dict[str, dict[str, int]]]:
    out = {}
    for s in p.sites.names:
        f = stats_file(p.borders.config_file(s))
        out[s] = json.loads(f.read_text()) if f.exists() else {}
    return out


def jobs(rows: int, rounds: int, profiles: list[tuple[str, dict[str, float]]]) -> list[dict[str, Any]]:
    from bench.demo_job import prefect_at, seed_and_deploy, start_demo_job, wait_final
    from bench.pipeline_overhead import analyse
    from deployments.platform import REPO, Platform

    state = Path(tempfile.mkdtemp(prefix="insitu-wan-bench-"))
    p = Platform(state, REPO / "conf", free_ports=True)
    p.borders.record({s: {} for s in p.sites.names})
    results = []
    try:
        p.apply_env()
        p.up()
        p.apply_env()
        with prefect_at(p):
            seed_and_deploy(p, rows)
            ports = {str(p.state["ports"][k]): k for k in ("s3-exchange", "prefect")}
            for label, profile in profiles:
                for s in p.sites.names:
                    p.borders.set(s, profile)
                time.sleep(1.5)  # the relays' counters are rewritten every second
                before = _traffic(p)
                fid = start_demo_job(p, rounds, "bench-wan")
                (fr,) = wait_final([fid])
                time.sleep(1.5)
                after = _traffic(p)
                row: dict[str, Any] = {"profile": label, "state": fr.state_name}
                if fr.state.is_completed():
                    a = analyse(str(fid))
                    row.update(job_wall_s=a["wall_s"],
                               median_round_s=statistics.median(r["wall_s"] for r in a["rounds"]))
                per_round: dict[str, dict[str, float]] = {}
                for port, server in ports.items():
                    trips = [after[s].get(port, {}).get("round_trips", 0) - before[s].get(port, {}).get(
                        "round_trips", 0) for s in p.sites.names]
                    sent = [after[s].get(port, {}).get("up_bytes", 0) + after[s].get(port, {}).get("down_bytes", 0)
                            - before[s].get(port, {}).get("up_bytes", 0) - before[s].get(port, {}).get(
                                "down_bytes", 0) for s in p.sites.names]
                    per_round[server] = {"round_trips_per_site_round": round(statistics.mean(trips) / rounds, 1),
                                         "kB_per_site_round": round(statistics.mean(sent) / rounds / 1000, 1)}
                row["control_plane_per_round"] = per_round
                print(json.dumps(row), flush=True)
                results.append(row)
    finally:
        p.down()
        shutil.rmtree(state, ignore_errors=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--relay-only", action="store_true")
    ap.add_argument("--pings", type=int, default=500)
    ap.add_argument("--mbytes", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rows", type=int, default=3000, help="rows per site")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profiles", default=",".join(label for label, _ in PROFILES),
                    help="comma-separated labels of the profiles to run")
    args = ap.parse_args()
    relay = relay_only(args.pings, args.mbytes, args.repeat)
    print(json.dumps({"relay_at_zero_profile": relay}), flush=True)
    if args.relay_only:
        return
    wanted = set(args.profiles.split(","))
    rows = jobs(args.rows, args.rounds, [(label, prof) for label, prof in PROFILES if label in wanted])
    print(json.dumps({"relay_at_zero_profile": relay, "jobs": rows}), flush=True)


if __name__ == "__main__":
    main()
