"""A wide-area link in user space: a TCP relay that adds a region's latency, bandwidth, loss and cuts.

This kernel has no ``netem`` qdisc, so a border's WAN profile is played by a relay the border's traffic passes
through: each listening port forwards to one target (the exchange's store, the Prefect API) and each byte is
delivered one way's latency (``rtt_ms / 2``) after it was read, after the bytes before it have been serialised at
``mbit`` (shared by every connection of the link, per direction, as on a real link). ``loss`` is what loss costs a
TCP stream, not lost bytes: a chunk that would have lost one of its segments arrives one retransmission timeout
late (``max(200 ms, rtt)``, Linux's minimum RTO). A cut holds every byte in both directions (no reset: what a
pulled cable does) until the link is restored; connections made during a cut wait too. ``SIGUSR1`` cuts the link,
``SIGUSR2`` restores it, ``SIGHUP`` re-reads the profile. What crossed each route (connections, bytes, round trips)
is rewritten every second beside the configuration (``<config>.traffic.json``).

At a zero profile a chunk is written on as soon as it is read (no timer, no queue): the relay's cost is one more
loopback hop (``bench/wan.py`` and ``tests/unit/test_wan_relay.py`` measure it).

    python -m deployments.platform.wan_relay --config relay.json
    {"listen": [[port, "127.0.0.1", target_port], ...], "bind": "127.0.0.1",
     "wan": {"rtt_ms": 80, "mbit": 50, "loss": 0.001}}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import random
import signal
from collections import deque
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SEGMENT = 1448  # bytes of payload per TCP segment on a 1500-byte MTU
MIN_RTO_S = 0.2
HIGH_WATER = 4 << 20  # bytes queued or buffered per direction before the sender is paused


@dataclass(frozen=True)
class Wan:
    """A link's profile: round-trip latency (ms), bandwidth (Mbit/s, ``None``: unlimited) and segment loss."""

    rtt_ms: float = 0.0
    mbit: float | None = None
    loss: float = 0.0

    @property
    def zero(self) -> bool:
        return self.rtt_ms == 0 and self.mbit is None and self.loss == 0

    @classmethod
    def of(cls, d: dict[str, float | None] | None) -> Wan:
        d = d or {}
        mbit = d.get("mbit")
        return cls(float(d.get("rtt_ms") or 0.0), float(mbit) if mbit else None, float(d.get("loss") or 0.0))


class Link:
    """One border: its profile, whether it is cut, and when each direction's wire is free again."""

    def __init__(self, wan: Wan, seed: int | None = None) -> None:
        self.wan = wan
        self.cut = False
        self.free_at = {"up": 0.0, "down": 0.0}
        self.rng = random.Random(seed)
        self.waiting: set[Direction] = set()  # directions holding bytes while the link is cut

    def due(self, direction: str, n: int, now: float) -> float:
        """When ``n`` bytes read now arrive at the other end."""
        w = self.wan
        start = now
        if w.mbit:
            start = max(now, self.free_at[direction])
            self.free_at[direction] = start + n * 8 / (w.mbit * 1e6)
            start = self.free_at[direction]
        late = 0.0
        if w.loss and self.rng.random() < 1 - (1 - w.loss) ** math.ceil(n / SEGMENT):
            late = max(MIN_RTO_S, w.rtt_ms / 1000)
        return start + w.rtt_ms / 2000 + late

    def set_cut(self, cut: bool) -> None:
        self.cut = cut
        if not cut:
            for d in list(self.waiting):
                d.flush()
            self.waiting.clear()


