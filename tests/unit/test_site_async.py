"""A site's side of an async job (insitu.federated.asynchronous.site) against an exchange on an in-memory store.

The coordinator's decisions are played by the tests, on a fake clock: an answer can be made to arrive only after
the site has polled for it a given number of times, which is how "the site waits" is observed without threads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest
from in_memory_exchange import SITE, Exchanges

from insitu.federated.asynchronous import site as site_protocol
from insitu.federated.asynchronous.site import next_async_seq, run_site_updates, wait_for_decision


@pytest.fixture
def exchanges() -> Iterator[Exchanges]:
    ex = Exchanges()
    yield ex
    ex.drop()


class Coordinator:
    """A fake clock whose ``sleep`` lets the coordinator's pending answers arrive, one per given number of polls."""

    def __init__(self, ex: Exchanges, target: int) -> None:
        self.ex, self.target = ex, target
        self.now = 0.0
        self.sleeps = 0
        self.pending: list[tuple[int, Callable[[], None]]] = []  # (at which sleep, what the coordinator writes)

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps += 1
        for due in [p for p in self.pending if p[0] <= self.sleeps]:
            self.pending.remove(due)
            due[1]()

    def later(self, polls: int, answer: Callable[[], None]) -> None:
        self.pending.append((self.sleeps + polls, answer))

    def apply(self, seq: int, version: int) -> None:
        """The site's update ``seq`` made global ``version``: the state is written first, then the pointer."""
        self.ex.publish_async_state(version, seq + 1)
        self.ex.publish_newest(version, self.target)


class Site:
    """The site's tasks as fakes: calls recorded, training publishes the update, then ``on_train`` answers."""

    def __init__(self, ex: Exchanges, on_train: Callable[[int, int], None]) -> None:
        self.ex, self.on_train = ex, on_train
        self.trained: list[tuple[int, int]] = []
        self.validated: list[int] = []

    def train(self, seq: int, version: int, validated: Callable[[], None]) -> None:
        validated()
        self.trained.append((seq, version))
        assert len(self.trained) <= 5, f"the site kept training: {self.trained}"  # a broken loop fails, not hangs
        self.ex.publish_async_update(seq, version)
        self.on_train(seq, version)

    def validate(self, version: int) -> None:
        self.validated.append(version)
        self.ex.publish_validation(version)


def run(ex: Exchanges, site: Site, coordinator: Coordinator, limit: int = 10, timeout_s: float = 30.0) -> int:
    return run_site_updates(ex.site, limit, train=site.train, validate=site.validate, wait_timeout_s=timeout_s,
                            clock=coordinator.clock, sleep=coordinator.sleep)


def test_one_update_in_flight_the_next_trains_from_the_version_its_decision_made(exchanges: Exchanges,
                                                                                 caplog: pytest.LogCaptureFixture
                                                                                 ) -> None:
    coordinator = Coordinator(exchanges, target=2)
    exchanges.publish_newest(0, 2)
    # the coordinator decides each update only after the site polled three times
    site = Site(exchanges, lambda seq, version: coordinator.later(3, lambda: coordinator.apply(seq, version + 1)))
    with caplog.at_level(logging.INFO):
        pushed = run(exchanges, site, coordinator)
    assert pushed == 2
    assert site.trained == [(0, 0), (1, 1)]  # never a second update before the first was decided
    assert coordinator.sleeps == 6
    assert site.validated == [0, 1, 2]  # every version pulled, the final one included
    assert "version 2 reached: site eu stops after 2 update(s)" in caplog.text


def test_the_site_waits_for_the_newest_pointer_to_catch_up_with_the_decision(exchanges: Exchanges) -> None:
    # The coordinator writes its state (update 0 decided, version 1 made) before the newest pointer: a site that
    # pulled in between would train its next update from version 0, the one its own update replaced.
    coordinator = Coordinator(exchanges, target=2)
    exchanges.publish_newest(0, 2)

    def decide(seq: int, version: int) -> None:
        exchanges.publish_async_state(version + 1, seq + 1)
        coordinator.later(2, lambda: exchanges.publish_newest(version + 1, 2))

    site = Site(exchanges, decide)
    assert run(exchanges, site, coordinator) == 2
    assert site.trained == [(0, 0), (1, 1)]
    assert coordinator.sleeps == 4


