"""Work pools of the local platform, created and re-locked through Prefect's REST API (no Prefect import)."""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger(__name__)


def _request(c: Any, method: str, url: str, **kw: Any) -> Any:
    """One API call, retried a few times on 5xx (the server's SQLite answers 503 now and then under load)."""
    for attempt in range(5):
        r = c.request(method, url, **kw)
        if r.status_code < 500 or attempt == 4:
            return r
        time.sleep(1 + attempt)
    return r


def ensure_locked_pool(api_url: str, headers: dict[str, str], pool: str) -> None:
    """Create ``pool`` (type process) with the locked job template, or put the template back if it drifted.

    The workers ignore the server's template anyway (they run their own locked configuration); locking it
    on the server too keeps what the UI shows honest and leaves no variables for a run to set.
    """
    import httpx

    from deployments.worker_policy import locked_base_job_template

    template: dict[str, Any] = locked_base_job_template()
    with httpx.Client(base_url=api_url, headers=headers, timeout=30) as c:
        r = _request(c, "GET", f"/work_pools/{pool}")
        if r.status_code == 404:
            r = _request(c, "POST", "/work_pools/", json={
                "name": pool, "type": "process", "base_job_template": template,
                "description": "insitu: locked job template (no job variables)"})
            if r.status_code not in (200, 201, 409):
                raise RuntimeError(f"could not create work pool {pool}: {r.status_code} {r.text[:500]}")
            log.info("created work pool %s with the locked job template", pool)
            return
        r.raise_for_status()
        if r.json().get("base_job_template") != template:
            log.warning("work pool %s's job template was changed on the server; locking it again", pool)
            _request(c, "PATCH", f"/work_pools/{pool}", json={"base_job_template": template}).raise_for_status()