class Direction:
    """Bytes from one side of a relayed connection to the other, delivered in order when due."""

    def __init__(self, link: Link, name: str, loop: asyncio.AbstractEventLoop) -> None:
        self.link, self.name, self.loop = link, name, loop
        self.dst: asyncio.Transport | None = None
        self.src: asyncio.Transport | None = None
        self.queue: deque[tuple[float, bytes]] = deque()
        self.queued = 0
        self.timer: asyncio.TimerHandle | None = None
        self.eof = False  # the sender is done: end the receiver once the queue is delivered
        self.full_close = False  # ... by closing it (the sender's connection is gone), not by a half-close
        self.finished = False  # the receiver has been ended
        self.other: Direction | None = None  # the opposite direction of the same connection
        self.paused = False

    def send(self, data: bytes) -> None:
        if self.dst is not None and self.link.wan.zero and not self.link.cut and not self.queue:
            self.dst.write(data)
            self._throttle()
            return
        self.queue.append((self.link.due(self.name, len(data), self.loop.time()), data))
        self.queued += len(data)
        self._throttle()
        self._schedule()

    def close_after(self, full: bool) -> None:
        """The sender is done (``full``: its connection is gone): end the receiver once the queue is delivered."""
        self.eof = True
        self.full_close = self.full_close or full
        self.flush()

    def _finish(self) -> None:
        if self.dst is None or self.dst.is_closing():
            return
        self.finished = True
        if self.full_close or not self.dst.can_write_eof() or (self.other is not None and self.other.finished):
            self.dst.close()  # nothing more either way: close, do not leave it to the garbage collector
            if self.src is not None and not self.src.is_closing() and (self.other is None or self.other.finished):
                self.src.close()
            return
        try:
            self.dst.write_eof()
        except OSError:  # the receiver already went away
            self.dst.close()

    def _schedule(self) -> None:
        if self.timer is not None or not self.queue or self.dst is None:
            return
        if self.link.cut:
            self.link.waiting.add(self)
            return
        self.timer = self.loop.call_at(self.queue[0][0], self._deliver)

    def flush(self) -> None:
        """Deliver what is due now and schedule the rest (after the receiver connected, or the link came back)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.queue:
            self._schedule()
        elif self.eof and self.link.cut:  # an end is held by a cut like any byte
            self.link.waiting.add(self)
        elif self.eof:
            self._finish()

    def _deliver(self) -> None:
        self.timer = None
        if self.dst is None or self.dst.is_closing():
            self.queue.clear()
            return
        if self.link.cut:
            self.link.waiting.add(self)
            return
        now = self.loop.time()
        while self.queue and self.queue[0][0] <= now + 0.0005:
            _, data = self.queue.popleft()
            self.queued -= len(data)
            self.dst.write(data)
        self._throttle()
        self.flush()  # the rest when due; the end once nothing is left

    def _throttle(self) -> None:
        """Pause the sender while too much is queued or buffered towards a slow receiver; resume below half."""
        if self.src is None or self.dst is None:
            return
        held = self.queued + self.dst.get_write_buffer_size()
        if not self.paused and held > HIGH_WATER:
            self.paused = True
            self.src.pause_reading()
        elif self.paused and held < HIGH_WATER // 2:
            self.paused = False
            self.src.resume_reading()


@dataclass
class Traffic:
    """What crossed one route of the border: connections, bytes each way, and round trips (a request answered: the
    bytes of a connection turning from up to down), which is what latency is paid on."""

    connections: int = 0
    up_bytes: int = 0
    down_bytes: int = 0
    round_trips: int = 0


class Conn:
    """One relayed connection's route and which way its bytes went last."""

    def __init__(self, traffic: Traffic) -> None:
        self.traffic = traffic
        self.last = ""

    def saw(self, direction: str, n: int) -> None:
        t = self.traffic
        if direction == "up":
            t.up_bytes += n
        else:
            t.down_bytes += n
            if self.last == "up":
                t.round_trips += 1
        self.last = direction


class Side(asyncio.Protocol):
    """One end of a relayed connection: what it reads goes out through ``out``."""

    def __init__(self, out: Direction, back: Direction, conn: Conn) -> None:
        self.out, self.back, self.conn = out, back, conn
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.out.src = self.transport
        self.back.dst = self.transport
        self.back.flush()

    def data_received(self, data: bytes) -> None:
        self.conn.saw(self.out.name, len(data))
        self.out.send(data)

    def eof_received(self) -> bool:
        self.out.close_after(full=False)
        return True  # keep our half open: the other direction may still be sending

    def resume_writing(self) -> None:
        self.back._throttle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.out.close_after(full=True)