def test_a_refusal_is_noted_once_and_the_site_trains_from_the_newest_version(exchanges: Exchanges,
                                                                             caplog: pytest.LogCaptureFixture
                                                                             ) -> None:
    coordinator = Coordinator(exchanges, target=6)
    exchanges.publish_newest(3, 6)  # other sites made versions 1 to 3 already

    def decide(seq: int, version: int) -> None:
        if seq == 0:  # too stale by the time it is read: refused, and the others moved the job to version 4
            exchanges.refuse(0, base_version=version, version=4)
            coordinator.apply(seq, 4)
        else:
            coordinator.apply(seq, version + 1)

    site = Site(exchanges, decide)
    assert run(exchanges, site, coordinator) == 3
    assert site.trained == [(0, 3), (1, 4), (2, 5)]
    notices = [r.message for r in caplog.records if "was refused" in r.message]
    assert notices == ["site eu: update 0 was refused by the coordinator (too stale); refreshing to version 4"]


def test_a_site_at_its_update_limit_only_waits_for_the_final_version(exchanges: Exchanges,
                                                                     caplog: pytest.LogCaptureFixture,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(site_protocol, "AT_LIMIT_POLL_S", 0.01)
    coordinator = Coordinator(exchanges, target=3)
    exchanges.publish_newest(0, 3)
    site = Site(exchanges, lambda seq, version: coordinator.apply(seq, version + 1))
    validate = site.validate

    def validate_then_others_finish(version: int) -> None:
        validate(version)
        if version == 1:  # while this site waits at its limit, the other sites drive the job to its target
            exchanges.publish_newest(3, 3)

    site.validate = validate_then_others_finish  # type: ignore[method-assign]
    assert run(exchanges, site, coordinator, limit=1) == 1
    assert site.trained == [(0, 0)] and site.validated == [0, 1, 3]
    assert "site eu pushed its 1 updates (the limit of this job); waiting for the final version" in caplog.text


def test_a_rerun_continues_the_numbering_and_validates_each_version_once(exchanges: Exchanges) -> None:
    exchanges.publish_async_update(0, 0)
    exchanges.publish_async_update(1, 1)
    exchanges.publish_validation(2)
    assert next_async_seq(exchanges.site) == 2
    coordinator = Coordinator(exchanges, target=3)
    exchanges.publish_newest(2, 3)
    site = Site(exchanges, lambda seq, version: coordinator.apply(seq, version + 1))
    assert run(exchanges, site, coordinator) == 1
    assert site.trained == [(2, 2)] and site.validated == [3]


def test_abort_ends_the_loop_and_an_undecided_update_is_waited_for_only_until_the_timeout(
        exchanges: Exchanges, caplog: pytest.LogCaptureFixture) -> None:
    coordinator = Coordinator(exchanges, target=5)
    exchanges.publish_newest(0, 5)

    def never_decide(seq: int, version: int) -> None:
        if seq == 1:
            exchanges.coordinator.put_abort("StalledError: no update arrived")

    site = Site(exchanges, never_decide)
    assert run(exchanges, site, coordinator, timeout_s=2.9) == 2
    # update 0 was never decided: after the timeout the site went on, from the newest version there was
    assert site.trained == [(0, 0), (1, 0)]
    assert coordinator.now >= 2.9 and coordinator.sleeps == 10
    assert "coordinator aborted job job-1 after 2 update(s) here: StalledError: no update arrived" in caplog.text


def test_the_decision_wait_returns_on_abort_or_the_target_version(exchanges: Exchanges) -> None:
    coordinator = Coordinator(exchanges, target=2)
    exchanges.publish_newest(2, 2)  # the job reached its target: nothing left to wait for
    wait_for_decision(exchanges.site, 0, 30.0, clock=coordinator.clock, sleep=coordinator.sleep)
    exchanges.publish_newest(1, 2)
    exchanges.coordinator.put_abort("RuntimeError: boom")
    wait_for_decision(exchanges.site, 0, 30.0, clock=coordinator.clock, sleep=coordinator.sleep)
    assert coordinator.sleeps == 0


def test_no_global_version_in_time_is_a_timeout(exchanges: Exchanges) -> None:
    site = Site(exchanges, lambda seq, version: None)
    with pytest.raises(TimeoutError, match=f"site {SITE}: no global version published after 0s"):
        run_site_updates(exchanges.site, 10, train=site.train, validate=None, wait_timeout_s=0.01)
    assert site.trained == []
