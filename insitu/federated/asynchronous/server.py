"""The coordinator of an async job: a parameter server over the exchange.

Sites push updates (:func:`~insitu.federated.paths.async_update`, numbered per site from 0, each naming the global
version it trained from); the server takes them one at a time in the order they arrived, checks each on read as
a synchronous round does (manifest schema, the base version's weights and hash, names, shapes, finite values,
norm bound), lets the :class:`~insitu.federated.asynchronous.base.AsyncAlgorithm` decide, and commits the
decision to the exchange:

1. a new global version ``global_weights(v + 1)`` (its manifest lists the updates it was made of),
2. FedBuff's buffer as a state named by the decision count,
3. for a refusal, the site's :func:`~insitu.federated.paths.refresh` notice,
4. the server's state (:data:`~insitu.federated.paths.ASYNC_STATE`: version, next sequence number per site,
   buffer), and last
5. the :data:`~insitu.federated.paths.NEWEST` pointer that sites pull from.

A coordinator stopped anywhere in between resumes from the last state document: the update it was deciding is
still the next one, the same decision is recomputed and rewrites the same objects. Core code: no Prefect; the
caller audits refusals (between :meth:`ParameterServer.decide` and :meth:`ParameterServer.commit`, so that a
refusal is on the audit log before the site can see it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from insitu.federated.asynchronous.base import AsyncAlgorithm, Decision, Receipt, ServerState, SiteUpdate
from insitu.federated.claims import ClaimRefusal, n_samples_refusal
from insitu.federated.codecs import UpdateEncoding
from insitu.federated.exchange import Exchange, enforce_protocol
from insitu.federated.kinds import COORDINATOR, MAX_UPDATE_NORM, ExchangeError, site_budgets
from insitu.federated.paths import ASYNC_STATE, NEWEST, async_buffer, async_update, global_weights, refresh, weights
from insitu.federated.rounds import site_alive

log = logging.getLogger(__name__)


class StalledError(RuntimeError):
    """No update arrived within the deadline, or every site's run ended before the target version."""


@dataclass
class Arrival:
    """An update on the exchange that the server has not decided yet."""

    site: str
    seq: int
    manifest: dict[str, Any]


@dataclass
class Pending:
    """A decision made but not committed yet (see :meth:`ParameterServer.commit`)."""

    decision: Decision
    arrival: Arrival
    claim: ClaimRefusal | None = None  # an update refused for claiming more rows than its site committed

    @property
    def receipt(self) -> Receipt:
        return self.decision.receipt


