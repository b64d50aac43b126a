"""Mutual TLS on a real site cluster: ``dask scheduler`` + ``dask worker`` processes with site eu's certs.

Only eu's processes get in. Refused: a client or worker holding us's certificate (whether it trusts
us's CA or eu's public CA certificate), a client without a certificate, and plain TCP.

Refused connections are tried with asynchronous Clients, each in its own ``asyncio.run``: a *sync*
``Client(...)`` that fails in its constructor leaks its IO-loop thread, and collecting it later can
deadlock the next sync ``Client`` on ``LoopRunner._lock`` (distributed 2026.8.0: a 10 s stall ending
in a bare ``AssertionError``, or a permanent hang).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dask
import pytest
from distributed import Client, Lock, get_worker
from distributed.comm import connect
from distributed.comm.core import CommClosedError, FatalCommClosedError
from distributed.security import Security

from insitu.governance.pki import PKI_DIR_ENV, SitePki, create_site_pki

log = logging.getLogger(__name__)
DASK = str(Path(sys.executable).with_name("dask"))
REFUSE_WITHIN_S = 5.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(args: list[str], log_file: Path, tmp: Path) -> subprocess.Popen:
    env = dict(os.environ, DASK_TEMPORARY_DIRECTORY=str(tmp), OMP_NUM_THREADS="1")
    with open(log_file, "wb") as out:
        return subprocess.Popen([DASK, *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def _stop(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _kill_pid(pid: int) -> None:
    """Kill a process we started indirectly (a nanny's worker) if it outlived its parent."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _worker_args(address: str, pki: SitePki, name: str, *extra: str) -> list[str]:
    return ["worker", address, "--host", "127.0.0.1", "--nthreads", "1", "--name", name,
            "--dashboard-address", "127.0.0.1:0", "--no-dashboard", *extra, *pki.cli_args()]


@dataclass
class SiteCluster:
    address: str
    pki: SitePki
    scheduler_log: Path
    tmp: Path
    started_s: float


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> dict[str, SitePki]:
    root = tmp_path_factory.mktemp("pki")
    return {s: create_site_pki(root / s, s) for s in ("eu", "us")}


@pytest.fixture(scope="module")
def eu_cluster(sites, tmp_path_factory) -> Iterator[SiteCluster]:
    tmp = tmp_path_factory.mktemp("eu-cluster")
    eu = sites["eu"]
    address = f"tls://127.0.0.1:{_free_port()}"
    t0 = time.perf_counter()
    scheduler = _spawn(["scheduler", "--host", address.rsplit(":", 1)[0], "--port", address.rsplit(":", 1)[1],
                        "--dashboard-address", "127.0.0.1:0", "--no-dashboard", *eu.cli_args()],
                       tmp / "scheduler.log", tmp)
    worker = None
    worker_pids: list[int] = []
    try:
        worker = _spawn(_worker_args(address, eu, "eu-0"), tmp / "worker.log", tmp)
        deadline = time.monotonic() + 60
        while True:
            try:
                with Client(address, security=eu.security(), timeout=5) as c:
                    c.wait_for_workers(1, timeout=60)
                    worker_pids = list(c.run(os.getpid).values())
                    break
            except OSError:
                if time.monotonic() > deadline or scheduler.poll() is not None:
                    raise
                time.sleep(0.2)
        started = time.perf_counter() - t0
        log.info("eu cluster up in %.2fs at %s", started, address)
        yield SiteCluster(address, eu, tmp / "scheduler.log", tmp, started)
    finally:
        if worker is not None:
            _stop(worker)  # the nanny stops its worker process
        for pid in worker_pids:
            _kill_pid(pid)
        _stop(scheduler)


@pytest.fixture
def eu_client(eu_cluster) -> Iterator[Client]:
    with Client(eu_cluster.address, security=eu_cluster.pki.security(), timeout=10) as c:
        yield c


def _try_client(address: str, security: Security | None) -> BaseException | None:
    """Open and close an asynchronous Client in a fresh event loop; the exception raised, if any."""

    async def attempt() -> None:
        client = Client(address, security=security, asynchronous=True, timeout=REFUSE_WITHIN_S)
        try:
            await client
            assert client.scheduler_info()["address"] == address
        finally:
            await client.close()

    try:
        asyncio.run(attempt())
    except Exception as e:  # the caller asserts on the type
        return e
    return None


def _refused(address: str, security: Security | None) -> BaseException:
    t0 = time.perf_counter()
    err = _try_client(address, security)
    took = time.perf_counter() - t0
    assert err is not None, f"a client with {security!r} got into {address}"
    assert took < REFUSE_WITHIN_S, f"refusal took {took:.2f}s"
    log.info("refused in %.3fs: %r", took, err)
    return err


def _log_has(path: Path, text: str, wait_s: float = 5.0) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if text in path.read_text(errors="replace"):
            return True
        time.sleep(0.1)
    return False


def test_site_client_connects_and_runs_a_task(eu_cluster, eu_client):
    t0 = time.perf_counter()
    with Client(eu_cluster.address, security=eu_cluster.pki.security(), timeout=10) as c:
        connected = time.perf_counter() - t0
        assert c.submit(lambda x: x + 1, 41, pure=False).result(timeout=30) == 42
    log.info("cluster start %.2fs, client connect %.3fs", eu_cluster.started_s, connected)
    assert _try_client(eu_cluster.address, eu_cluster.pki.security()) is None
    info = eu_client.scheduler_info(n_workers=-1)
    assert info["address"] == eu_cluster.address
    assert [w.split("://")[0] for w in info["workers"]] == ["tls"]
    assert eu_client.run(lambda dask_worker: dask_worker.address) == {w: w for w in info["workers"]}


def test_other_site_client_is_refused(eu_cluster, sites):
    # us's client does not trust eu's scheduler certificate: it aborts the handshake itself
    err = _refused(eu_cluster.address, sites["us"].security())
    assert type(err) is FatalCommClosedError
    assert str(err).startswith("TLS certificate does not match")
    assert isinstance(err.__cause__, ssl.SSLCertVerificationError)
    assert "certificate verify failed" in str(err.__cause__)


def test_other_site_cert_is_refused_by_the_scheduler(eu_cluster, sites):
    # a rogue that trusts eu's (public) CA certificate but presents us's certificate: eu's scheduler
    # refuses it. The client sees the alert (FatalCommClosedError, TLSV1_ALERT_UNKNOWN_CA) or, when
    # the server closed first, an SSLEOFError (CommClosedError).
    eu, us = sites["eu"], sites["us"]
    rogue = Security(require_encryption=True, tls_ca_file=str(eu.ca_file), tls_client_cert=str(us.cert_file),
                     tls_client_key=str(us.key_file))
    err = _refused(eu_cluster.address, rogue)
    assert isinstance(err, CommClosedError)
    assert "UNKNOWN_CA" in str(err) or "EOF occurred in violation of protocol" in str(err), err
    assert _log_has(eu_cluster.scheduler_log, "certificate verify failed: unable to get local issuer certificate")


def test_clients_without_certificate_are_refused(eu_cluster, sites):
    port = eu_cluster.address.rsplit(":", 1)[1]
    # plain TCP to the TLS listener: the scheduler resets the connection at the first byte
    err = _refused(f"tcp://127.0.0.1:{port}", None)
    assert type(err) is CommClosedError and isinstance(err.__cause__, ConnectionResetError), repr(err)
    assert _log_has(eu_cluster.scheduler_log, "WRONG_VERSION_NUMBER")
    # tls:// with no certificate configured: Dask refuses to even try
    err = _refused(eu_cluster.address, Security(require_encryption=True))
    assert type(err) is TypeError and "TLS expects a `ssl_context` argument" in str(err)
    # a client that trusts eu's CA but presents no certificate: the scheduler refuses it
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(sites["eu"].ca_file))
    ctx.check_hostname = False

    async def anonymous() -> None:
        comm = await connect(eu_cluster.address, timeout=REFUSE_WITHIN_S, ssl_context=ctx)
        await comm.close()

    t0 = time.perf_counter()
    with pytest.raises(CommClosedError) as info:
        asyncio.run(anonymous())
    assert time.perf_counter() - t0 < REFUSE_WITHIN_S
    msg = str(info.value)
    assert "CERTIFICATE_REQUIRED" in msg or "EOF occurred in violation of protocol" in msg, msg
    assert _log_has(eu_cluster.scheduler_log, "PEER_DID_NOT_RETURN_A_CERTIFICATE")


