"""One round on the coordinator's side: collect updates until the deadline, check quorum, aggregate.

Every update is checked again on read, whatever the site claims to have checked: its manifest against the
protocol's schema, its state against this round's global model (names, shapes, dtypes, finite values,
norm bound). An update that fails is rejected for the round with its reason, like a late one is skipped;
the round goes on while the quorum holds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from insitu.federated.aggregators import Aggregator, FedAvg, Update
from insitu.federated.claims import STALE_RULE, ClaimRefusal, n_samples_refusal
from insitu.federated.codecs import UpdateEncoding
from insitu.federated.exchange import Exchange, enforce_protocol
from insitu.federated.kinds import COORDINATOR, MAX_UPDATE_NORM, ExchangeError, site_budgets
from insitu.federated.paths import Document, aggregator_state, global_weights, update
from insitu.federated.paths import round_name as round_name  # re-exported: where it was defined before paths
from insitu.federated.polling import backoff
from insitu.federated.running_mean import RunningMean

log = logging.getLogger(__name__)


class QuorumError(RuntimeError):
    """Fewer sites than ``min_sites`` delivered an update in time."""


@dataclass
class RoundResult:
    round: int
    sites: list[str]
    missing: list[str]
    n_samples: int
    site_metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    resumed: bool = False
    sha256: str = ""
    rejected: dict[str, str] = field(default_factory=dict)  # site -> why its update was not used (also in missing)
    refused_claims: list[ClaimRefusal] = field(default_factory=list)  # for the coordinator's audit log

    def as_dict(self) -> dict[str, Any]:
        return {"round": self.round, "sites": self.sites, "missing": self.missing, "n_samples": self.n_samples,
                "site_metrics": self.site_metrics, "resumed": self.resumed, "sha256": self.sha256,
                "rejected": self.rejected}


def site_alive(is_alive: Callable[[str], bool], site: str) -> bool:
    """``is_alive(site)``, and True when the orchestrator cannot tell (keep waiting until the deadline)."""
    try:
        return is_alive(site)
    except Exception:  # the orchestrator did not answer: keep waiting until the deadline
        log.warning("could not tell whether %s's run is alive; still waiting for it", site, exc_info=True)
        return True


def collect(
    ex: Exchange,
    doc: Document,
    sites: list[str],
    deadline_s: float,
    is_alive: Callable[[str], bool] | None = None,
    poll: float = 0.25,
    alive_every_s: float = 3.0,
) -> tuple[list[str], list[str]]:
    """Wait until every site published ``doc`` (a state: its ``.manifest``), the deadline passes, or the rest
    are gone.

    Returns ``(arrived, missing)``. A site whose flow run has ended (``is_alive`` False) is not waited for.
    """
    deadline = time.monotonic() + deadline_s
    next_liveness = time.monotonic()
    arrived: list[str] = []
    pause = backoff(poll)
    while True:
        arrived = arrived + [s for s in sites if s not in arrived and ex.exists(doc, writer=s)]
        pending = [s for s in sites if s not in arrived]
        if not pending or time.monotonic() >= deadline:
            break
        # Asking the orchestrator whether a site's run ended is costlier than a HEAD on the exchange.
        if is_alive is not None and time.monotonic() >= next_liveness:
            if not any(site_alive(is_alive, s) for s in pending):
                # A site may have published and then ended between our look and its end: look once more.
                arrived += [s for s in pending if ex.exists(doc, writer=s)]
                break
            next_liveness = time.monotonic() + alive_every_s
        time.sleep(min(next(pause), max(0.0, deadline - time.monotonic())))
    arrived = [s for s in sites if s in arrived]
    return arrived, [s for s in sites if s not in arrived]


def collect_updates(
    ex: Exchange,
    rnd: int,
    sites: list[str],
    deadline_s: float,
    is_alive: Callable[[str], bool] | None = None,
    poll: float = 0.25,
    alive_every_s: float = 3.0,
) -> tuple[list[str], list[str]]:
    """:func:`collect` for the sites' updates of round ``rnd``."""
    return collect(ex, update(rnd).manifest, sites, deadline_s, is_alive, poll, alive_every_s)


