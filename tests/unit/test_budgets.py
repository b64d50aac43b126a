"""Per-writer, per-kind byte budgets on the exchange, and the coordinator's stop when a site exceeds one."""

from __future__ import annotations

from pathlib import Path

import pytest
from protocol_examples import evaluation, prepare_stats, publish_global, publish_update, store

from insitu.federated.exchange import Exchange, ExchangeError, enforce_protocol
from insitu.federated.kinds import (
    KIB,
    MAX_MANIFEST_BYTES,
    SITE_BUDGETS,
    UPDATE_BYTES_FACTOR,
    VALIDATION_BYTES,
    ProtocolViolation,
    check_budgets,
    site_budgets,
)


def test_budgets_per_kind() -> None:
    assert SITE_BUDGETS == {"stats": 64 * KIB, "metrics": 256 * KIB}
    b = site_budgets(rounds=3, model_bytes=10_000)
    # metrics: the evaluation plus one validation per global model (rounds 0 … 3)
    assert b == {"stats": 64 * KIB, "metrics": 256 * KIB + 4 * VALIDATION_BYTES,
                 "update": 3 * (UPDATE_BYTES_FACTOR * 10_000 + MAX_MANIFEST_BYTES)}
    assert site_budgets(0, 10_000)["update"] == 0


def test_check_budgets_names_each_writer_and_kind_over_budget() -> None:
    budgets = {"stats": 100, "metrics": 200, "update": 1000}
    ledger = {
        "coordinator": {"weights": 10**9, "summary": 10**6},  # the coordinator's own prefix is not budgeted
        "eu": {"stats": 100, "metrics": 200, "update": 1000},  # exactly at the budget: fine
        "us": {"stats": 101, "update": 5000},
        "apac": {"plan": 1, "rows": 7},  # kinds a site may not write at all
    }
    assert check_budgets(ledger, budgets) == [
        "'apac' has 1 bytes of 'plan' on the exchange; sites may not write that kind",
        "'apac' has 7 bytes of 'rows' on the exchange; sites may not write that kind",
        "'us' has 101 bytes of 'stats' on the exchange; its budget is 100",
        "'us' has 5,000 bytes of 'update' on the exchange; its budget is 1,000",
    ]
    assert check_budgets({"eu": {"stats": 1}}, budgets) == []
    assert check_budgets({}, budgets) == []
    # a kind the site chose to look like data is not echoed
    assert check_budgets({"eu": {"4111111111111111,12.50": 3}}, budgets) == [
        "'eu' has 3 bytes of <22 characters> on the exchange; sites may not write that kind"]


def test_a_job_that_keeps_to_the_protocol_passes(tmp_path: Path) -> None:
    ref, base = publish_global(tmp_path)
    for site in ("eu", "us"):
        Exchange(store(tmp_path), "job-1", site).put_json("stats", "prepare.json", prepare_stats(site))
        publish_update(tmp_path, site, 0, ref, ref, base)
        Exchange(store(tmp_path), "job-1", site).put_json("metrics", "evaluate.json", evaluation(site))
    coord = Exchange(store(tmp_path), "job-1", "coordinator")
    model_bytes = coord.get_json("weights", "round-0000.manifest.json")["bytes"]
    enforce_protocol(coord, site_budgets(1, model_bytes), "evaluate")


def test_enforce_protocol_stops_the_job_naming_what_is_wrong(tmp_path: Path) -> None:
    ref, base = publish_global(tmp_path)
    publish_update(tmp_path, "eu", 0, ref, ref, base)
    eu = Exchange(store(tmp_path), "job-1", "eu")
    eu._put_bytes("metrics", "evaluate.json", b" " * (256 * KIB + 2 * VALIDATION_BYTES + 1))
    eu._put_bytes("stats", "rows.parquet", b"PAR1")
    coord = Exchange(store(tmp_path), "job-1", "coordinator")
    model_bytes = coord.get_json("weights", "round-0000.manifest.json")["bytes"]
    with pytest.raises(ProtocolViolation) as e:
        enforce_protocol(coord, site_budgets(1, model_bytes), "evaluate")
    assert str(e.value).startswith("evaluate: the exchange holds what the protocol does not allow; the job stops: ")
    assert "'eu' has 393,217 bytes of 'metrics' on the exchange; its budget is 393,216" in str(e.value)
    assert "stats/eu/rows.parquet is not an artefact of the protocol" in str(e.value)
    # a second round's update is over a budget sized for one round
    publish_update(tmp_path, "eu", 1, ref, ref, base)
    eu._put_bytes("metrics", "evaluate.json", b"{}")
    eu.fs.rm_file(eu.store.path("jobs/job-1/stats/eu/rows.parquet"))
    enforce_protocol(coord, site_budgets(2, model_bytes), "round 1")
    with pytest.raises(ProtocolViolation, match="bytes of 'update'"):
        enforce_protocol(coord, {**site_budgets(2, model_bytes), "update": model_bytes}, "round 1")


def test_the_coordinator_reads_evaluations_only_after_the_budget_check(tmp_path: Path) -> None:
    from tasks.evaluate import evaluations

    ref, base = publish_global(tmp_path)
    for site in ("eu", "us"):
        publish_update(tmp_path, site, 0, ref, ref, base)
    Exchange(store(tmp_path), "job-1", "eu").put_json("metrics", "evaluate.json", evaluation("eu"))
    Exchange(store(tmp_path), "job-1", "us").put_json(
        "metrics", "evaluate.json", evaluation("us", {"round-0002": {"withheld": "fewer than 20 rows"}}))
    coord = Exchange(store(tmp_path), "job-1", "coordinator")
    got = evaluations(coord, ["eu", "us"], rounds=1)
    assert got["us"] == {"round-0002": {"withheld": "fewer than 20 rows"}} and got["eu"]["round-0002"]["count"] == 100
    # a state file far larger than the global model's, under a protocol name: over budget, nothing is read
    Exchange(store(tmp_path), "job-1", "us")._put_bytes("update", "round-0001.pt", b"x" * 100_000)
    with pytest.raises(ProtocolViolation, match="evaluate: .*'us' has [\\d,]+ bytes of 'update'"):
        evaluations(coord, ["eu", "us"], rounds=1)
    Exchange(store(tmp_path), "job-1", "us").fs.rm_file(store(tmp_path).path("jobs/job-1/update/us/round-0001.pt"))
    # and what is read is checked against the schema
    Exchange(store(tmp_path), "job-1", "eu")._put_bytes(
        "metrics", "evaluate.json", b'{"site": "eu", "models": {}, "scores": [0.1, 0.9]}')
    with pytest.raises(ExchangeError, match="metrics/evaluate.json of eu .*scores: key not allowed"):
        evaluations(coord, ["eu", "us"], rounds=1)