@pytest.mark.parametrize("trust", ["us-ca", "eu-ca"])
def test_other_site_worker_cannot_join(eu_cluster, eu_client, sites, trust, tmp_path):
    """A worker with us's cert (trusting us's CA, or eu's public CA cert) never registers; it retries
    the handshake every ~0.1 s until ``--death-timeout``, then exits 1."""
    eu, us = sites["eu"], sites["us"]
    rogue = us if trust == "us-ca" else SitePki(eu.ca_file, us.cert_file, us.key_file)
    before = set(eu_client.scheduler_info(n_workers=-1)["workers"])
    log_file = tmp_path / "rogue.log"
    proc = _spawn(_worker_args(eu_cluster.address, rogue, f"rogue-{trust}", "--no-nanny", "--death-timeout", "4"),
                  log_file, eu_cluster.tmp)
    try:
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            workers = eu_client.scheduler_info(n_workers=-1)["workers"]
            assert set(workers) == before, workers
            assert not any(str(w.get("name", "")).startswith("rogue") for w in workers.values())
            time.sleep(0.25)
        rc = proc.poll()
    finally:
        _stop(proc)
    text = log_file.read_text(errors="replace")
    assert rc == 1 and "Timed out starting worker" in text, text[-2000:]
    assert "Registered to" not in text
    # who refused whom: us's CA rejects eu's scheduler (the worker alerts UNKNOWN_CA); eu's scheduler
    # rejects us's certificate (unable to get local issuer certificate)
    expected = "TLSV1_ALERT_UNKNOWN_CA" if trust == "us-ca" else "unable to get local issuer certificate"
    assert _log_has(eu_cluster.scheduler_log, expected)
    log.info("rogue worker (%s) refused, exited %s after %d handshake attempts", trust, rc,
             text.count("Waiting to connect to"))


