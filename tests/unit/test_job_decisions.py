"""The coordinator's decisions before and between the phases of a job: the quorum (insitu.federated.quorum) and
the request a job runs under (insitu.governance.job_request)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from insitu.federated.integrity import aggregated_sha256, registration_refusal
from insitu.federated.quorum import quorum_refusal
from insitu.governance.job_request import job_request
from insitu.governance.request import RequestError, SignedRequest, new_request

HASH = "a" * 64
NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def signed(job_id: str | None = "job-1", dataset: str = "fraud", overrides: dict[str, int] | None = None,
           override_bounds: dict[str, dict[str, int]] | None = None) -> SignedRequest:
    # The coordinator holds no key and checks no signature (each site does): any well-formed one will do here.
    request = new_request("alice", dataset, "fraud", HASH, "fraud detection", job_id=job_id, overrides=overrides,
                          override_bounds=override_bounds, now=NOW - timedelta(hours=1))
    return SignedRequest(request=request, signature="0" * 128)


def test_the_quorum_holds_with_min_sites() -> None:
    assert quorum_refusal("prepare", ["eu", "us"], {"apac": "Crashed"}, 2) is None
    assert quorum_refusal("evaluate", ["eu"], {}, 1) is None


def test_below_the_quorum_the_phase_stops_naming_every_failed_site() -> None:
    assert quorum_refusal("evaluate", ["eu"], {"us": "Crashed", "apac": "timed out after 30s"}, 2) == (
        "evaluate: only 1 site(s) succeeded (['eu']) < min_sites=2. Failed: us: Crashed; apac: timed out after 30s")


def test_a_request_that_covers_the_job_is_the_one_it_runs_under() -> None:
    request = signed(overrides={"rounds": 3})
    assert job_request(request, job_id="job-1", training="fraud", dataset="fraud", training_hash=HASH,
                       overrides={"rounds": 3}, now=NOW) is request
    standing = signed(job_id=None, override_bounds={"rounds": {"min": 1, "max": 5}})
    assert job_request(standing, job_id="any-job", training="fraud", dataset="fraud", training_hash=HASH,
                       overrides={"rounds": 4}, now=NOW) is standing


def test_no_request_says_how_to_get_one() -> None:
    with pytest.raises(RequestError, match=r"no signed request and no standing approval for training 'fraud' on "
                                           r"dataset 'fraud': start the job with `insitu run --as NAME`.*"
                                           r"`insitu approve --as NAME --training fraud --dataset fraud --purpose …`"):
        job_request(None, job_id="job-1", training="fraud", dataset="fraud", training_hash=HASH, overrides={})


@pytest.mark.parametrize(("field", "value", "why"), [
    ("job_id", "job-2", "the request was signed for job job-1, not job-2"),
    ("dataset", "digits", "the request was signed for dataset 'fraud', not 'digits'"),
    ("training_hash", "b" * 64, "changed since it was signed"),
    ("overrides", {"rounds": 9}, "rounds"),
])
def test_a_request_that_does_not_cover_the_run_is_refused_with_its_rule(field: str, value: object, why: str) -> None:
    run = {"job_id": "job-1", "training": "fraud", "dataset": "fraud", "training_hash": HASH, "overrides": {}}
    run[field] = value
    with pytest.raises(RequestError, match=r"^the job's request does not cover this run: .*; rule \S+$") as e:
        job_request(signed(), now=NOW, **run)  # type: ignore[arg-type]
    assert why in str(e.value)


def test_an_expired_request_is_refused() -> None:
    with pytest.raises(RequestError, match="the job's request does not cover this run: the request is valid from"):
        job_request(signed(), job_id="job-1", training="fraud", dataset="fraud", training_hash=HASH, overrides={},
                    now=NOW + timedelta(days=2))


def test_only_the_weights_this_coordinator_aggregated_are_registered() -> None:
    results = [{"sha256": "1" * 64}, {"sha256": "2" * 64}]
    assert aggregated_sha256(results, 2) == "2" * 64
    assert aggregated_sha256(results, 0) is None  # the initial weights: no round made them
    assert registration_refusal("round-0002", "2" * 64, "2" * 64) is None
    assert registration_refusal("round-0000", "9" * 64, None) is None
    assert registration_refusal("round-0002", "9" * 64, "2" * 64) == (
        "the weights of round-0002 on the exchange (999999999999…) are not the ones this coordinator aggregated "
        "(222222222222…); refusing to register them")
