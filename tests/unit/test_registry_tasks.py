"""The Prefect tasks that talk to MLflow's model registry, on a fake client: what they write, in which order,
and that the champion is read back as checked weights, never unpickled."""

from __future__ import annotations

import hashlib
import io
import logging
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from mlflow.exceptions import MlflowException

import tasks.promotion as promotion_task
import tasks.registration as registration_task
from insitu.federated.exchange import state_to_bytes
from insitu.job import JobSpec, load_job
from tasks.registration import Champion, Registration

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
LOGGER = logging.getLogger("test")


@pytest.fixture(scope="module")
def conf() -> JobSpec:
    return load_job("fraud", directory=CONF_DIR, overrides={"registry": {"model_name": "m"}})


class FakeRegistry:
    """Model versions with their tags, the ``champion`` alias, one run's ``weights/state.pt``; writes recorded."""

    def __init__(self, tags: dict[str, dict[str, str]], champion: str | None = None, weights: bytes = b"") -> None:
        self.tags, self.champion, self.weights = tags, champion, weights
        self.writes: list[tuple[str, ...]] = []
        self.downloads: list[str] = []

    def _version(self, version: str) -> SimpleNamespace:
        return SimpleNamespace(name="m", version=version, run_id=f"run-{version}", tags=dict(self.tags[version]))

    def get_model_version_by_alias(self, name: str, alias: str) -> SimpleNamespace:
        if alias != "champion" or self.champion is None:
            raise MlflowException(f"{name} has no alias {alias}")
        return self._version(self.champion)

    def get_model_version(self, name: str, version: str) -> SimpleNamespace:
        return self._version(version)

    def search_model_versions(self, filter_string: str) -> list[SimpleNamespace]:
        return [self._version(v) for v in self.tags if f"run_id = 'run-{v}'" in filter_string]

    def set_model_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        self.writes.append(("tag", version, key, value))
        self.tags[version][key] = value

    def set_registered_model_alias(self, name: str, alias: str, version: str) -> None:
        self.writes.append(("alias", alias, version))

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        self.writes.append(("run-tag", run_id, key, value))

    def download_artifacts(self, run_id: str, path: str, dst: str) -> str:
        self.downloads.append(path)
        (Path(dst) / "state.pt").write_bytes(self.weights)
        return str(Path(dst) / "state.pt")


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Install a fake registry (``box["client"]``) and a lock that records when it is held."""
    box: dict[str, Any] = {}

    @contextmanager
    def lock(name: str, **kwargs: object) -> Iterator[None]:
        box["client"].writes.append(("lock", name))
        yield
        box["client"].writes.append(("unlock", name))

    for module in (promotion_task, registration_task):
        monkeypatch.setattr(module, "MlflowClient", lambda: box["client"])
        monkeypatch.setattr(module, "get_run_logger", lambda: LOGGER)
    monkeypatch.setattr(promotion_task, "concurrency", lock)
    monkeypatch.setattr(promotion_task, "ensure_registry_lock", lambda name: None)
    yield box


def _gate(conf: JobSpec, candidate: float, champion: Champion | None = None, scored: float = 0.0) -> Any:
    return promotion_task.gate_and_promote.fn(
        conf, "job", "5", {"pr_auc": candidate}, {"eu": {"pr_auc": candidate}}, champion,
        {"pr_auc": scored} if champion else None, {"eu": {"pr_auc": scored}} if champion else None)


def test_a_passing_candidate_becomes_champion_inside_the_lock_and_its_gate_tag_comes_last(
        conf: JobSpec, registry: dict[str, Any]) -> None:
    client = registry["client"] = FakeRegistry({"3": {}, "5": {}}, champion="3")
    outcome = _gate(conf, 0.6, Champion("3", {}), scored=0.5)
    assert (outcome.passed, outcome.previous_champion, outcome.champion, outcome.alias) == (True, "3", "5", "champion")
    assert [w[:3] for w in client.writes] == [("lock", "insitu-registry-m"), ("tag", "5", "gate_reason"),
                                              ("alias", "champion", "5"), ("tag", "5", "gate"),
                                              ("unlock", "insitu-registry-m")]
    assert client.tags["5"]["gate"] == "passed"


def test_a_failing_candidate_moves_no_alias(conf: JobSpec, registry: dict[str, Any]) -> None:
    client = registry["client"] = FakeRegistry({"3": {}, "5": {}}, champion="3")
    outcome = _gate(conf, 0.5, Champion("3", {}), scored=0.5)
    assert (outcome.passed, outcome.champion, outcome.alias) == (False, "3", "challenger")
    assert not any(w[0] == "alias" for w in client.writes) and client.tags["5"]["gate"] == "failed"


def test_a_version_judged_before_is_not_judged_or_written_again(conf: JobSpec, registry: dict[str, Any]) -> None:
    client = registry["client"] = FakeRegistry({"5": {"gate": "passed", "gate_reason": "beat v3"}}, champion="5")
    outcome = _gate(conf, 0.0)  # would fail now: the recorded decision stands
    assert (outcome.passed, outcome.reason, outcome.champion) == (True, "beat v3", "5")
    assert client.writes == [("lock", "insitu-registry-m"), ("unlock", "insitu-registry-m")]


def test_a_rerun_returns_the_jobs_version_and_completes_its_tags(conf: JobSpec, registry: dict[str, Any]) -> None:
    client = registry["client"] = FakeRegistry({"5": {"weights_sha256": "ab"}})
    norm = {"features": ["a", "b"], "mean": [0.0, 0.0]}
    reg = registration_task.register_model.fn(conf, "job", {"parent": "run-5"}, {}, norm, {"eu": {"pr_auc": 0.5}},
                                              {"pr_auc": 0.45}, ["eu"])
    assert reg == Registration("m", "5", "challenger", "run-5")
    assert reg.as_dict() == {"model_name": "m", "version": "5", "alias": "challenger", "run_id": "run-5"}
    tags = client.tags["5"]
    assert (tags["job_id"], tags["features"], tags["global_test_pr_auc"], tags["site_eu_test_pr_auc"]) == (
        "job", "a,b", "0.450000", "0.500000")
    assert client.writes[-1] == ("alias", "challenger", "5")
    judged = FakeRegistry({"5": {"gate": "failed"}})  # judged already: nothing is written again
    registry["client"] = judged
    assert registration_task.register_model.fn(conf, "job", {"parent": "run-5"}, {}, norm, {}, {}, ["eu"]) == reg
    assert judged.writes == []


def _champion_registry(weights: bytes, recorded: str | None, features: str = "a,b") -> FakeRegistry:
    tags = {"features": features, **({"weights_sha256": recorded} if recorded else {})}
    return FakeRegistry({"3": tags}, champion="3", weights=weights)


def test_the_champion_is_read_back_as_checked_weights(conf: JobSpec, registry: dict[str, Any]) -> None:
    data = state_to_bytes({"w": torch.ones(2)})
    client = registry["client"] = _champion_registry(data, hashlib.sha256(data).hexdigest())
    champion = registration_task.load_champion.fn(conf, ["a", "b"])
    assert champion is not None and champion.version == "3" and torch.equal(champion.state["w"], torch.ones(2))
    assert client.downloads == ["weights/state.pt"]  # the weights alone, not the MLflow model
    registry["client"] = _champion_registry(data, hashlib.sha256(data).hexdigest(), features="a,c")
    assert registration_task.load_champion.fn(conf, ["a", "b"]) is None  # other features: not comparable
    registry["client"] = _champion_registry(data, None)
    assert registration_task.load_champion.fn(conf, ["a", "b"]) is None  # no recorded hash: judged by its tags
    registry["client"] = FakeRegistry({})
    assert registration_task.load_champion.fn(conf, ["a", "b"]) is None  # no champion yet


class Payload:
    """Anything but tensors: what a pickle of arbitrary objects would bring along."""


def test_champion_weights_that_differ_from_the_recorded_hash_or_are_not_tensors_are_refused(
        conf: JobSpec, registry: dict[str, Any]) -> None:
    data = state_to_bytes({"w": torch.ones(2)})
    registry["client"] = _champion_registry(data, "0" * 64)
    with pytest.raises(RuntimeError, match="differs from the 000000000000… recorded at registration"):
        registration_task.load_champion.fn(conf, ["a", "b"])
    buf = io.BytesIO()
    torch.save({"w": Payload()}, buf)  # hashed as recorded: only the tensors-only load stands in the way
    registry["client"] = _champion_registry(buf.getvalue(), hashlib.sha256(buf.getvalue()).hexdigest())
    with pytest.raises(pickle.UnpicklingError):
        registration_task.load_champion.fn(conf, ["a", "b"])
