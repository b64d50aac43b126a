"""How far a followed job is, shown as a live bar on a terminal or as plain lines elsewhere (CI logs, a pipe).

The counts come from what the job left behind (completed site runs, the coordinator's global models, its
summary), so a resumed job starts with the work its earlier attempt did; each is clamped to what the job can
reach (a site's preparation re-run on resume counts once, a round redone counts once).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn


@dataclass(frozen=True)
class JobProgress:
    """One look at a running job."""

    state: str  # the retrain flow run's state name (Pending, Running, …)
    prepared: int  # sites that published their preparation
    rounds_done: int  # global models the coordinator published after the initial one
    evaluated: int  # sites that published their evaluation
    registered: bool  # the coordinator wrote the job's summary


@dataclass(frozen=True)
class JobShape:
    """What the job will do: prepare on each site, the rounds, evaluate on each site, register."""

    sites: int
    rounds: int

    @property
    def total(self) -> int:
        return 2 * self.sites + self.rounds + 1

    def clamp(self, p: JobProgress) -> JobProgress:
        return JobProgress(p.state, min(p.prepared, self.sites), min(p.rounds_done, self.rounds),
                           min(p.evaluated, self.sites), p.registered)

    def completed(self, p: JobProgress) -> int:
        c = self.clamp(p)
        return c.prepared + c.rounds_done + c.evaluated + int(c.registered)

    def phase(self, p: JobProgress) -> str:
        """The step under way, judged by the furthest one that left evidence (a site that failed to prepare
        within the quorum leaves ``prepared`` short for good)."""
        c = self.clamp(p)
        if c.registered:
            return "registered"
        if c.evaluated == self.sites:
            return "register"
        if c.evaluated or c.rounds_done == self.rounds:
            return "evaluate"
        if c.rounds_done or c.prepared == self.sites:
            return f"round {c.rounds_done + 1}/{self.rounds}"
        return "prepare"


def plain_updates(shape: JobShape, before: JobProgress | None, now: JobProgress) -> list[str]:
    """What changed between two looks, one line per step done (``train: round 3/5 done``)."""
    b = shape.clamp(before) if before else JobProgress("", 0, 0, 0, False)
    n = shape.clamp(now)
    lines = [f"retrain: {n.state}"] if n.state != b.state else []
    if n.prepared > b.prepared:
        lines.append(f"prepare: {n.prepared}/{shape.sites} sites done")
    lines += [f"train: round {r}/{shape.rounds} done" for r in range(b.rounds_done + 1, n.rounds_done + 1)]
    if n.evaluated > b.evaluated:
        lines.append(f"evaluate: {n.evaluated}/{shape.sites} sites done")
    if n.registered and not b.registered:
        lines.append("register: done")
    return lines


class LiveProgress:
    """A rich progress bar (on a terminal)."""

    def __init__(self, console: Console, shape: JobShape) -> None:
        self.shape = shape
        self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                            TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), console=console)
        self.task: TaskID | None = None

    def __enter__(self) -> LiveProgress:
        self.bar.__enter__()
        self.task = self.bar.add_task("retrain: starting", total=self.shape.total)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.bar.__exit__(kind, exc, tb)

    def update(self, p: JobProgress) -> None:
        assert self.task is not None, "use LiveProgress as a context manager"
        self.bar.update(self.task, completed=self.shape.completed(p),
                        description=f"retrain [{p.state}]: {self.shape.phase(p)}")


class PlainProgress:
    """A line per step done, with the seconds since following began (when output is not a terminal, where a
    live bar would print nothing until it ends)."""

    def __init__(self, console: Console, shape: JobShape, clock: Callable[[], float] = time.monotonic) -> None:
        self.console, self.shape, self.clock = console, shape, clock
        self.start = clock()
        self.last: JobProgress | None = None

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        return None

    def update(self, p: JobProgress) -> None:
        elapsed = self.clock() - self.start
        for line in plain_updates(self.shape, self.last, p):
            self.console.print(f"[{elapsed:.0f}s] {line}", markup=False, highlight=False)
        self.last = p


def progress_for(console: Console, shape: JobShape) -> LiveProgress | PlainProgress:
    return LiveProgress(console, shape) if console.is_terminal else PlainProgress(console, shape)
