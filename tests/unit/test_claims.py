"""A lying site's numbers: update row counts bounded by its prepare statistics, metrics by their ranges and its
committed split rows; refused on the coordinator's side with the rule, and the job's own records unbroken."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from protocol_examples import model_metrics, prepare_stats, store

from insitu.conf import AsyncConfig, TrainingConfig
from insitu.conf.training import default_aggregator
from insitu.federated.asynchronous import build_algorithm
from insitu.federated.asynchronous.server import ParameterServer
from insitu.federated.claims import (
    METRICS_RULE,
    N_SAMPLES_RULE,
    committed_rows,
    metrics_refusal,
    n_samples_refusal,
    screen_metrics,
)
from insitu.federated.documents.manifests import WeightsManifest
from insitu.federated.exchange import Exchange
from insitu.federated.kinds import COORDINATOR
from insitu.federated.paths import async_update, global_weights
from insitu.federated.rounds import round_name, run_round

GLOBAL = {"w": torch.zeros(2)}
COMMITTED = {"train": 700, "val": 150, "test": 150}


def test_committed_rows_are_the_split_counts_bounded_by_the_train_statistics() -> None:
    stats = prepare_stats("eu", n=100)
    assert committed_rows(stats) == {"train": 100, "val": 0, "test": 0}
    assert committed_rows({**stats, "train_stats": {**stats["train_stats"], "n": 60}})["train"] == 60


def test_an_update_may_claim_up_to_the_committed_train_rows() -> None:
    assert n_samples_refusal("eu", "the update of round 0", 700, COMMITTED) is None
    r = n_samples_refusal("eu", "the update of round 0", 10**15, COMMITTED)
    assert r is not None and r.rule == N_SAMPLES_RULE and r.claimed == 1e15 and r.committed == 700
    assert "eu" in r.reason and "1,000,000,000,000,000" in r.reason and "700 train rows" in r.reason
    assert r.as_audit()["rule"] == N_SAMPLES_RULE
    r = n_samples_refusal("eu", "the update of round 0", 5, None)  # committed nothing: refused too
    assert r is not None and r.committed is None and "no prepare statistics" in r.reason


@pytest.mark.parametrize(("change", "said"), [
    ({"pr_auc": 1.5}, "pr_auc 1.5 is outside [0, 1]"),
    ({"roc_auc": -0.1}, "roc_auc -0.1 is outside [0, 1]"),
    ({"loss": -1.0}, "loss -1 is negative"),
    ({"loss": math.inf}, "loss inf is infinite"),
    ({"count": 1e12}, "counts 1,000,000,000,000 rows; the site committed 150 val rows"),
    ({"count": 151.0}, "counts 151 rows"),
])
def test_metrics_out_of_their_range_are_refused(change: dict[str, float], said: str) -> None:
    r = metrics_refusal("apac", "the validation of global model 0", {**model_metrics(), **change}, "val", COMMITTED)
    assert r is not None and r.rule == METRICS_RULE and said in r.reason


def test_metrics_in_range_and_withheld_documents_pass() -> None:
    assert metrics_refusal("eu", "v", {**model_metrics(150.0), "roc_auc": math.nan}, "val", COMMITTED) is None
    assert metrics_refusal("eu", "v", {"withheld": "fewer than 50 rows"}, "val", COMMITTED) is None
    assert metrics_refusal("eu", "v", {"task": "regression", "r2": 1.2, "count": 100.0}, "test", COMMITTED) is not None
    kept, refused = screen_metrics({"eu": model_metrics(), "apac": {**model_metrics(), "count": 1e12}},
                                   {"eu": COMMITTED, "apac": COMMITTED}, "val", "v")
    assert list(kept) == ["eu"] and [r.site for r in refused] == ["apac"]


def _ex(tmp_path: Path, writer: str) -> Exchange:
    return Exchange(store(tmp_path), "job-1", writer)


def test_an_inflated_update_is_rejected_and_the_round_goes_on(tmp_path: Path) -> None:
    coord = _ex(tmp_path, COORDINATOR)
    base = coord.put_state("weights", round_name(0), GLOBAL, round=0)["sha256"]
    for site, value, n in (("eu", 1.0, 100), ("us", 3.0, 300), ("apac", -50.0, 10**15)):
        _ex(tmp_path, site).put_state("update", round_name(0), {"w": torch.full((2,), value)}, reference=GLOBAL,
                                      n_samples=n, round=0, base_sha256=base)
    committed = {"eu": {"train": 100}, "us": {"train": 300}, "apac": {"train": 200}}
    res = run_round(coord, 0, ["eu", "us", "apac"], min_sites=2, deadline_s=1, committed=committed)
    assert res.sites == ["eu", "us"] and res.missing == ["apac"] and N_SAMPLES_RULE in res.rejected["apac"]
    (claim,) = res.refused_claims
    assert (claim.site, claim.claimed, claim.committed) == ("apac", 1e15, 200.0)
    state, man = coord.get_state("weights", round_name(1))
    assert torch.allclose(state["w"], torch.full((2,), 2.5)) and man["n_samples"] == 400


def test_without_the_check_the_coordinators_own_manifest_still_holds_every_sites_claim(tmp_path: Path) -> None:
    """The old failure: three claims of 10^15 rows overflowed the global model's manifest and killed the job."""
    coord = _ex(tmp_path, COORDINATOR)
    base = coord.put_state("weights", round_name(0), GLOBAL, round=0)["sha256"]
    for site in ("eu", "us", "apac"):
        _ex(tmp_path, site).put_state("update", round_name(0), {"w": torch.ones(2)}, reference=GLOBAL,
                                      n_samples=10**15, round=0, base_sha256=base)
    res = run_round(coord, 0, ["eu", "us", "apac"], min_sites=2, deadline_s=1)
    assert res.n_samples == 3 * 10**15
    assert coord.get_json("weights", f"{round_name(1)}.manifest.json")["n_samples"] == 3 * 10**15
    WeightsManifest.model_validate({**coord.get_json("weights", f"{round_name(1)}.manifest.json"),
                                    "n_samples": 64 * 10**15})  # every site at the update bound still fits