class Relay:
    """Listens on each ``(port, host, target_port)`` and relays to ``host:target_port`` through one ``Link``."""

    def __init__(self, routes: list[tuple[int, str, int]], link: Link, bind: str = "127.0.0.1") -> None:
        self.routes = routes
        self.bind = bind
        self.link = link
        self.servers: list[asyncio.Server] = []
        self.traffic = {target: Traffic() for _, _, target in routes}  # by target port
        self._connecting: set[asyncio.Task[None]] = set()  # held: the loop keeps only weak references to tasks

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for port, host, target in self.routes:
            self.servers.append(await loop.create_server(lambda h=host, t=target: self._accept(h, t), self.bind,
                                                         port, reuse_address=True))

    def _accept(self, host: str, target: int) -> Side:
        loop = asyncio.get_running_loop()
        up, down = Direction(self.link, "up", loop), Direction(self.link, "down", loop)
        up.other, down.other = down, up
        conn = Conn(self.traffic[target])
        conn.traffic.connections += 1
        client = Side(up, down, conn)
        task = loop.create_task(self._connect(client, host, target, up, down, conn))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)
        return client

    async def _connect(self, client: Side, host: str, target: int, up: Direction, down: Direction,
                       conn: Conn) -> None:
        loop = asyncio.get_running_loop()
        while self.link.cut:  # a connection made during a cut waits for the link, as a SYN retried would
            await asyncio.sleep(0.05)
        if self.link.wan.rtt_ms:
            await asyncio.sleep(self.link.wan.rtt_ms / 1000)  # the handshake's round trip
        try:
            await loop.create_connection(lambda: Side(down, up, conn), host, target)
        except OSError as e:
            log.warning("relay to %s:%d failed: %s", host, target, e)
            if client.transport:
                client.transport.close()
            return
        # What the client sent meanwhile leaves now: a real client could send nothing before its handshake.
        leave = loop.time() + self.link.wan.rtt_ms / 2000
        up.queue = deque((max(due, leave), data) for due, data in up.queue)
        up.flush()  # (and its end, if it already left)

    @property
    def ports(self) -> list[int]:
        return [s.sockets[0].getsockname()[1] for s in self.servers]

    def close(self) -> None:
        for s in self.servers:
            s.close()


def load(path: Path) -> tuple[list[tuple[int, str, int]], Wan]:
    spec = json.loads(path.read_text())
    return [tuple(r) for r in spec["listen"]], Wan.of(spec.get("wan"))  # type: ignore[misc]


def stats_file(config: Path) -> Path:
    """Where the relay keeps its traffic counters (``{target port: Traffic}``), rewritten every second."""
    return config.with_suffix(".traffic.json")


def write_traffic(relay: Relay, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({str(t): vars(tr) for t, tr in relay.traffic.items()}))
    tmp.replace(path)


async def serve(config: Path) -> None:
    routes, wan = load(config)
    relay = Relay(routes, Link(wan), json.loads(config.read_text()).get("bind", "127.0.0.1"))
    await relay.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    stats = stats_file(config)

    def keep_stats() -> None:
        write_traffic(relay, stats)
        if not stop.is_set():
            loop.call_later(1.0, keep_stats)

    keep_stats()

    def reload() -> None:
        relay.link.wan = load(config)[1]
        log.info("relay profile now %s", relay.link.wan)

    loop.add_signal_handler(signal.SIGUSR1, relay.link.set_cut, True)
    loop.add_signal_handler(signal.SIGUSR2, relay.link.set_cut, False)
    loop.add_signal_handler(signal.SIGHUP, reload)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    log.info("relaying %s with %s", routes, wan)
    await stop.wait()
    relay.close()
    write_traffic(relay, stats)


def main() -> None:
    ap = argparse.ArgumentParser(description="a WAN border in user space")
    ap.add_argument("--config", type=Path, required=True)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve(args.config))


if __name__ == "__main__":
    main()
