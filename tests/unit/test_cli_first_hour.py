"""A new user's first hour with `insitu` (issue 17): what the CLI says when retrain is not deployed, when a job
fails, when output is not a terminal, after `down`; the client environment; each `validate` mistake once.
No platform is started: Prefect's client is replaced where a command would reach it."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import typer
from rich.console import Console

from deployments.cli import job_run
from deployments.cli.conf_check import ConfReport, check_conf
from deployments.cli.job_run import JobRun, not_deployed_message, run_and_follow
from deployments.cli.progress import JobProgress, JobShape, PlainProgress, plain_updates
from deployments.platform import REPO, Platform

EXCHANGE_ENV = {"INSITU_EXCHANGE_S3_ENDPOINT": "http://127.0.0.1:9", "INSITU_EXCHANGE_AWS_ACCESS_KEY_ID": "k",
                "INSITU_EXCHANGE_AWS_SECRET_ACCESS_KEY": "s"}


def _insitu(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deployments.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env={"PATH": "/usr/bin:/bin", "COLUMNS": "200",
                                                     "PYTHONPATH": str(REPO)})


@pytest.fixture
def platform_state(tmp_path: Path) -> Platform:
    """A platform's state file as `insitu up` then `insitu down` leave it: logins chosen, nothing running."""
    p = Platform(tmp_path / "state", REPO / "conf", isolate_users=False)
    p.state["pids"] = {}
    p.state_file.parent.mkdir(parents=True)
    p.state_file.write_text(json.dumps(p.state))
    return p


# --------------------------------------------------------------------------- a. retrain not deployed
def test_the_missing_deployment_is_named_with_its_fix() -> None:
    assert not_deployed_message() == "retrain/coordinator is not deployed: run insitu deploy"


