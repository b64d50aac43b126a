"""A site's synchronous round loop (insitu.federated.site_rounds) against an exchange on an in-memory store;
the coordinator's side is played by the fake tasks."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent.futures import Future

import pytest
from in_memory_exchange import Exchanges

from insitu.federated.site_rounds import run_site_rounds, site_wait_timeout_s


@pytest.fixture
def exchanges() -> Iterator[Exchanges]:
    ex = Exchanges()
    yield ex
    ex.drop()


class Site:
    """The site's tasks as fakes: each call is recorded; training publishes the update, and the coordinator
    (``after_round``) answers it, by default with the next global model."""

    def __init__(self, ex: Exchanges, after_round: dict[int, str] | None = None) -> None:
        self.ex = ex
        self.calls: list[tuple[str, int]] = []
        self.after_round = after_round or {}

    def train(self, rnd: int, validated: Callable[[], None]) -> None:
        self.calls.append(("train", rnd))
        validated()
        self.ex.publish_update(rnd)
        answer = self.after_round.get(rnd, "next")
        if answer == "abort":
            self.ex.coordinator.put_abort("QuorumError: round 1: quorum not met")
        elif answer == "stop":
            self.ex.publish_global(rnd + 1)
            self.ex.stop(rnd)
        else:
            self.ex.publish_global(rnd + 1)

    def validate(self, rnd: int) -> None:
        self.calls.append(("validate", rnd))
        self.ex.publish_validation(rnd)


def test_rounds_run_in_order_each_from_the_global_model_the_coordinator_published(exchanges: Exchanges) -> None:
    exchanges.publish_global(0)
    site = Site(exchanges)
    done = run_site_rounds(exchanges.site, 3, train=site.train, validate=site.validate, wait_timeout_s=5)
    assert done == 3
    # each global model is validated before the site trains from it; the last one is only validated
    assert site.calls == [("validate", 0), ("train", 0), ("validate", 1), ("train", 1), ("validate", 2),
                          ("train", 2), ("validate", 3)]


def test_a_site_without_validation_rows_only_trains(exchanges: Exchanges) -> None:
    exchanges.publish_global(0)
    site = Site(exchanges)
    assert run_site_rounds(exchanges.site, 2, train=site.train, validate=None, wait_timeout_s=5) == 2
    assert site.calls == [("train", 0), ("train", 1)]


def test_a_resumed_run_skips_what_this_site_published_before(exchanges: Exchanges,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    # the run before published updates 0 and 1 and validated models 0 to 2 (it died training round 2)
    for rnd in range(3):
        exchanges.publish_global(rnd)
        exchanges.publish_validation(rnd)
    exchanges.publish_update(0)
    exchanges.publish_update(1)
    site = Site(exchanges)
    with caplog.at_level(logging.INFO):
        done = run_site_rounds(exchanges.site, 4, train=site.train, validate=site.validate, wait_timeout_s=5)
    assert done == 4  # the resumed rounds count: the site took part in them
    assert site.calls == [("train", 2), ("validate", 3), ("train", 3), ("validate", 4)]
    assert "round 0 already published by this site (resumed run); skipping" in caplog.text
    assert "round 1 already published by this site (resumed run); skipping" in caplog.text


def test_the_abort_marker_ends_the_loop_with_its_reason(exchanges: Exchanges,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    exchanges.publish_global(0)
    site = Site(exchanges, after_round={1: "abort"})
    done = run_site_rounds(exchanges.site, 5, train=site.train, validate=site.validate, wait_timeout_s=5)
    assert done == 2
    assert site.calls == [("validate", 0), ("train", 0), ("validate", 1), ("train", 1)]
    assert "coordinator aborted job job-1 after 2 rounds here: QuorumError: round 1: quorum not met" in caplog.text


def test_the_abort_marker_wins_over_published_weights(exchanges: Exchanges) -> None:
    # a re-run of an aborted job: its weights are there, but so is the marker (until the coordinator clears it)
    exchanges.publish_global(0)
    exchanges.coordinator.put_abort("RuntimeError: boom")
    site = Site(exchanges)
    assert run_site_rounds(exchanges.site, 3, train=site.train, validate=site.validate, wait_timeout_s=5) == 0
    assert site.calls == []


def test_the_stop_marker_ends_training_early(exchanges: Exchanges, caplog: pytest.LogCaptureFixture) -> None:
    exchanges.publish_global(0)
    site = Site(exchanges, after_round={1: "stop"})
    with caplog.at_level(logging.INFO):
        done = run_site_rounds(exchanges.site, 5, train=site.train, validate=site.validate, wait_timeout_s=5)
    assert done == 2 and site.calls[-1] == ("train", 1)
    assert "coordinator stopped job job-1 early after 2 rounds here: no improvement" in caplog.text


def test_no_global_model_in_time_is_a_timeout_naming_the_round(exchanges: Exchanges) -> None:
    exchanges.publish_global(0)
    trained: list[int] = []  # the coordinator never answers round 0's update
    with pytest.raises(TimeoutError, match=r"site eu: no global weights for round-0001 after 0s"):
        run_site_rounds(exchanges.site, 3, train=lambda rnd, _: trained.append(rnd), validate=None, wait_timeout_s=0.01)
    assert trained == [0]


def test_sites_wait_longer_than_the_coordinator_gives_a_round() -> None:
    assert site_wait_timeout_s(60.0) == 420.0
    assert site_wait_timeout_s(600.0) > 600.0


# --------------------------------------------------------------------------- going on to the next phase
THIS_RUN, EARLIER_RUN = "0b6f3c1e-7a1d-4c55-9d2e-3f1a2b3c4d5e", "9e8d7c6b-5a49-4837-a261-504f3e2d1c0b"


def _dispatch_evaluate(exchanges: Exchanges, flow_run_id: str) -> None:
    from in_memory_exchange import SITE

    from insitu.federated.paths import dispatch
    from insitu.governance.dispatch import dispatch_record

    params = {"job_id": exchanges.site.job_id, "dataset": "fraud", "training": "fraud", "weights": ["round-0003"]}
    exchanges.coordinator.put_json(dispatch("evaluate", SITE), dispatch_record(SITE, "evaluate", flow_run_id, params))


def test_a_run_goes_on_to_the_next_phase_only_when_the_coordinator_names_it(exchanges: Exchanges) -> None:
    import threading

    from insitu.federated.site_rounds import wait_for_dispatch

    _dispatch_evaluate(exchanges, EARLIER_RUN)  # a resumed job: the earlier attempt's record
    threading.Timer(0.3, _dispatch_evaluate, (exchanges, THIS_RUN)).start()
    record = wait_for_dispatch(exchanges.site, "evaluate", THIS_RUN, timeout_s=5)
    assert record is not None and record["flow_run_id"] == THIS_RUN
    assert record["parameters"]["weights"] == ["round-0003"]


def test_a_run_dispatched_nothing_times_out_naming_the_phase_and_an_aborted_job_ends_the_wait(
        exchanges: Exchanges) -> None:
    from insitu.federated.site_rounds import wait_for_dispatch

    _dispatch_evaluate(exchanges, EARLIER_RUN)
    with pytest.raises(TimeoutError, match=f"did not dispatch evaluate .* to flow run {THIS_RUN}"):
        wait_for_dispatch(exchanges.site, "evaluate", THIS_RUN, timeout_s=0.3)
    with pytest.raises(TimeoutError, match="outside a flow run"):
        wait_for_dispatch(exchanges.site, "evaluate", None, timeout_s=5)
    exchanges.coordinator.put_abort("QuorumError: round 2: quorum not met")
    assert wait_for_dispatch(exchanges.site, "evaluate", THIS_RUN, timeout_s=5) is None


def test_a_round_trains_while_its_validation_runs_and_publishes_its_update_after_it(exchanges: Exchanges) -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from insitu.federated.paths import validation

    exchanges.publish_global(0)
    site = Site(exchanges)
    training = {rnd: threading.Event() for rnd in range(2)}
    seen: list[tuple[int, bool]] = []

    def validate(rnd: int) -> Future[None]:
        def score() -> None:  # holds its round's validation until that round is training
            if rnd in training:
                assert training[rnd].wait(5), f"round {rnd} did not train while its validation ran"
            site.validate(rnd)
        return pool.submit(score)

    def train(rnd: int, validated: Callable[[], None]) -> None:
        training[rnd].set()
        validated()
        seen.append((rnd, exchanges.site.exists(validation(rnd))))
        site.train(rnd, validated)

    with ThreadPoolExecutor(1) as pool:
        assert run_site_rounds(exchanges.site, 2, train=train, validate=validate, wait_timeout_s=5) == 2
    assert seen == [(0, True), (1, True)]  # each update published after its round's validation
    assert exchanges.site.exists(validation(2))  # the last global model's, waited for before the loop ended


def test_a_failed_validation_publishes_no_update_and_says_which_round(exchanges: Exchanges) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from insitu.federated.paths import update
    from insitu.federated.site_rounds import ValidationFailed

    exchanges.publish_global(0)
    site = Site(exchanges)

    def broken() -> None:
        raise OSError("the site's store went away")

    with ThreadPoolExecutor(1) as pool, pytest.raises(ValidationFailed, match="validation of global model 0 failed: "
                                                                              "the site's store went away"):
        run_site_rounds(exchanges.site, 2, train=site.train, validate=lambda r: pool.submit(broken),
                        wait_timeout_s=5)
    assert site.calls == [("train", 0)] and not exchanges.site.exists(update(0).manifest)
