"""The exchange on an in-memory store, with the coordinator's side played by hand: for the unit tests of a site's
round protocol (insitu.federated.site_rounds, insitu.federated.asynchronous.site).

Everything goes through the real :class:`~insitu.federated.exchange.Exchange`, so the documents the tests
write and the loops read are checked against the protocol's schemas as on the platform.
"""

from __future__ import annotations

import uuid

import torch

from insitu.federated.exchange import Exchange
from insitu.federated.kinds import COORDINATOR
from insitu.federated.paths import ASYNC_STATE, NEWEST, STOP, async_update, global_weights, refresh, update, validation
from insitu.storage import Store

SITE = "eu"
JOB = "job-1"
BASE_SHA = "0" * 64
RAN_AS = {"actor": SITE, "os_user": f"insitu-{SITE}", "pool": f"insitu-{SITE}"}


def tiny_state() -> dict[str, torch.Tensor]:
    return {"fc.weight": torch.zeros(1, 2), "fc.bias": torch.zeros(1)}


class Exchanges:
    """The coordinator's and one site's view of one job on a fresh in-memory store."""

    def __init__(self) -> None:
        self.store = Store(f"memory://insitu-test-{uuid.uuid4().hex}/", {})
        self.coordinator = Exchange(self.store, JOB, COORDINATOR)
        self.site = Exchange(self.store, JOB, SITE)

    def drop(self) -> None:
        root = self.store.path("")
        if self.store.fs.exists(root):  # nothing was written when a test wrote nothing
            self.store.fs.rm(root, recursive=True)

    # ------------------------------------------------------------------ the coordinator's writes
    def publish_global(self, rnd: int) -> None:
        self.coordinator.put_state(global_weights(rnd), tiny_state(), round=rnd)

    def stop(self, after_round: int) -> None:
        self.coordinator.put_json(STOP, {"after_round": after_round, "reason": "no improvement"})

    def publish_newest(self, version: int, target: int) -> None:
        self.coordinator.put_json(NEWEST, {"version": version, "sha256": f"{version:064x}", "target": target})

    def publish_async_state(self, version: int, next_seq: int) -> None:
        """The parameter server's state after deciding the site's update ``next_seq - 1``."""
        self.coordinator.put_json(ASYNC_STATE, {"version": version, "decisions": next_seq, "next_seq": {SITE: next_seq},
                                                "refused": {}, "buffer": []})

    def refuse(self, seq: int, base_version: int, version: int) -> None:
        self.coordinator.put_json(refresh(SITE), {"recipient": SITE, "seq": seq, "base_version": base_version,
                                                  "version": version, "staleness": version - base_version,
                                                  "reason": "too stale"})

    # ------------------------------------------------------------------ the site's writes (what its tasks publish)
    def publish_update(self, rnd: int) -> None:
        self.site.put_state(update(rnd), tiny_state(), reference=tiny_state(), round=rnd, n_samples=1000,
                            base_sha256=BASE_SHA, metrics={"train_loss": 0.5}, ran_as=RAN_AS)

    def publish_async_update(self, seq: int, version: int) -> None:
        self.site.put_state(async_update(seq), tiny_state(), reference=tiny_state(), seq=seq, base_version=version,
                            n_samples=1000, base_sha256=BASE_SHA, metrics={"train_loss": 0.5}, ran_as=RAN_AS)

    def publish_validation(self, rnd: int) -> None:
        self.site.put_json(validation(rnd), {"site": SITE, "round": rnd, "metrics": {"withheld": "too few rows"}})