def test_run_without_retrain_deployed_says_so_in_one_line(platform_state: Platform, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import prefect.deployments
    from prefect.exceptions import ObjectNotFound

    def not_found(*args: Any, **kwargs: Any) -> None:
        raise ObjectNotFound(http_exc=Exception())  # what Prefect raises: its message is "None"

    monkeypatch.setattr(prefect.deployments, "run_deployment", not_found)
    with pytest.raises(typer.Exit) as info:
        run_and_follow(platform_state, JobRun("fraud", "fraud", "j-1"))
    assert info.value.exit_code == 1
    out = capsys.readouterr().out.strip()
    assert out == "retrain/coordinator is not deployed: run insitu deploy", out


# --------------------------------------------------------------------------- b. the resume command
def test_the_resume_command_repeats_what_was_asked() -> None:
    assert JobRun("fraud", "fraud", "j-1", as_="alice").resume_command() == \
        "insitu run --as alice --training fraud --dataset fraud --job-id j-1"
    assert JobRun("fraud", "fraud", "j-1").resume_command() == \
        "insitu run --training fraud --dataset fraud --job-id j-1"
    cmd = JobRun("rand", "hie", "j-2", rounds=7, purpose="health research", state_dir=Path("/s"),
                 conf=Path("/c d")).resume_command()
    assert cmd == ("insitu run --training rand --dataset hie --rounds 7 --purpose 'health research' "
                   "--state-dir /s --conf '/c d' --job-id j-2")


def _followed_run(monkeypatch: pytest.MonkeyPatch, look: Any) -> None:
    """`run_and_follow` against a Prefect that triggers the run, and whose follow-up reads go through ``look``."""
    import prefect.client.orchestration
    import prefect.deployments

    for name, value in EXCHANGE_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(prefect.deployments, "run_deployment", lambda *a, **k: SimpleNamespace(id="fr-1"))
    monkeypatch.setattr(prefect.client.orchestration, "get_client", lambda **k: contextlib.nullcontext(object()))
    monkeypatch.setattr(job_run, "look", look)
    monkeypatch.setattr(job_run, "API_RETRY_WAIT_S", 0.0)
    monkeypatch.setattr(job_run, "POLL_S", 0.0)


def _http_error(status: int) -> httpx.HTTPStatusError:
    request = httpx.Request("GET", "http://127.0.0.1:4200/api/flow_runs/fr-1")
    return httpx.HTTPStatusError(f"Server error '{status}'", request=request,
                                 response=httpx.Response(status, request=request))


def test_a_prefect_api_error_while_following_prints_the_resume_command(
        platform_state: Platform, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    calls = []

    def unavailable(*args: Any) -> None:
        calls.append(args)
        raise _http_error(503)  # "database is locked", for longer than the retries wait

    _followed_run(monkeypatch, unavailable)
    with pytest.raises(httpx.HTTPStatusError):
        run_and_follow(platform_state, JobRun("fraud", "fraud", "j-3", as_=None))
    assert len(calls) == job_run.API_RETRIES + 1
    out = capsys.readouterr().out
    assert out.rstrip().endswith("resume this job: insitu run --training fraud --dataset fraud --job-id j-3"), out


def test_a_transient_error_is_waited_out_and_a_failed_run_prints_the_resume_command(
        platform_state: Platform, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    answers: list[Any] = [_http_error(503), httpx.ConnectError("refused")]

    def look(*args: Any) -> tuple[Any, JobProgress]:
        if answers:
            raise answers.pop(0)
        state = SimpleNamespace(is_final=lambda: True, is_completed=lambda: False, message="site eu refused")
        return SimpleNamespace(state=state, state_name="Failed"), JobProgress("Failed", 3, 1, 0, False)

    _followed_run(monkeypatch, look)
    with pytest.raises(typer.Exit):
        run_and_follow(platform_state, JobRun("fraud", "fraud", "j-4"))
    out = capsys.readouterr().out
    assert "retrain Failed: site eu refused" in out and "train: round 1/5 done" in out, out
    assert "resume this job: insitu run --training fraud --dataset fraud" in out and "--job-id j-4" in out, out


def test_an_error_that_is_not_transient_is_not_retried() -> None:
    calls = []

    def forbidden() -> None:
        calls.append(1)
        raise _http_error(403)

    with pytest.raises(httpx.HTTPStatusError):
        job_run.retrying(forbidden, 5, 0.0)
    assert calls == [1]


# --------------------------------------------------------------------------- c. plain progress, d. clamped counts
def test_plain_progress_prints_a_line_per_phase_and_round() -> None:
    shape = JobShape(sites=3, rounds=5)
    now = iter([100.0, 104.0, 112.0, 130.0])
    out = io.StringIO()
    shown = PlainProgress(Console(file=out, width=200), shape, clock=lambda: next(now))
    shown.update(JobProgress("Running", 0, 0, 0, False))
    shown.update(JobProgress("Running", 3, 0, 0, False))
    shown.update(JobProgress("Running", 3, 3, 0, False))
    assert out.getvalue().splitlines() == ["[4s] retrain: Running", "[12s] prepare: 3/3 sites done",
                                           "[30s] train: round 1/5 done", "[30s] train: round 2/5 done",
                                           "[30s] train: round 3/5 done"]


def test_the_end_of_a_job_is_reported_once() -> None:
    shape = JobShape(sites=2, rounds=2)
    before = JobProgress("Running", 2, 2, 1, False)
    assert plain_updates(shape, before, JobProgress("Completed", 2, 2, 2, True)) == [
        "retrain: Completed", "evaluate: 2/2 sites done", "register: done"]
    assert plain_updates(shape, JobProgress("Completed", 2, 2, 2, True), JobProgress("Completed", 2, 2, 2, True)) == []


def test_a_resumed_job_never_counts_past_its_total() -> None:
    shape = JobShape(sites=3, rounds=8)
    # The earlier attempt's site runs and a redone round are seen as well as this attempt's.
    resumed = JobProgress("Completed", prepared=6, rounds_done=9, evaluated=4, registered=True)
    assert shape.total == 15 and shape.completed(resumed) == 15
    assert shape.phase(JobProgress("Running", 6, 9, 0, False)) == "evaluate"
    assert shape.phase(JobProgress("Running", 2, 3, 0, False)) == "round 4/8"  # a site left out within the quorum
    assert plain_updates(shape, None, resumed)[1:3] == ["prepare: 3/3 sites done", "train: round 1/8 done"]


def test_a_live_bar_on_a_terminal_and_lines_elsewhere() -> None:
    from deployments.cli.progress import LiveProgress, progress_for

    shape = JobShape(sites=1, rounds=1)
    assert isinstance(progress_for(Console(file=io.StringIO(), force_terminal=True), shape), LiveProgress)
    assert isinstance(progress_for(Console(file=io.StringIO(), force_terminal=False), shape), PlainProgress)


# --------------------------------------------------------------------------- e. credentials --env
def test_credentials_env_sets_up_the_mlflow_and_prefect_clients(platform_state: Platform, tmp_path: Path) -> None:
    script = (f'eval "$({sys.executable} -m deployments.cli credentials --env --state-dir {platform_state.dir})" && '
              "env")
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    env = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    assert env["MLFLOW_TRACKING_URI"] == platform_state.mlflow_url
    assert env["MLFLOW_TRACKING_USERNAME"] == "operator"
    assert env["MLFLOW_TRACKING_PASSWORD"] == platform_state.mlflow_password("operator")
    assert env["PREFECT_API_URL"] == platform_state.prefect_api_url
    assert env["PREFECT_API_AUTH_STRING"] == platform_state.prefect_auth


def test_credentials_env_before_any_up_prints_nothing_to_eval(tmp_path: Path) -> None:
    r = _insitu("credentials", "--env", "--state-dir", str(tmp_path / "never-up"), cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == "", r.stdout
    assert "start it with `insitu up`" in r.stderr


# --------------------------------------------------------------------------- f. status after down
def test_status_after_down_says_the_platform_is_down(platform_state: Platform, tmp_path: Path) -> None:
    r = _insitu("status", "--state-dir", str(platform_state.dir), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the platform is down" in r.stdout and "insitu up" in r.stdout, r.stdout
    assert "Prefect UI" not in r.stdout and "http://" not in r.stdout, r.stdout


# --------------------------------------------------------------------------- g. validate: each mistake once
def test_a_mistake_met_by_several_checks_is_reported_once() -> None:
    report = ConfReport()
    report.check("datasets.yaml", lambda: _raise("d.yaml: key 'a': bad\nd.yaml: key 'b': bad"))
    report.check("training/x.yaml with dataset a", lambda: _raise("d.yaml: key 'a': bad"))
    report.check("training/y.yaml with dataset b", lambda: _raise("d.yaml: key 'b': bad\ny.yaml: key 'c': bad"))
    assert list(report.mistakes) == ["d.yaml: key 'a': bad", "d.yaml: key 'b': bad", "y.yaml: key 'c': bad"]
    text = _render(report)
    assert text.count("key 'a': bad") == 1 and text.count("key 'b': bad") == 1, text
    assert text.count("fails on the mistake reported for datasets.yaml") == 2, text


def test_validate_reports_a_dataset_typo_once(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf, ignore=shutil.ignore_patterns("e2e-*", ".e2e-*"))
    datasets = conf / "datasets.yaml"
    datasets.write_text(datasets.read_text().replace("label: is_fraud", "label: is_frud", 1))
    report = check_conf(conf)
    assert len(report.mistakes) == 1, report.mistakes
    text = _render(report)
    assert text.count("label column 'is_frud'") == 1, text
    assert "training/fraud.yaml with dataset fraud" in text


def _raise(message: str) -> None:
    from insitu.conf import ConfigError

    raise ConfigError(message)


def _render(report: ConfReport) -> str:
    out = io.StringIO()
    Console(file=out, width=400).print(report.table)
    return out.getvalue()
