"""FedAsync (Xie, Koyejo & Gupta 2019, "Asynchronous Federated Optimization"): mix every update in at once.

    w ← (1 − α_t)·w + α_t·w_site,   α_t = α · s(τ)

where τ is the update's staleness and s the configured staleness function. Every accepted update makes a
new global version; nothing is buffered, so the server's state is just the version.
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


class FedAsync(AsyncAlgorithm):
    name = "fedasync"

    def _accept(self, server: ServerState, global_state: Mapping[str, torch.Tensor], update: SiteUpdate,
                staleness: int, s: float) -> Decision:
        alpha_t = self.config.alpha * s
        mixed = {}
        for k, w in global_state.items():
            if w.is_floating_point():
                mixed[k] = (1.0 - alpha_t) * w.double() + alpha_t * update.state[k].double()
            else:  # counters (num_batches_tracked) are not averaged: the applied update's
                mixed[k] = update.state[k].clone()
        entry = Entry(update.site, update.seq, update.base_version, staleness, alpha_t)
        version = server.version + 1
        receipt = Receipt(update.site, update.seq, update.base_version, staleness, True, version, alpha_t, (entry,))
        return Decision(with_state(server, version=version), as_dtype_of(mixed, global_state), receipt)
