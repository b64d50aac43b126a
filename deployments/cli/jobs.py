"""``insitu deploy|run|demo|validate``: register the flows, run a job and follow it, check ``conf/``."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from deployments.cli import signing
from deployments.cli.common import (
    DEFAULT_CONF,
    DEFAULT_PURPOSE,
    DEFAULT_STATE,
    As,
    ConfDir,
    Purpose,
    StateDir,
    console,
    open_platform,
    print_urls,
    quiet_logs,
    require_up,
)
from deployments.cli.conf_check import check_conf
from deployments.cli.data import seed
from deployments.cli.job_run import JobRun, new_job_id, run_and_follow
from deployments.cli.platform import up
from deployments.cli.summary import print_summary
from insitu.conf import load_alerts, load_datasets


def deploy(state_dir: StateDir = DEFAULT_STATE, conf: ConfDir = DEFAULT_CONF) -> None:
    """Register retrain on the coordinator pool (with the schedules of datasets.yaml) and the site flows on every
    site's pool."""
    quiet_logs()
    p = open_platform(state_dir, conf)
    require_up(p)
    from deployments.deploy import deploy_all

    datasets = load_datasets(p.conf_dir / "datasets.yaml")
    with console.status("registering deployments…"):
        names = deploy_all(p.sites, datasets)
    console.print(f"deployed {len(names)}: {', '.join(names)}")
    from deployments.alerts import ensure_alerts

    alerts = load_alerts(p.conf_dir / "alerts.yaml")
    sent = ensure_alerts(alerts)
    console.print(f"alerts: {', '.join(sent)} → {alerts.webhook.url}" if sent and alerts.webhook else
                  "alerts: none sent (no webhook in conf/alerts.yaml); they are still audited and emitted as events")
    for name, ds in datasets.datasets.items():
        for s in ds.schedules:
            state = "" if s.active else " (paused)"
            # A scheduled run has nobody to sign it: without a standing approval of the pair it fails at once.
            console.print(f"schedule: training {s.training} on dataset {name}, '{s.cron}' {s.timezone}{state}; "
                          f"runs under `insitu approve --training {s.training} --dataset {name}`")


def run(
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
    training: Annotated[str, typer.Option(help="a training config: a name in conf/training/")] = "fraud",
    dataset: Annotated[str, typer.Option(help="a dataset of conf/datasets.yaml")] = "fraud",
    rounds: Annotated[int | None, typer.Option(help="override the training config's rounds")] = None,
    job_id: Annotated[str | None, typer.Option(help="job id (reuse one to resume)")] = None,
    as_: As = None,
    purpose: Purpose = DEFAULT_PURPOSE,
) -> None:
    """Sign a job request as a principal, trigger `retrain` through the Prefect API, follow it, print the summary.

    Without --as (and without $INSITU_PRINCIPAL_KEY) the job runs under the training's standing approval.
    """
    quiet_logs()
    p = open_platform(state_dir, conf)
    require_up(p)
    job = JobRun(training, dataset, job_id or new_job_id(), rounds, as_, purpose, state_dir, conf)
    print_summary(run_and_follow(p, job))
    print_urls(p)


def demo(
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
    rows: Annotated[int, typer.Option(help="rows per site")] = 20000,
    rounds: Annotated[int | None, typer.Option(help="override the training config's rounds")] = None,
) -> None:
    """The main job on the local platform: up, seed, deploy, retrain, summary. Leaves the platform up."""
    t0 = time.monotonic()
    up(state_dir, conf)
    seed(state_dir, conf, rows=rows)
    deploy(state_dir, conf)
    # The demo's data scientist approves the nightly schedule and UI runs, then signs this job herself.
    signing.approve(open_platform(state_dir, conf), "alice", "fraud", "fraud", DEFAULT_PURPOSE, 20, 30.0)
    run(state_dir, conf, rounds=rounds, as_="alice")
    console.print(f"demo finished in {time.monotonic() - t0:.0f}s. The platform is still running so you can "
                  "explore both UIs; stop it with [bold]`.venv/bin/insitu down`[/bold].")


def validate(conf: ConfDir = DEFAULT_CONF) -> None:
    """Check every file of conf/ offline: sites.yaml, datasets.yaml, each training config with each dataset, and
    each schedule (its training exists and loads with its dataset; Prefect accepts its cron). Each mistake is
    reported once, where it is first met."""
    report = check_conf(conf)
    console.print(report.table)
    if report.mistakes:
        console.print(f"[red]{len(report.mistakes)} problem(s)[/red]")
        raise typer.Exit(1)