def run_round(
    ex: Exchange,
    rnd: int,
    sites: list[str],
    min_sites: int,
    deadline_s: float,
    is_alive: Callable[[str], bool] | None = None,
    max_update_norm: float = MAX_UPDATE_NORM,
    aggregator: Aggregator | None = None,
    encoding: UpdateEncoding | None = None,
    committed: Mapping[str, Mapping[str, int]] | None = None,
) -> RoundResult:
    """Collect, check the quorum, aggregate (FedAvg unless ``aggregator`` says otherwise), publish the global
    weights of round ``rnd + 1``.

    A stateful aggregator (FedAdam's moments) gets back the state it kept after the previous round, read from
    the exchange, and its new state is written there before the new global weights: a resumed job (whose
    finished rounds are recognised by their weights) therefore always finds the state that goes with them.

    ``committed`` is each site's rows per split from its prepare statistics
    (:func:`insitu.federated.claims.committed_rows`): an update claiming more training rows than its site
    committed is rejected like an invalid one, and its refusal kept in ``refused_claims`` for the audit log.

    Raises
    ------
    QuorumError
        When fewer than ``min_sites`` valid updates arrived; the message names the missing and rejected sites.
    ProtocolViolation
        When a site exceeded its byte budget or wrote outside the protocol: the job stops.
    """
    done = global_weights(rnd + 1).manifest
    if ex.exists(done, writer=COORDINATOR):
        # A re-run of the same job: this round was aggregated before; artefacts are idempotent.
        man = ex.get_json(done, writer=COORDINATOR)
        metrics = {}
        for s in man["sites"]:  # the sites' own round metrics, from their update manifests (no weights read)
            up = ex.get_json(update(rnd).manifest, writer=s)
            metrics[s] = _round_metrics(up)
        return RoundResult(rnd, list(man["sites"]), [s for s in sites if s not in man["sites"]],
                           int(man["n_samples"]), metrics, resumed=True, sha256=man["sha256"])
    arrived, missing = collect_updates(ex, rnd, sites, deadline_s, is_alive)
    if missing:
        log.warning("round %d: no update from %s within %.0fs; skipped for this round", rnd, missing, deadline_s)
    if len(arrived) < min_sites:  # checked before reading updates (fail fast) …
        raise QuorumError(
            f"round {rnd}: quorum not met: {len(arrived)} update(s) from {arrived} < min_sites={min_sites}; "
            f"missing: {missing}"
        )
    global_state, base = ex.get_state(global_weights(rnd), writer=COORDINATOR)
    # Before any update is read: a site over its budget (or writing outside the protocol) stops the job.
    enforce_protocol(ex, site_budgets(rnd + 1, int(base["bytes"])), f"round {rnd}")
    aggregator = aggregator or FedAvg()
    # A mean-based aggregator gets the running mean: one update in memory at a time, however many sites.
    running = RunningMean() if aggregator.mean_based else None
    updates, metrics, rejected, refused = [], {}, {}, []
    for s in arrived:
        try:
            state, man = ex.get_state(update(rnd), writer=s, reference=global_state,
                                      max_norm=max_update_norm, encoding=encoding)
            if man["round"] != rnd or man["base_sha256"] != base["sha256"]:
                raise ExchangeError(f"{s}'s update was not trained from round {rnd}'s global weights")
            claim = None if committed is None else n_samples_refusal(
                s, f"the update of round {rnd}", int(man["n_samples"]), committed.get(s))
            if claim is not None:
                refused.append(claim)
                raise ExchangeError(claim.reason)
        except ExchangeError as e:
            log.warning("round %d: %s's update is rejected: %s", rnd, s, e)
            rejected[s] = str(e)
            continue
        if running is not None:
            running.add(s, state, int(man["n_samples"]))
        else:
            updates.append(Update(s, state, int(man["n_samples"])))
        del state
        metrics[s] = _round_metrics(man)
    arrived = [s for s in arrived if s not in rejected]
    missing = missing + list(rejected)
    if len(arrived) < min_sites:  # … and after dropping updates that were not valid for this round
        raise QuorumError(f"round {rnd}: quorum not met: {len(arrived)} valid update(s) from {arrived} < "
                          f"min_sites={min_sites}; missing or invalid: {missing}; rejected: {rejected}")
    if running is not None:
        updates = [running.as_update()]
    total = sum(u.n_samples for u in updates)
    kept_before = aggregator_state(rnd)
    before = ex.get_state(kept_before, writer=COORDINATOR)[0] \
        if rnd > 0 and ex.exists(kept_before.manifest, writer=COORDINATOR) else None
    new_global, kept = aggregator.aggregate(rnd, global_state, updates, before)
    if kept is not None:
        ex.put_state(aggregator_state(rnd + 1), kept)
    man = ex.put_state(global_weights(rnd + 1), new_global, reference=global_state,
                       max_norm=max_update_norm, round=rnd + 1, sites=arrived, n_samples=total)
    return RoundResult(rnd, arrived, missing, total, metrics, sha256=man["sha256"], rejected=rejected,
                       refused_claims=refused)


def _round_metrics(manifest: dict[str, Any]) -> dict[str, Any]:
    """A site's round metrics as logged: its training numbers, samples and update bytes."""
    return {**manifest.get("metrics", {}), "n_samples": manifest["n_samples"], "bytes": manifest["bytes"]}


def stale_updates(ex: Exchange, missed: Mapping[int, Iterable[str]],
                  deadline_s: float) -> list[tuple[int, ClaimRefusal]]:
    """The updates that arrived after their round closed without them (a site cut off past the round deadline
    that published once it was back): ``(round, refusal)`` for each round and site of ``missed`` whose update is
    now on the exchange. They are never merged (their round's global model is already made); the caller audits
    them."""
    found = []
    for rnd, sites in sorted(missed.items()):
        for s in sorted(sites):
            if ex.exists(update(rnd).manifest, writer=s):
                found.append((rnd, ClaimRefusal(
                    s, STALE_RULE, f"the update of round {rnd}", None, None,
                    f"{s}'s update of round {rnd} arrived after the round closed without it (deadline "
                    f"{deadline_s:g} s): stale, not merged")))
    return found
