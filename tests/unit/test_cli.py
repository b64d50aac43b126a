"""The `insitu` command as a user meets it (a real process): one-line errors, `--debug`, `validate`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from deployments.platform import REPO


def _insitu(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deployments.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env={"PATH": "/usr/bin:/bin", "COLUMNS": "200",
                                                     "PYTHONPATH": str(REPO)})


def test_an_error_is_one_line_and_debug_shows_the_trace(tmp_path: Path) -> None:
    args = ("data", "put", "/etc/hostname", "--site", "nowhere", "--state-dir", str(tmp_path / "state"))
    r = _insitu(*args, cwd=tmp_path)
    assert r.returncode == 1
    out = (r.stdout + r.stderr).strip()
    assert out.startswith("error: DataCliError: unknown site 'nowhere'") and "Traceback" not in out, out
    assert len(out.splitlines()) == 1, out
    r = _insitu(*args, "--debug", cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" in r.stderr


def test_validate_checks_every_file_of_conf(conf_copy: Path, tmp_path: Path) -> None:
    conf = conf_copy
    r = _insitu("validate", "--conf", str(conf), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "training/fraud_single.yaml with dataset fraud" in r.stdout
    (conf / "training" / "broken.yaml").write_text((conf / "training" / "fraud.yaml").read_text()
                                                   .replace("rounds: 5", "rounds: 0"))
    r = _insitu("validate", "--conf", str(conf), cwd=tmp_path)
    assert r.returncode == 1
    assert "training/broken.yaml" in r.stdout and "rounds" in r.stdout and "1 problem(s)" in r.stdout, r.stdout


def test_the_printed_summary_says_which_global_model_was_registered_and_why() -> None:
    from deployments.cli import summary

    s = {"job_id": "j1", "rounds": 5, "sites": {}, "global_metrics": {"pr_auc": 0.2, "count": 100},
         "bytes_crossed": 10, "bytes_crossed_by_writer": {}, "raw_bytes": 100, "ran_as": {},
         "model": {"model_name": "m", "version": "2", "alias": "challenger", "run_id": "r"},
         "selected_round": 3, "stopped_early": True,
         "selection": "the best round by validation pr_auc (0.2 at round 3)"}
    with summary.console.capture() as out:
        summary.print_summary(s)
    assert "it is global model 3 of 5 (stopped early): the best round by validation pr_auc" in out.get()


def test_down_wipe_asks_then_deletes_only_a_stopped_platforms_state_dir(tmp_path: Path) -> None:
    state = tmp_path / "state"
    r = _insitu("down", "--wipe", "--yes", "--state-dir", str(state), cwd=tmp_path)  # never started: nothing
    assert r.returncode == 1 and "holds no platform" in r.stdout + r.stderr and not (state / "objects").exists()
    (state / "stores" / "eu" / "objects").mkdir(parents=True)
    (state / "stores" / "eu" / "objects" / "x").write_bytes(b"a shard")
    (state / "state.json").write_text("{}")  # a platform that ran once and is stopped
    r = subprocess.run([sys.executable, "-m", "deployments.cli", "down", "--wipe", "--state-dir", str(state)],
                       input="n\n", capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={"PATH": "/usr/bin:/bin", "COLUMNS": "200", "PYTHONPATH": str(REPO)})
    assert r.returncode == 1 and "nothing deleted" in r.stdout and (state / "stores/eu/objects/x").exists(), r.stdout
    r = _insitu("down", "--wipe", "--yes", "--state-dir", str(state), cwd=tmp_path)
    assert r.returncode == 0 and "deleted" in r.stdout and not state.exists(), r.stdout + r.stderr
    r = _insitu("down", "--state-dir", str(tmp_path / "other"), cwd=tmp_path)
    assert r.returncode == 0 and "the data stays" in r.stdout, r.stdout + r.stderr