def test_lock_and_pinned_submit_over_tls(eu_client):
    (worker,) = eu_client.scheduler_info(n_workers=-1)["workers"]
    assert worker.startswith("tls://127.0.0.1:")
    with eu_client.as_current(), Lock("insitu-tls-test"):  # as in launch.py: the default client
        fut = eu_client.submit(lambda: get_worker().address, workers=[worker], allow_other_workers=False,
                               pure=False)
        assert fut.result(timeout=30) == worker
    # what launch.py derives as the torch.distributed rendezvous host from a tls:// worker address
    assert worker.split("://", 1)[-1].rsplit(":", 1)[0] == "127.0.0.1"


def test_launch_on_dask_over_tls(eu_cluster, monkeypatch):
    """launch.py's own ``Client(address)`` has no ``security=``: it needs the site's settings from
    the process's configuration (here the PKI security loader), else it fails before connecting."""
    from insitu.parallel.launch import launch_on_dask

    fn = lambda rank, world, payload: (rank, world, payload)  # noqa: E731 - pickled by value
    with pytest.raises(TypeError, match="TLS expects a `ssl_context` argument"):
        launch_on_dask(eu_cluster.address, fn, 1, "p", timeout_s=60, worker_wait_s=1)
    gc.collect()  # finalize the failed sync Client here, not inside the next Client's loop thread
    monkeypatch.setenv(PKI_DIR_ENV, str(eu_cluster.pki.ca_file.parent))
    with dask.config.set({"distributed.client.security-loader": "insitu.governance.pki.security_loader"}):
        assert launch_on_dask(eu_cluster.address, fn, 1, "p", timeout_s=60, worker_wait_s=10) == [(0, 1, "p")]