def test_an_inflated_async_update_is_refused_with_its_claim(tmp_path: Path) -> None:
    coord = _ex(tmp_path, COORDINATOR)
    coord.put_state(global_weights(0), GLOBAL, round=0)
    server = ParameterServer(coord, build_algorithm(AsyncConfig()), ["eu", "us"], 3, update_limit=10,
                             committed={"eu": {"train": 100}, "us": {"train": 100}})
    eu = _ex(tmp_path, "eu")
    base, man = eu.get_state(global_weights(0), writer=COORDINATOR)
    eu.put_state(async_update(0), {"w": base["w"] + 1}, reference=base, seq=0, base_version=0, n_samples=10**9,
                 base_sha256=man["sha256"])
    (arrival,) = server.wait(2.0)
    pending = server.decide(arrival)
    assert not pending.receipt.accepted and N_SAMPLES_RULE in pending.receipt.reason
    assert pending.claim is not None and pending.claim.claimed == 1e9 and pending.claim.committed == 100
    assert server.commit(pending) is None and server.version == 0


def test_robust_aggregation_is_the_default_for_three_or_more_sites() -> None:
    unnamed = TrainingConfig.model_validate({"rounds": 2})
    assert default_aggregator(unnamed, 3).aggregator.name == "median"
    assert default_aggregator(unnamed, 2).aggregator.name == "fedavg"
    asynchronous = TrainingConfig.model_validate({"federation": {"mode": "async"}, "validation": {"select": "last"}})
    assert default_aggregator(asynchronous, 3).aggregator.name == "fedavg"
    named = TrainingConfig.model_validate({"aggregator": "fedavg"})
    assert default_aggregator(named, 5).aggregator.name == "fedavg"  # an explicit choice is kept



def test_the_coordinator_audits_a_refused_async_claim_with_its_numbers(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    import tasks.federation_async as federation_async

    coord = _ex(tmp_path, COORDINATOR)
    coord.put_state(global_weights(0), GLOBAL, round=0)
    server = ParameterServer(coord, build_algorithm(AsyncConfig()), ["eu", "us"], 3, update_limit=10,
                             committed={"eu": {"train": 100}, "us": {"train": 100}})
    eu = _ex(tmp_path, "eu")
    base, man = eu.get_state(global_weights(0), writer=COORDINATOR)
    eu.put_state(async_update(0), {"w": base["w"] + 1}, reference=base, seq=0, base_version=0, n_samples=10**9,
                 base_sha256=man["sha256"])
    events: list[tuple[str, dict[str, object]]] = []

    class Audit:
        def append(self, event: str, **fields: object) -> None:
            events.append((event, fields))

    monkeypatch.setattr(federation_async, "get_run_logger", lambda: logging.getLogger("test"))
    (arrival,) = server.wait(2.0)
    out = federation_async.apply_update.fn(server, arrival, Audit(), None)  # type: ignore[arg-type]
    assert not out["receipt"]["accepted"]
    ((event, fields),) = events
    assert event == "update.refused" and fields["site"] == "eu" and fields["rule"] == N_SAMPLES_RULE
    assert fields["claimed"] == 1e9 and fields["committed"] == 100 and fields["seq"] == 0
