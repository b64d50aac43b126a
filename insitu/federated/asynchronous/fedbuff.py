"""FedBuff (Nguyen et al. 2022, "Federated Learning with Buffered Asynchronous Aggregation"): buffer K updates,
then take one server step.

Each accepted update contributes its delta from the version it trained from, weighted by staleness:
Δ_i = s(τ_i)·(w_i − w_base_i). Once ``buffer_size`` (K) are in,

    w ← w + α · (1/K)·Σ_i Δ_i

(α: the server learning rate) and the buffer empties. Deltas rather than weights: an update trained from an
old version then carries what the site learnt, not the old version itself. The buffer (Σ Δ_i and who is in it)
is the server's state between steps, kept on the exchange so that a resumed job continues with it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from insitu.federated.asynchronous.base import (
    AsyncAlgorithm,
    Decision,
    Entry,
    Receipt,
    ServerState,
    SiteUpdate,
    as_dtype_of,
    with_state,
)


class FedBuff(AsyncAlgorithm):
    name = "fedbuff"

    @property
    def updates_per_version(self) -> int:
        return self.config.buffer_size

    def _accept(self, server: ServerState, global_state: Mapping[str, torch.Tensor], update: SiteUpdate,
                staleness: int, s: float) -> Decision:
        total = {k: (server.buffer_sum[k].double() if server.buffer_sum is not None
                     else torch.zeros(w.shape, dtype=torch.float64))
                 for k, w in global_state.items() if w.is_floating_point()}
        for k in total:
            total[k] = total[k] + s * (update.state[k].double() - update.base[k].double())
        entry = Entry(update.site, update.seq, update.base_version, staleness, s)
        buffer = (*server.buffer, entry)
        if len(buffer) < self.config.buffer_size:
            receipt = Receipt(update.site, update.seq, update.base_version, staleness, True, server.version, s)
            return Decision(with_state(server, buffer=buffer, buffer_sum=total), None, receipt)
        k_ = len(buffer)
        stepped = {k: (w.double() + self.config.alpha * total[k] / k_) if w.is_floating_point()
                   else w.clone() for k, w in global_state.items()}
        version = server.version + 1
        receipt = Receipt(update.site, update.seq, update.base_version, staleness, True, version, s, buffer)
        return Decision(ServerState(version), as_dtype_of(stepped, global_state), receipt)
