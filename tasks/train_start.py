"""A job's ``site-train`` runs start while its sites still prepare, and wait for the preparation here.

Starting a site flow run is a process that imports torch and Prefect, checks its identity and its site's policy
(about 20 s of a demo job's round 0 on a 2-core machine, ``bench/pipeline_overhead.py``). The coordinator creates
each site's train run together with its prepare run, so that start overlaps the preparation instead of following
it. Until the coordinator has published the global statistics (every site it kept has prepared) a train run
only waits: it reads nothing of its site and audits nothing, so a run the coordinator cancels (its site was left
out of the preparation) leaves no trace beyond its cancelled state. Then the run goes through the site's
checks exactly as before (:func:`tasks.context.site_context`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from insitu.conf import check_job_id, load_conf, trusted_training
from insitu.federated.exchange import Exchange
from insitu.federated.kinds import COORDINATOR
from insitu.federated.paths import ABORT, GLOBAL_STATS
from insitu.federated.site_rounds import SITE_WAIT_MARGIN_S
from insitu.storage import store_from_env
from tasks.context import actor_identity
from tasks.dispatch import cancel_runs, run_states, start_site_runs
from tasks.job_lease import STOP_WAIT_S

log = logging.getLogger(__name__)


def await_preparation(job_id: str, training: str, dataset: str, overrides: dict[str, object] | None) -> bool:
    """Wait until the job's global statistics are published (True) or the job was aborted (False).

    The wait is bounded by the site's own copy of the training config (``federation.prepare_deadline_s`` and a
    margin), not by anything in the run. A configuration this site cannot read is not waited on: the site's
    checks refuse it next, with the reason, audited.

    Raises
    ------
    TimeoutError
        When neither appeared in time.
    """
    ident, _ = actor_identity("site", job_id)
    try:
        check_job_id(job_id)
        parsed = load_conf(trusted_training(training), dataset, overrides=overrides)
    except ValueError:
        return True
    exchange = Exchange(store_from_env(parsed.sites.exchange, "exchange"), job_id, writer=ident.actor)
    wait_s = parsed.training.federation.prepare_deadline_s + SITE_WAIT_MARGIN_S
    if exchange.wait_for_any([(GLOBAL_STATS, COORDINATOR), (ABORT, COORDINATOR)], wait_s, poll=1.0) is None:
        raise TimeoutError(f"site {ident.actor}: job {job_id} published no global statistics in {wait_s:.0f}s")
    return exchange.exists(GLOBAL_STATS, writer=COORDINATOR)


def start_train_runs(params: dict[str, dict[str, Any]], pools: dict[str, str], exchange: Exchange) -> dict[str, UUID]:
    """Coordinator side: create every site's train run now (each waits for the global statistics)."""
    exchange.delete(ABORT)  # a re-run of an aborted job starts clean: its new runs must not see the old marker
    return start_site_runs("site-train", params, pools, exchange)


def stop_train_runs(ids: dict[str, UUID], sites: Iterable[str], wait_s: float = STOP_WAIT_S) -> list[str]:
    """Cancel the train runs of ``sites`` (left out of the preparation) and wait until they ended: before the
    global statistics that would wake them are published. Returns the sites whose run was cancelled."""
    cancelled = cancel_runs({site: ids[site] for site in sites if site in ids})
    deadline = time.monotonic() + wait_s
    left = {site: ids[site] for site in cancelled}
    while left and time.monotonic() < deadline:
        left = {site: r.id for site, r in run_states(left).items() if not (r.state and r.state.is_final())}
        if left:
            time.sleep(0.5)
    if left:  # its worker is down: the run cannot act before the worker is back, and then it stops
        log.warning("the train runs of %s are still stopping after %.0fs; going on", sorted(left), wait_s)
    return cancelled


@contextmanager
def cancelled_on_error(ids: Callable[[], dict[str, UUID]]) -> Iterator[None]:
    """Cancel the early train runs when the job fails before its rounds take them over."""
    try:
        yield
    except BaseException:
        try:
            cancel_runs(ids())
        except Exception:  # the job's own error is the one to raise
            log.warning("could not cancel the job's train runs", exc_info=True)
        raise
