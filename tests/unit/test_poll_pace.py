"""The worker's polling pace: every tick for a while after a run was submitted, started or ended; once per idle
interval otherwise."""

from deployments.poll_pace import PollPace


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def ticks(pace: PollPace, clock: Clock, seconds: int) -> int:
    """How many of ``seconds`` one-second ticks ask the API."""
    asked = 0
    for _ in range(seconds):
        asked += pace.due()
        clock.t += 1.0
    return asked


def test_an_idle_worker_asks_once_per_idle_interval_after_its_active_window() -> None:
    clock = Clock()
    pace = PollPace(idle_s=3.0, active_window_s=10.0, clock=clock)
    assert ticks(pace, clock, 10) == 10  # just started: runs may be waiting
    assert ticks(pace, clock, 30) == 10


def test_a_running_flow_run_does_not_keep_its_worker_asking_every_tick() -> None:
    """A site's one run does every phase of its job: while it goes, nothing else comes to its pool soon."""
    clock = Clock()
    pace = PollPace(idle_s=3.0, active_window_s=10.0, clock=clock)
    ticks(pace, clock, 20)
    pace.active()  # started
    assert ticks(pace, clock, 10) == 10  # just started: the pool may hold more of the job's runs
    assert ticks(pace, clock, 300) == 100
    pace.active()  # ended
    assert ticks(pace, clock, 10) == 10  # a phase's own run comes soon after a run ends
    assert ticks(pace, clock, 30) == 10


def test_a_submitted_run_makes_the_worker_active_again() -> None:
    clock = Clock()
    pace = PollPace(idle_s=3.0, active_window_s=10.0, clock=clock)
    ticks(pace, clock, 40)
    pace.active()
    assert ticks(pace, clock, 10) == 10
