"""Regions as hosts (``insitu up --isolated``): the control plane and each site on a network of its own.

Each of them gets a Linux network namespace; each site's namespace is linked to the control plane's by its own
veth pair (its *border*), and the host (the operator's desk: CLI, browser, tests) by one more. Addresses come from
one private /16 chosen when the platform is first isolated, checked free on the host, and recorded in the state
file, so ``insitu down`` removes exactly what ``up`` made, also after a crash::

    host 10.N.0.1 ──── 10.N.0.2  control plane  10.N.k.1 ──── 10.N.k.2  site k (k = 1, 2, …)

No namespace forwards: a site reaches the control plane's address on its own link and nothing else (no route to
another site's link, none to the host's), the host reaches the control plane only, and what a site serves on its
own loopback (its store, its Dask scheduler, its audit service's abstract socket) exists in its namespace alone.

Processes enter a namespace by inheritance: :func:`entered` moves the *calling thread* into it (``setns(2)``),
so a child started from that thread, and a socket that thread opens, belong to it. Root only.
"""

from __future__ import annotations

import ctypes
import hashlib
import ipaddress
import logging
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployments.platform.errors import PlatformError

log = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"
CONTROL = "cp"  # the control plane's namespace (by its short name)
# The protocol number our host route carries: `down` removes the unreachable route it finds with this tag only, never
# one an administrator added for the same range.
ROUTE_PROTO = "186"
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextmanager
def entered(ns: str | None) -> Iterator[None]:
    """Run the body with the calling thread in network namespace ``ns`` (None: where it is). What the thread
    starts (children, threads) and the sockets it opens are in ``ns``; the thread returns to its own afterwards."""
    if ns is None:
        yield
        return
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = -1
    try:
        target = os.open(f"{NETNS_DIR}/{ns}", os.O_RDONLY)
        try:
            _setns(target)  # inside the try: an interrupt right after it still brings the thread home
            yield
        finally:
            _setns(home)
    finally:
        if target >= 0:
            os.close(target)
        os.close(home)


def inside(ns: str) -> bool:
    """Is the calling thread in namespace ``ns`` already?"""
    try:
        return os.stat("/proc/thread-self/ns/net").st_ino == os.stat(f"{NETNS_DIR}/{ns}").st_ino
    except FileNotFoundError:
        return False


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise PlatformError(f"`ip {' '.join(args)}` failed: {r.stderr.strip()}")
    return r


