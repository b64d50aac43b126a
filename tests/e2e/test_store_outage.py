"""A store that goes down and comes back under a running read or write: the call rides it out (tried again after
1, 2, 4, … s) and returns what an undisturbed call returns; past the store's ``outage_s`` it fails naming the
store and the bound.

The endpoint is the platform's S3 endpoint (``python -m deployments.platform.s3 --data DIR``), killed with SIGKILL
and started again on the same port and data, driven over HTTP by s3fs. The S3 client's own retries are turned
off here, so that what rides the outage out is insitu's, not botocore's (which covers seconds, not a restart).
A job riding out the exchange's and a site's store going down is ``test_control_plane_faults.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from s3_endpoint import S3Endpoint

from insitu.federated.exchange import Exchange
from insitu.federated.paths import PREPARE_STATS
from insitu.governance.iam import no_auth_action_count, provision, site_store_policy
from insitu.parallel.checkpoint import Checkpointer
from insitu.parallel.types import CheckpointRef
from insitu.storage import Store, StoreUnavailable

pytestmark = pytest.mark.e2e
BUCKET = "insitu-outage"


def _start(tmp_path: Path, port: int | None = None) -> S3Endpoint:
    """The platform's endpoint on ``tmp_path/data`` (provisioned once: a restart keeps its keys and objects)."""
    return S3Endpoint(tmp_path / "s3.log", no_auth_action_count(1), data=tmp_path / "data", port=port)


class Holder:
    """The endpoint now running (a restart replaces it) and the key the store was provisioned with."""

    def __init__(self, ep: S3Endpoint, keys: tuple[str, str]) -> None:
        self.ep, self.keys = ep, keys


def _store(holder: Holder, outage_s: float) -> Store:
    key, secret = holder.keys
    options: dict[str, Any] = {"key": key, "secret": secret, "client_kwargs": {"endpoint_url": holder.ep.url},
                               "skip_instance_cache": True, "config_kwargs": {"retries": {"total_max_attempts": 1}}}
    return Store(f"s3://{BUCKET}/", options, outage_s)


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[Holder]:
    ep = _start(tmp_path)
    holder = Holder(ep, provision(ep.url, BUCKET, {"owner": site_store_policy(BUCKET)})["owner"])
    yield holder
    holder.ep.stop()


def _down_for(holder: Holder, tmp_path: Path, seconds: float) -> threading.Thread:
    """Kill the endpoint now and start it again on its port and data after ``seconds``."""
    port = holder.ep.port
    holder.ep.kill()

    def back() -> None:
        time.sleep(seconds)
        holder.ep = _start(tmp_path, port)

    t = threading.Thread(target=back)
    t.start()
    return t


def test_reads_and_writes_ride_out_a_restart(endpoint: Holder, tmp_path: Path) -> None:
    store = _store(endpoint, 60)
    store.write_bytes("jobs/j/stats/eu/prepare.json", b'{"rows": 1}')
    ex = Exchange(store, "j", "eu")

    back = _down_for(endpoint, tmp_path, 5)
    began = time.monotonic()
    assert store.fs.cat_file(store.path("jobs/j/stats/eu/prepare.json")) == b'{"rows": 1}'
    assert time.monotonic() - began >= 3  # it was down, and the read waited for it
    back.join()

    back = _down_for(endpoint, tmp_path, 4)
    store.write_new("anchors/a.json", b"anchor")  # a conditional write rides it out too
    store.write_bytes("jobs/j/stats/eu/other.json", b"{}")
    back.join()
    assert store.fs.cat_file(store.path("anchors/a.json")) == b"anchor"

    back = _down_for(endpoint, tmp_path, 4)
    assert ex.exists(PREPARE_STATS)  # the exchange's own calls
    back.join()
    with pytest.raises(FileNotFoundError):  # a store that answered "not there" is not asked again
        store.fs.info(store.path("jobs/j/stats/eu/missing.json"))


def test_past_its_bound_a_store_that_stays_down_is_named(endpoint: Holder, tmp_path: Path) -> None:
    store = _store(endpoint, 5)
    endpoint.ep.kill()
    began = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        store.fs.cat_file(store.path("jobs/j/stats/eu/prepare.json"))
    assert time.monotonic() - began < 5 + 10  # the bound, and one refused call past it
    assert f"s3://{BUCKET}/" in str(caught.value) and "outage_s" in str(caught.value)
    endpoint.ep = _start(tmp_path, endpoint.ep.port)  # something for the fixture to stop


def test_a_checkpoint_the_store_cannot_take_is_skipped_and_the_previous_one_stays(endpoint: Holder,
                                                                                   tmp_path: Path) -> None:
    store = _store(endpoint, 5)
    ck = Checkpointer(CheckpointRef(store, "checkpoints/j/round-0000"))
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ck.save(model, opt, {"epoch": 0, "batch": 0, "global_step": 1})
    endpoint.ep.kill()
    ck.save(model, opt, {"epoch": 1, "batch": 0, "global_step": 2})  # the store is down: skipped, not raised
    endpoint.ep = _start(tmp_path, endpoint.ep.port)
    assert ck.latest() == {"epoch": 0, "batch": 0, "global_step": 1, "path": "checkpoints/j/round-0000/step-00000001"}
    assert ck.restore(model, opt) is not None