class ParameterServer:
    """One async job's server state, read from the exchange (a resumed job continues it) and kept there."""

    def __init__(self, ex: Exchange, algorithm: AsyncAlgorithm, sites: list[str], target: int, update_limit: int,
                 max_update_norm: float = MAX_UPDATE_NORM,
                 committed: Mapping[str, Mapping[str, int]] | None = None,
                 encoding: UpdateEncoding | None = None) -> None:
        self.ex, self.algorithm, self.sites, self.target = ex, algorithm, sites, target
        self.encoding = encoding  # federation.compression: how the sites' updates are encoded
        self.committed = committed  # rows per split from each site's prepare statistics (None: not checked)
        self.update_limit, self.max_update_norm = update_limit, max_update_norm
        self.decisions = 0
        self.next_seq = {s: 0 for s in sites}
        self.refused = {s: 0 for s in sites}
        self.state = ServerState()
        self.resumed_versions = 0
        if ex.exists(ASYNC_STATE, writer=COORDINATOR):
            doc = ex.get_json(ASYNC_STATE, writer=COORDINATOR)
            buffer_sum = None
            if doc.get("buffer_state"):
                buffer_sum, _ = ex.get_state(weights(doc["buffer_state"]), writer=COORDINATOR)
            self.state = ServerState.from_json(doc, buffer_sum)
            self.decisions = int(doc["decisions"])
            self.next_seq.update(doc["next_seq"])
            self.refused.update(doc["refused"])
            self.resumed_versions = self.state.version
            log.info("async job %s resumed at version %d after %d decisions", ex.job_id, self.state.version,
                     self.decisions)
        self.global_state, self.global_manifest = ex.get_state(global_weights(self.version), writer=COORDINATOR)
        self.model_bytes = int(ex.get_json(global_weights(0).manifest, writer=COORDINATOR)["bytes"])
        self._bases: dict[int, tuple[dict[str, torch.Tensor], dict[str, Any]]] = {
            self.version: (self.global_state, self.global_manifest)}
        self._publish_newest()

    @property
    def version(self) -> int:
        return self.state.version

    @property
    def done(self) -> bool:
        return self.version >= self.target

    # ------------------------------------------------------------------ arrivals
    def arrivals(self) -> list[Arrival]:
        """Every site's next undecided update that is on the exchange, oldest first (by its manifest's time,
        then site: the same order on a resumed run)."""
        out = []
        for s in self.sites:
            seq = self.next_seq[s]
            if seq < self.update_limit and self.ex.exists(async_update(seq).manifest, writer=s):
                try:
                    man = self.ex.get_json(async_update(seq).manifest, writer=s)
                except ExchangeError as e:  # refused by the protocol's schema: decided (refused) like any other
                    man = {"created": "", "error": str(e)}
                out.append(Arrival(s, seq, man))
        return sorted(out, key=lambda a: (a.manifest.get("created", ""), a.site))

    def wait(self, deadline_s: float, is_alive: Callable[[str], bool] | None = None, poll: float = 0.2,
             alive_every_s: float = 3.0) -> list[Arrival]:
        """The undecided updates, waiting up to ``deadline_s`` for one.

        Raises
        ------
        StalledError
            When none arrived in time, or every site's run has ended (``is_alive`` False for all).
        """
        deadline = time.monotonic() + deadline_s
        next_alive = time.monotonic() + alive_every_s
        while True:
            found = self.arrivals()
            if found:
                return found
            if time.monotonic() >= deadline:
                raise StalledError(f"no update within {deadline_s:.0f}s at version {self.version} of {self.target}")
            if is_alive is not None and time.monotonic() >= next_alive:
                if not any(site_alive(is_alive, s) for s in self.sites):
                    found = self.arrivals()
                    if found:
                        return found
                    raise StalledError(f"every site's run ended at version {self.version} of {self.target}")
                next_alive = time.monotonic() + alive_every_s
            time.sleep(poll)

    # ------------------------------------------------------------------ decisions
    def decide(self, arrival: Arrival) -> Pending:
        """Check ``arrival`` on read and let the algorithm decide; nothing is written yet.

        An update the protocol refuses (bad manifest, wrong base hash, shapes, norm) is refused like a stale
        one, with its reason, and the site told to refresh.

        Raises
        ------
        ProtocolViolation
            When a site exceeded its byte budget or wrote outside the protocol: the job stops.
        """
        enforce_protocol(self.ex, site_budgets(self.target, self.model_bytes, self.update_limit),
                         f"async version {self.version}")
        s, seq, man = arrival.site, arrival.seq, arrival.manifest
        claim = None
        try:
            if "error" in man:
                raise ExchangeError(man["error"])
            base_version = int(man["base_version"])
            if base_version > self.version:
                raise ExchangeError(f"{s}'s update {seq} claims base version {base_version}; the newest is "
                                    f"{self.version}")
            base, base_man = self._base(base_version)
            if man["base_sha256"] != base_man["sha256"]:
                raise ExchangeError(f"{s}'s update {seq} was not trained from version {base_version}'s weights")
            state, man = self.ex.get_state(async_update(seq), writer=s, reference=base, max_norm=self.max_update_norm,
                                           encoding=self.encoding)
            arrival.manifest = man
            if self.committed is not None:
                claim = n_samples_refusal(s, f"async update {seq}", int(man["n_samples"]), self.committed.get(s))
                if claim is not None:
                    raise ExchangeError(claim.reason)
        except ExchangeError as e:
            log.warning("async: %s's update %d is refused: %s", s, seq, e)
            base_v = min(max(int(man.get("base_version", self.version) or 0), 0), self.version)
            receipt = Receipt(s, seq, base_v, self.version - base_v, False, self.version,
                              reason=f"invalid update: {e}")
            return Pending(Decision(self.state, None, receipt), arrival, claim)
        update = SiteUpdate(s, seq, base_version, state, base, int(man["n_samples"]))
        return Pending(self.algorithm.receive(self.state, self.global_state, update), arrival)

    def commit(self, pending: Pending) -> dict[str, Any] | None:
        """Write the decision to the exchange (see the module's order); returns the new version's result
        (as :meth:`version_result`) when one was made, else None."""
        d, r, a = pending.decision, pending.receipt, pending.arrival
        decisions = self.decisions + 1
        result = None
        if d.global_state is not None:
            entries = [e.as_dict() for e in r.applied]
            n = sum(self._n_samples(e["site"], e["seq"]) for e in entries)
            man = self.ex.put_state(global_weights(r.version), d.global_state, reference=self.global_state,
                                    max_norm=self.max_update_norm, round=r.version,
                                    sites=sorted({e["site"] for e in entries}), n_samples=n, applied=entries)
            self.global_state, self.global_manifest = d.global_state, man
            self._bases[r.version] = (d.global_state, man)
        buffer_name = None
        if d.state.buffer:
            assert d.state.buffer_sum is not None
            buffer_name = async_buffer(decisions).name
            self.ex.put_state(async_buffer(decisions), {k: v.clone() for k, v in d.state.buffer_sum.items()},
                              decisions=decisions)
        if not r.accepted:
            self.ex.put_json(refresh(r.site), {"recipient": r.site, "seq": r.seq, "base_version": r.base_version,
                                               "version": self.version, "staleness": r.staleness,
                                               "reason": r.reason[:1999]})
        self.next_seq[a.site] = a.seq + 1
        if not r.accepted:
            self.refused[a.site] += 1
        self.state, self.decisions = d.state, decisions
        self.ex.put_json(ASYNC_STATE, {"version": self.version, "decisions": decisions, "next_seq": self.next_seq,
                                       "refused": self.refused, "buffer": [e.as_dict() for e in d.state.buffer],
                                       "buffer_state": buffer_name})
        if d.global_state is not None:
            self._publish_newest()
            result = self.version_result(r.version)
        self._forget_old_bases()
        return result

    # ------------------------------------------------------------------ results
    def version_result(self, version: int, resumed: bool = False) -> dict[str, Any]:
        """Version ``version`` as a round's result (``round`` = version − 1, as a sync round makes version
        ``round + 1``), with the applied updates' staleness, weights, bytes and the sites' training metrics."""
        man = self.ex.get_json(global_weights(version).manifest, writer=COORDINATOR)
        applied = man.get("applied") or []
        site_metrics: dict[str, dict[str, Any]] = {}
        nbytes = 0
        for e in applied:
            up = self.ex.get_json(async_update(e["seq"]).manifest, writer=e["site"])
            nbytes += int(up["bytes"])
            site_metrics[e["site"]] = {**up.get("metrics", {}), "n_samples": up["n_samples"], "bytes": up["bytes"],
                                       "async_staleness": e["staleness"], "async_weight": e["weight"],
                                       "async_seq": e["seq"]}
        return {"round": version - 1, "sites": list(man.get("sites") or []), "missing": [], "rejected": {},
                "n_samples": int(man.get("n_samples") or 0), "site_metrics": site_metrics, "resumed": resumed,
                "sha256": man["sha256"], "applied": applied, "update_bytes": nbytes}

    def results(self) -> list[dict[str, Any]]:
        """Every version made so far (1 … version), as :meth:`version_result`."""
        return [self.version_result(v, resumed=v <= self.resumed_versions) for v in range(1, self.version + 1)]

    # ------------------------------------------------------------------ helpers
    def _publish_newest(self) -> None:
        self.ex.put_json(NEWEST, {"version": self.version, "sha256": self.global_manifest["sha256"],
                                  "target": self.target})

    def _base(self, version: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        if version not in self._bases:
            self._bases[version] = self.ex.get_state(global_weights(version), writer=COORDINATOR)
        return self._bases[version]

    def _forget_old_bases(self) -> None:
        # Only versions within max_staleness can be accepted; older ones are re-read if ever needed (refusals).
        keep = self.version - self.algorithm.config.max_staleness
        for v in [v for v in self._bases if v < keep]:
            del self._bases[v]

    def _n_samples(self, site: str, seq: int) -> int:
        return int(self.ex.get_json(async_update(seq).manifest, writer=site)["n_samples"])