def _host_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the host has an address or a route in."""
    nets = []
    for line in _ip("-4", "-o", "addr", "show").stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            nets.append(ipaddress.ip_interface(parts[parts.index("inet") + 1]).network)
    for line in _ip("-4", "route", "show", "table", "all").stdout.splitlines():
        words = line.split()
        if not words:
            continue
        dest = words[1] if words[0] in {"local", "broadcast", "unicast", "unreachable", "blackhole"} else words[0]
        if dest != "default":
            try:
                nets.append(ipaddress.ip_network(dest, strict=False))
            except ValueError:
                continue
    return nets


def choose_octet(seed: str, taken: list[ipaddress.IPv4Network] | None = None) -> int:
    """The N of a private 10.N.0.0/16 that overlaps nothing the host has: the first free one from a start that
    depends on ``seed`` (the state directory), so two platforms on one host seldom even try the same one."""
    taken = _host_networks() if taken is None else taken
    start = int(hashlib.sha256(seed.encode()).hexdigest(), 16) % 200
    for i in range(200):
        octet = 32 + (start + i) % 200  # 10.32.0.0 – 10.231.255.255: clear of the ranges tools like to use
        net = ipaddress.ip_network(f"10.{octet}.0.0/16")
        if not any(net.overlaps(t) for t in taken):
            return octet
    raise PlatformError("no free 10.N.0.0/16 for the isolated platform's links: every one overlaps an address or "
                        "route of this host")


@dataclass(frozen=True)
class NetPlan:
    """The namespaces, links and addresses of one isolated platform (what the state file records)."""

    tag: str  # 6 hex: names every namespace and link of this platform
    octet: int
    sites: tuple[str, ...]

    @classmethod
    def new(cls, state_dir: str, sites: list[str]) -> NetPlan:
        tag = hashlib.sha256(state_dir.encode()).hexdigest()[:6]
        return cls(tag, choose_octet(state_dir), tuple(sites))

    @classmethod
    def from_record(cls, rec: dict[str, Any], sites: list[str] | None = None) -> NetPlan:
        """The recorded plan, with a border for each of ``sites`` not in it yet (a site added to sites.yaml).

        A recorded site keeps its link number and address for as long as the platform is isolated, even when
        sites.yaml drops or reorders it: the numbers name links that exist, and ``down`` removes every one."""
        recorded = [str(s) for s in rec["sites"]]
        return cls(str(rec["tag"]), int(rec["octet"]), tuple(recorded + [s for s in sites or [] if s not in recorded]))

    def record(self) -> dict[str, Any]:
        return {"tag": self.tag, "octet": self.octet, "sites": list(self.sites)}

    # ------------------------------------------------------------------ names
    def ns(self, who: str) -> str:
        """The namespace of the control plane (``cp``) or of a site."""
        return f"insitu-{self.tag}-{who}"

    @property
    def namespaces(self) -> list[str]:
        return [self.ns(CONTROL), *(self.ns(s) for s in self.sites)]

    def _link(self, k: int) -> tuple[str, str]:
        """The two ends of link ``k`` (0: host ↔ control plane; k ≥ 1: control plane ↔ the k-th site)."""
        return (f"i{self.tag}h", f"i{self.tag}c0") if k == 0 else (f"i{self.tag}c{k}", f"i{self.tag}s{k}")

    def _index(self, site: str) -> int:
        if site not in self.sites:
            raise PlatformError(f"site {site!r} has no border on this isolated platform (sites: {list(self.sites)})")
        return self.sites.index(site) + 1

    # ------------------------------------------------------------------ addresses
    @property
    def network(self) -> str:
        return f"10.{self.octet}.0.0/16"

    @property
    def host_address(self) -> str:
        return f"10.{self.octet}.0.1"

    def control_address(self, site: str | None) -> str:
        """The control plane's address on ``site``'s border (None: on the host's link)."""
        return f"10.{self.octet}.0.2" if site is None else f"10.{self.octet}.{self._index(site)}.1"

    def site_address(self, site: str) -> str:
        return f"10.{self.octet}.{self._index(site)}.2"

    # ------------------------------------------------------------------ life
    def exists(self) -> list[str]:
        """The namespaces of this plan that exist now."""
        return [n for n in self.namespaces if os.path.exists(f"{NETNS_DIR}/{n}")]

    def _our_route(self) -> bool:
        return bool(_ip("route", "show", self.network, "type", "unreachable", "proto", ROUTE_PROTO).stdout.strip())

    def _check_range_free(self) -> None:
        """The recorded range still overlaps nothing of the host's but ours (an interface or a VPN route may have
        arrived since it was chosen)."""
        ours = ipaddress.ip_network(self.network)
        host_link = ipaddress.ip_interface(f"{self.host_address}/24").network
        linked = _ip("link", "show", self._link(0)[0], check=False).returncode == 0
        # ours: the host link's /24 and its local and broadcast routes (/32s), and our unreachable /16
        clash = [n for n in _host_networks() if n.overlaps(ours) and not (linked and n.subnet_of(host_link))
                 and not (n == ours and self._our_route())]
        if clash:
            raise PlatformError(f"the isolated platform's range {self.network} now overlaps {clash[0]} on this host: "
                                f"stop it with `insitu down` (the range is chosen again on the next `insitu up "
                                f"--isolated`)")

    def create(self) -> None:
        """Make every namespace and link that is missing (idempotent), no namespace forwarding."""
        cp = self.ns(CONTROL)
        self._check_range_free()
        for n in self.namespaces:
            if not os.path.exists(f"{NETNS_DIR}/{n}"):
                _ip("netns", "add", n)
            _ip("-n", n, "link", "set", "lo", "up")
            _no_forwarding(n)
        host_end, cp_end = self._link(0)
        if _ip("link", "show", host_end, check=False).returncode != 0:
            _ip("link", "add", host_end, "type", "veth", "peer", "name", cp_end, "netns", cp)
            _ip("addr", "add", f"{self.host_address}/24", "dev", host_end)
            _ip("-n", cp, "addr", "add", f"{self.control_address(None)}/24", "dev", cp_end)
        _ip("link", "set", host_end, "up")
        _ip("-n", cp, "link", "set", cp_end, "up")
        # The rest of the /16 is unreachable from the host: never sent to its default gateway (off this machine).
        if not self._our_route():
            _ip("route", "add", "unreachable", self.network, "proto", ROUTE_PROTO)
        for site in self.sites:
            k = self._index(site)
            cp_end, site_end = self._link(k)
            site_ns = self.ns(site)
            if _ip("-n", cp, "link", "show", cp_end, check=False).returncode != 0:
                _ip("-n", cp, "link", "add", cp_end, "type", "veth", "peer", "name", site_end, "netns", site_ns)
                _ip("-n", cp, "addr", "add", f"{self.control_address(site)}/24", "dev", cp_end)
                _ip("-n", site_ns, "addr", "add", f"{self.site_address(site)}/24", "dev", site_end)
            _ip("-n", cp, "link", "set", cp_end, "up")
            _ip("-n", site_ns, "link", "set", site_end, "up")
        log.info("isolated network 10.%d.0.0/16: %s", self.octet, ", ".join(self.namespaces))

    def delete(self) -> list[str]:
        """Remove every namespace of this plan (their links go with them) and the host's end; returns what went."""
        gone = []
        for n in self.exists():
            _ip("netns", "del", n)
            gone.append(n)
        host_end, _ = self._link(0)
        if _ip("link", "show", host_end, check=False).returncode == 0:
            _ip("link", "del", host_end)
        if self._our_route():
            _ip("route", "del", "unreachable", self.network, "proto", ROUTE_PROTO)
        return gone

    def cut(self, site: str, down: bool = True) -> None:
        """Take ``site``'s border down (or back up): a hard cut, as a failed WAN link."""
        cp_end, _ = self._link(self._index(site))
        _ip("-n", self.ns(CONTROL), "link", "set", cp_end, "down" if down else "up")

    def within(self, who: str | None) -> Any:
        """A context that enters the namespace of ``who`` (the control plane: ``cp``; a site; None: the host)."""
        return entered(self.ns(who)) if who is not None else nullcontext()


def choose_network(state: dict[str, Any], state_dir: Path, sites: list[str], isolated: bool | None,
                   separate_users: bool, running: list[str]) -> NetPlan | None:
    """The isolated platform's plan, chosen by ``--isolated`` (None: as recorded) and kept in the state file for
    later calls (``down`` removes what it records, also after a crash); None: one network. Switching is refused
    while the platform runs."""
    recorded = state.get("isolated")
    want = bool(recorded) if isolated is None else isolated
    if want == bool(recorded):
        if not recorded:
            return None
        plan = NetPlan.from_record(recorded, sites)
        state["isolated"] = plan.record()  # a site new in sites.yaml keeps the link number it gets now
        return plan
    if running:
        now = "isolated" if recorded else "on one network"
        raise PlatformError(f"the platform in {state_dir} is running {now} ({', '.join(running[:3])}, …): stop it "
                            f"with `insitu down`, then start it {'with' if want else 'without'} --isolated")
    if not want:
        NetPlan.from_record(recorded, sites).delete()  # what a crashed isolated platform left
        state.pop("isolated")
        return None
    if not (os.geteuid() == 0 and separate_users):
        raise PlatformError("--isolated needs root (network namespaces, and each site its own OS user): run "
                            "`insitu up --isolated` as root, or leave --isolated out")
    plan = NetPlan.new(str(state_dir), sites)
    state["isolated"] = plan.record()
    return plan


def _no_forwarding(ns: str) -> None:
    """A namespace of ours never routes between its links (a new namespace may inherit the host's setting)."""
    with entered(ns), open("/proc/sys/net/ipv4/ip_forward", "w") as f:
        f.write("0")
