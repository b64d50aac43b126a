"""The WAN relay on its own, on real loopback sockets: bytes intact, latency, bandwidth, loss and cuts as profiled.

Only lower bounds are asserted on time (a link is never faster than its profile); what the relay costs at a zero
profile is measured by ``bench/wan.py``, not asserted here.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deployments.platform.paths import REPO
from deployments.platform.wan_relay import Link, Relay, Wan


async def _echo_server() -> tuple[asyncio.Server, int]:
    """Echoes what it reads; after the client's EOF it sends ``bye`` and closes."""

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
        w.write(b"bye")
        await w.drain()
        w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _relayed(wan: Wan, seed: int = 0) -> tuple[Relay, asyncio.Server]:
    server, port = await _echo_server()
    relay = Relay([(0, "127.0.0.1", port)], Link(wan, seed))
    await relay.start()
    return relay, server


async def _round_trip(port: int, payload: bytes) -> tuple[bytes, float]:
    t = time.perf_counter()
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(payload)
    await w.drain()
    got = await r.readexactly(len(payload))
    w.write_eof()
    tail = await r.read()
    w.close()
    return got + tail, time.perf_counter() - t


def test_bytes_and_half_close_pass_intact_at_a_zero_profile() -> None:
    async def go() -> None:
        relay, server = await _relayed(Wan())
        payload = os.urandom(3 << 20)
        got, _ = await _round_trip(relay.ports[0], payload)
        assert got == payload + b"bye"  # the server answered after the client's half-close, through the relay
        relay.close()
        server.close()

    asyncio.run(go())


def test_latency_is_added_per_round_trip_and_to_the_handshake() -> None:
    async def go() -> None:
        relay, server = await _relayed(Wan(rtt_ms=80))
        r, w = await asyncio.open_connection("127.0.0.1", relay.ports[0])
        times = []
        for _ in range(3):
            t = time.perf_counter()
            w.write(b"ping")
            await w.drain()
            assert await r.readexactly(4) == b"ping"
            times.append(time.perf_counter() - t)
        # the first exchange also waits for the relay's own handshake with the server (one more round trip)
        assert times[0] >= 0.16 and min(times[1:]) >= 0.08, times
        traffic = relay.traffic[relay.routes[0][2]]  # what bench/wan.py reports per round
        assert (traffic.connections, traffic.round_trips, traffic.up_bytes, traffic.down_bytes) == (1, 3, 12, 12)
        w.close()
        relay.close()
        server.close()

    asyncio.run(go())


def test_bandwidth_is_shared_by_every_connection_of_the_link() -> None:
    async def go() -> None:
        relay, server = await _relayed(Wan(mbit=8))  # 1 MB/s each way
        payload = os.urandom(250_000)
        t = time.perf_counter()
        results = await asyncio.gather(*(_round_trip(relay.ports[0], payload) for _ in range(2)))
        took = time.perf_counter() - t
        assert all(got == payload + b"bye" for got, _ in results)
        assert took >= 0.5 * 0.95, took  # 2 x 250 kB through one 1 MB/s wire
        relay.close()
        server.close()

    asyncio.run(go())


def test_loss_delays_a_chunk_by_a_retransmission_timeout() -> None:
    async def go() -> None:
        relay, server = await _relayed(Wan(loss=1.0))  # every chunk loses a segment
        got, took = await _round_trip(relay.ports[0], b"x" * 100)
        assert got == b"x" * 100 + b"bye" and took >= 0.4, took  # there and back, each one RTO late
        relay.close()
        server.close()

    asyncio.run(go())


def test_a_cut_holds_everything_until_the_link_is_restored() -> None:
    async def go() -> None:
        relay, server = await _relayed(Wan())
        r, w = await asyncio.open_connection("127.0.0.1", relay.ports[0])
        w.write(b"before")
        assert await r.readexactly(6) == b"before"
        relay.link.set_cut(True)
        w.write(b"during")
        await w.drain()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(r.readexactly(6), 0.5)
        late = asyncio.create_task(asyncio.open_connection("127.0.0.1", relay.ports[0]))  # a new one waits too
        await asyncio.sleep(0.2)
        relay.link.set_cut(False)
        assert await asyncio.wait_for(r.readexactly(6), 5) == b"during"
        r2, w2 = await asyncio.wait_for(late, 5)
        w2.write(b"after")
        assert await asyncio.wait_for(r2.readexactly(5), 5) == b"after"
        for x in (w, w2):
            x.close()
        relay.close()
        server.close()

    asyncio.run(go())


def test_the_relay_process_cuts_and_restores_on_signals(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    target = socket.create_server(("127.0.0.1", 0))
    target_port = target.getsockname()[1]
    cfg = tmp_path / "relay.json"
    cfg.write_text(json.dumps({"listen": [[port, "127.0.0.1", target_port]], "wan": {"rtt_ms": 0}}))
    proc = subprocess.Popen([sys.executable, "-m", "deployments.platform.wan_relay", "--config", str(cfg)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client = socket.create_connection(("127.0.0.1", port), timeout=1)
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "relay never listened"
                time.sleep(0.1)
        conn, _ = target.accept()
        conn.settimeout(0.5)
        proc.send_signal(signal.SIGUSR1)  # cut
        time.sleep(0.3)
        client.sendall(b"held")
        with pytest.raises(TimeoutError):
            conn.recv(4)
        proc.send_signal(signal.SIGUSR2)  # restore
        conn.settimeout(5)
        assert conn.recv(4) == b"held"
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the counters it keeps beside its configuration, every second
            kept = json.loads(cfg.with_suffix(".traffic.json").read_text())[str(target_port)]
            if kept["up_bytes"] == 4:
                break
            time.sleep(0.2)
        assert kept["connections"] == 1 and kept["up_bytes"] == 4
        client.close()
        conn.close()
    finally:
        proc.terminate()
        proc.wait(10)
        target.close()
