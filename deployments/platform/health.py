"""Health probes of the platform's components: each answers True or False, never raises."""

from __future__ import annotations

import base64
import socket
import urllib.request
from pathlib import Path
from typing import Any


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (loopback only)
            return 200 <= r.status < 500
    except Exception:
        return False


def tcp_ok(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def audit_ok(socket_path: Path, actor: str, log: Path, service_key: str | None = None) -> bool:
    """Does the actor's audit service answer (with the head of its log, signed by its ``service_key``)?"""
    from insitu.governance.audit_service import AuditClient

    try:
        return AuditClient(socket_path, actor, log, service_key).head() is not None
    except Exception:
        return False


def dask_workers_ok(address: str, tls_dir: Path, n: int) -> bool:
    """Has the scheduler at ``address`` (mutual TLS with the site's keys in ``tls_dir``) at least ``n`` workers?"""
    from distributed import Client

    try:
        with Client(address, timeout=3, security=site_security(tls_dir)) as c:
            return len(c.scheduler_info(n_workers=-1)["workers"]) >= n
    except Exception:
        return False


def prefect_headers(auth: str) -> dict[str, str]:
    """The Prefect API's basic-auth header for the ``user:password`` string ``auth``."""
    return {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()}


def worker_online(api_url: str, headers: dict[str, str], pool: str) -> bool:
    """Is a worker of ``pool`` online on the Prefect server?"""
    import httpx

    try:
        r = httpx.post(f"{api_url}/work_pools/{pool}/workers/filter", json={}, timeout=3, headers=headers)
        return r.status_code == 200 and any(w.get("status") == "ONLINE" for w in r.json())
    except Exception:
        return False


def site_security(tls_dir: Path) -> Any:
    """The ``distributed.security.Security`` of a site's own processes, from its TLS directory."""
    from insitu.governance.pki import load_site_pki

    return load_site_pki(tls_dir).security()
