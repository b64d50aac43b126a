"""``insitu validate``'s work: check every file of ``conf/`` offline, each mistake reported once.

One mistake can surface in many checks (a typo in ``datasets.yaml`` fails that file and then every training
config paired with the dataset); the first check to meet it shows it, later ones point back to it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from rich.markup import escape
from rich.table import Table

from insitu.conf import (
    ConfigError,
    ScheduleConfig,
    load_alerts,
    load_datasets,
    load_sites,
    load_training,
    trusted_training,
)
from insitu.job import ModelDoesNotFit, load_job
from insitu.specs import TASKS


class ConfReport:
    """A table of checks with their results, and the distinct mistakes found, in the order first met."""

    def __init__(self) -> None:
        self.table = Table("file", "result")
        self.mistakes: dict[str, str] = {}  # mistake -> the check that first reported it

    def check(self, name: str, fn: Callable[[], Any]) -> Any:
        """``fn()``'s result, or None when it fails (with the mistakes it names, each line one mistake)."""
        try:
            out = fn()
        except ModelDoesNotFit as e:  # a pair no one runs (a sequence model on a flat dataset): not a mistake
            self.note(name, f"not checked: the model does not fit this dataset's features: {escape(str(e))}")
            return None
        except (ConfigError, OSError) as e:
            self.table.add_row(name, self.failed(name, str(e)))
            return None
        self.table.add_row(name, "[green]ok[/green]")
        return out

    def failed(self, name: str, message: str) -> str:
        """Record ``message``'s mistakes for ``name``; what its row says (new mistakes, or where they were)."""
        new = [m for m in dict.fromkeys(message.splitlines()) if m not in self.mistakes]
        seen = {self.mistakes[m] for m in message.splitlines() if m in self.mistakes}
        for m in new:
            self.mistakes[m] = name
        text = "\n".join(f"[red]{escape(m)}[/red]" for m in new)
        if seen:
            text += ("\n" if text else "") + f"[red]fails on the mistake reported for {', '.join(sorted(seen))}[/red]"
        return text

    def note(self, name: str, text: str) -> None:
        self.table.add_row(name, f"[dim]{text}[/dim]")


def check_conf(conf: Path) -> ConfReport:
    """sites.yaml, datasets.yaml (whole and each dataset), each training config with each dataset, each schedule."""
    report = ConfReport()
    report.check("sites.yaml", lambda: load_sites(conf / "sites.yaml"))
    report.check("datasets.yaml", lambda: load_datasets(conf / "datasets.yaml"))
    report.check("alerts.yaml", lambda: load_alerts(conf / "alerts.yaml"))
    try:  # each dataset on its own too: a broken entry blocks only the jobs that name it
        names = sorted((yaml.safe_load((conf / "datasets.yaml").read_text()) or {}).get("datasets") or {})
    except (OSError, yaml.YAMLError, AttributeError):
        names = []
    for path in sorted((conf / "training").glob("*.yaml")):
        training = report.check(f"training/{path.name}", lambda p=path: load_training(p))
        if not training:
            continue
        for name in names:
            pair = f"training/{path.name} with dataset {name}"
            if not task_fits(conf, name, training):  # e.g. a multi-class config and a binary label
                report.note(pair, f"not checked: task {training.task.name} does not fit this dataset's label")
                continue
            report.check(pair, lambda p=path, n=name: load_job(p.stem, n, directory=conf).check_model())
    for name in names:
        try:
            schedules = load_datasets(conf / "datasets.yaml", only=name).datasets[name].schedules
        except (ConfigError, OSError, KeyError):
            continue  # its row above already says what is wrong with this dataset
        for i, s in enumerate(schedules):
            report.check(f"datasets.yaml schedule {name}[{i}]: training {s.training}, '{s.cron}' {s.timezone}",
                         lambda n=name, i=i, s=s: check_schedule(conf, n, i, s))
    return report


def task_fits(conf: Path, dataset: str, training: Any) -> bool:
    """Whether the training's task fits the dataset's label type (True when the dataset cannot be read: its
    own row says why, and the pair's check then names the problem too)."""
    try:
        schema = load_datasets(conf / "datasets.yaml", only=dataset).datasets[dataset].schema_
    except (ConfigError, OSError, KeyError):
        return True
    task = TASKS.get(training.task.name)  # an unknown name: the pair's check names it
    return task is None or schema.columns[schema.label].type in task.label_types


def check_schedule(conf: Path, dataset: str, index: int, schedule: ScheduleConfig) -> None:
    """One schedule of ``datasets.yaml``: its training is a config of ``conf/training/`` that loads with
    ``dataset``, and Prefect accepts its cron (what ``insitu deploy`` will ask of it).

    Raises
    ------
    ConfigError
        Naming the file, the schedule's key and the fix.
    """
    where = f"{conf / 'datasets.yaml'}: key 'datasets.{dataset}.schedules[{index}]"
    try:
        trusted_training(schedule.training, conf)
    except ConfigError as e:
        raise ConfigError(f"{where}.training': {e}") from None
    try:
        load_job(schedule.training, dataset, directory=conf)
    except ConfigError as e:
        # The schedule's own line, then the training's mistakes on lines of their own: `validate` reports each
        # mistake once, and the training's are the same wherever they are met.
        raise ConfigError(f"{where}.training': training {schedule.training!r} does not load with dataset "
                          f"{dataset!r}; fix that config or name another\n{e}") from None
    from deployments.deploy import retrain_schedule  # imports Prefect: only when a schedule is declared

    try:
        retrain_schedule(dataset, schedule)
    except ValueError as e:
        raise ConfigError(f"{where}.cron': Prefect refuses it: {e}; see `man 5 crontab` for the five "
                          "fields") from None
