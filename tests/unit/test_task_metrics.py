"""The exchange's metrics schema is assembled from the learning tasks: each task carries its own
(``TaskSpec.metrics_schema``), the union lists them in the registry's order, every task's real output crosses
the exchange and a document of the wrong shape for its task is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pydantic
import pytest
import torch
from protocol_examples import ran_as, store

from insitu.federated.documents.base import Doc
from insitu.federated.documents.evaluation import (
    MODEL_METRICS,
    Evaluation,
    Validation,
    metrics_or_withheld,
    task_metrics,
    untagged_task,
)
from insitu.federated.exchange import Exchange, ExchangeError
from insitu.specs import TASKS, task_for_label

CLASSES = ["a", "b", "c"]


def test_the_union_is_the_registered_tasks_schemas_in_their_order() -> None:
    assert list(MODEL_METRICS) == list(TASKS) == ["binary", "multiclass", "regression"]
    assert [s.__name__ for s in MODEL_METRICS.values()] == ["BinaryMetrics", "MulticlassMetrics",
                                                            "RegressionMetrics"]
    assert all(MODEL_METRICS[name] is task.metrics_schema for name, task in TASKS.items())
    assert untagged_task(MODEL_METRICS) == "binary"  # documents from before tasks named themselves


def _published(name: str) -> dict[str, Any]:
    """What a site of task ``name`` publishes about one model on 300 rows, as JSON would carry it."""
    rng = np.random.default_rng(3)
    n = 300
    if name == "binary":
        y = (rng.random(n) < 0.3).astype(np.float32)
        task, out, params = task_for_label("binary", "bool"), torch.from_numpy(
            (1.5 * y + rng.normal(size=n)).astype(np.float32)), {"pos_weight": 2.0}
    elif name == "multiclass":
        y = rng.choice(3, size=n).astype(np.float32)
        task, out = task_for_label("multiclass", "category", CLASSES), torch.from_numpy(
            (rng.normal(size=(n, 3)) + 2 * np.eye(3)[y.astype(int)]).astype(np.float32))
        params = {"class_weights": [1.0, 1.0, 1.0]}
    else:
        y = rng.normal(50, 10, size=n).astype(np.float32)
        task, out, params = task_for_label("regression", "float"), torch.from_numpy(
            (y + rng.normal(size=n)).astype(np.float32)), {"label_scale": 10.0}
    return json.loads(json.dumps(task.site_metrics(out, y, params)))


def _evaluation(metrics: dict[str, Any]) -> bytes:
    return json.dumps({"site": "eu", "ran_as": ran_as("eu"), "models": {"round-0001": metrics}}).encode()


@pytest.mark.parametrize("name", list(TASKS))
def test_each_tasks_real_metrics_cross_the_exchange(tmp_path: Path, name: str) -> None:
    metrics = _published(name)
    assert metrics["task"] == name
    doc = Evaluation.model_validate_json(_evaluation(metrics), strict=True)
    assert type(doc.models["round-0001"]) is TASKS[name].metrics_schema
    site = Exchange(store(tmp_path), "job-1", "eu")
    site.put_json("metrics", "evaluate.json", json.loads(_evaluation(metrics)))
    assert site.get_json("metrics", "evaluate.json")["models"]["round-0001"] == metrics
    without_histograms = {k: v for k, v in metrics.items() if not k.startswith("hist_")}
    Validation.model_validate({"site": "eu", "round": 1, "metrics": without_histograms}, strict=True)


@pytest.mark.parametrize("name", list(TASKS))
def test_a_document_of_the_wrong_shape_for_its_task_is_refused(tmp_path: Path, name: str) -> None:
    metrics = _published(name)
    other = next(t for t in TASKS if t != name)
    for wrong, why in [({**metrics, "task": other}, f"models.round-0001.{other}"),  # another task's schema
                       ({**metrics, "rows": [1.0, 2.0]}, "rows: key not allowed by the protocol"),
                       ({**metrics, "task": "ranking"}, "models.round-0001: Input tag 'ranking'"),
                       ({**metrics, "count": 3.0}, "count: Input should be greater than or equal to 20")]:
        with pytest.raises(ExchangeError, match=why):
            site = Exchange(store(tmp_path), "job-1", "eu")
            site.put_json("metrics", "evaluate.json", json.loads(_evaluation(wrong)))


def test_a_binary_document_without_its_task_key_is_still_read_as_binary() -> None:
    legacy = {k: v for k, v in _published("binary").items() if k != "task"}
    doc = Evaluation.model_validate_json(_evaluation(legacy), strict=True)
    assert type(doc.models["round-0001"]).__name__ == "BinaryMetrics"
    # only binary may leave it out: another task's untagged document is checked, and refused, as binary
    with pytest.raises(pydantic.ValidationError, match=r"binary\.accuracy\n  Extra inputs are not permitted"):
        Evaluation.model_validate_json(_evaluation({k: v for k, v in _published("multiclass").items()
                                                    if k != "task"}), strict=True)


class _Ranking(Doc):
    task: Literal["ranking"]
    ndcg: float


class _RankingTask:
    metrics_schema: ClassVar[type[Doc]] = _Ranking


def test_a_new_tasks_schema_joins_the_union_and_a_mislabelled_one_is_refused() -> None:
    union = metrics_or_withheld(task_metrics({**TASKS, "ranking": _RankingTask}))

    class Published(Doc):
        metrics: union  # type: ignore[valid-type]

    assert Published.model_validate_json('{"metrics": {"task": "ranking", "ndcg": 0.5}}').metrics == _Ranking(
        task="ranking", ndcg=0.5)
    assert Published.model_validate_json('{"metrics": {"withheld": "too few rows"}}').metrics.withheld
    with pytest.raises(TypeError, match=r"task 'listwise': its metrics_schema _Ranking needs the key "
                                        r"task: Literal\['listwise'\]"):
        task_metrics({"listwise": _RankingTask})
