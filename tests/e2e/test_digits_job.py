"""The second shipped example end to end, as a new user runs it: their own files (CSV, put into each site's
store with `insitu data put`), a multi-class task, their own model class by import path, a signed request, updates
encoded as int8 on the wire (``federation.compression``) — and a registered, gated model whose metrics are the
task's."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from platform_helpers import (
    EXCHANGE,
    coordinator_exchange,
    e2e_name,
    job_events,
    job_summary,
    shipped_training,
    start_retrain,
    wait_for_flow_run,
    write_training,
)

from deployments.cli import site_store as data
from deployments.platform import Platform
from insitu.conf import load_datasets
from insitu.data.digits import digits_frames

pytestmark = pytest.mark.e2e
ROUNDS = 3


@pytest.fixture(scope="module")
def digits_job(deployed: Platform, signer: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # 1. each site's own file goes into its own store, in the format its shard's path names
    ds = load_datasets(deployed.conf_dir / "datasets.yaml", only="digits").datasets["digits"]
    files = tmp_path_factory.mktemp("digits")
    for site, frame in digits_frames(seed=3).items():
        (shard,) = ds.shards_of(site)
        local = files / Path(shard.path).name
        if shard.path.endswith(".csv"):
            frame.to_csv(local, index=False)
        else:
            frame.to_parquet(local, index=False)
        data.put(deployed, site, local, shard.path)
    # 2. a training config with the user's own model class (examples/models.py), beside the shipped one
    training = e2e_name("digits-own")
    cfg = shipped_training(deployed.conf_dir, "digits")
    cfg.update({"rounds": ROUNDS, "model": {"name": "examples.models:residual_mlp",
                                            "options": {"width": 48, "blocks": 2}},
                "federation": {**cfg["federation"], "compression": {"encoding": "int8"}},
                "registry": {"model_name": f"insitu-{training}"}})
    path = write_training(deployed.conf_dir / "training", training, cfg)
    try:
        # 3. a signed request, as `insitu run --as alice --dataset digits --training … --purpose …` makes it
        job_id = f"e2e-digits-{uuid.uuid4().hex[:6]}"
        request = signer(training=training, job_id=job_id, dataset="digits", purpose="digit-recognition")
        fr = wait_for_flow_run(start_retrain({"training": training, "dataset": "digits", "job_id": job_id,
                                              "request": request}), 1500, poll_s=2)
    finally:
        path.unlink()
    return {"flow_run": fr, "job_id": job_id, "model_name": f"insitu-{training}"}


def test_the_digits_job_completes(digits_job: dict[str, Any]) -> None:
    fr = digits_job["flow_run"]
    assert fr.state.is_completed(), fr.state.message


def test_a_gated_model_with_the_tasks_metrics_is_registered(deployed: Platform, digits_job: dict[str, Any]) -> None:
    client = MlflowClient(deployed.mlflow_url)
    mv = client.get_model_version_by_alias(digits_job["model_name"], "challenger")
    assert mv.tags["job_id"] == digits_job["job_id"]
    assert mv.tags["gate"] == "passed", mv.tags.get("gate_reason")  # first model: macro-F1 above 0.5
    assert "macro_f1" in mv.tags["gate_reason"]
    run = client.get_run(mv.run_id)
    assert run.data.params["task"] == "multiclass"
    assert run.data.metrics["global_test_macro_f1"] > 0.7, run.data.metrics
    assert 0.0 <= run.data.metrics["global_test_accuracy"] <= 1.0
    assert "global_test_pr_auc" not in run.data.metrics  # a binary metric has no meaning here
    for site in ("eu", "us", "apac"):
        assert f"{site}_test_macro_f1" in run.data.metrics and f"site_{site}_test_macro_f1" in mv.tags
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert {"plots/confusion_matrix.png", "plots/site_metrics.png"} <= artifacts
    assert "plots/pr_curve.png" not in artifacts
    val = client.get_metric_history(run.info.run_id, "global_val_macro_f1")
    assert [int(m.step) for m in val] == list(range(ROUNDS + 1))


def test_the_registered_model_is_the_users_class_and_predicts_digits(deployed: Platform,
                                                                     digits_job: dict[str, Any]) -> None:
    """Loaded from the registry, the model takes raw pixels (its normalisation is inside it) and returns ten
    logits; on the public digits it predicts far better than chance."""
    import mlflow.pytorch
    import torch
    from sklearn.datasets import load_digits

    mlflow.set_tracking_uri(deployed.mlflow_url)
    model = mlflow.pytorch.load_model(f"models:/{digits_job['model_name']}@challenger")
    assert type(model.core).__name__ == "ResidualMLP"
    x, y = load_digits(return_X_y=True)
    with torch.no_grad():
        logits = model(torch.from_numpy(x.astype(np.float32)))
    assert logits.shape == (len(y), 10)
    assert float((logits.argmax(dim=1).numpy() == y).mean()) > 0.7


def test_every_update_crossed_as_int8_in_about_a_quarter_of_the_fp32_bytes(deployed: Platform,
                                                                             digits_job: dict[str, Any]) -> None:
    """What crossed the border is the encoded payload (safetensors, int8 values and a scale per tensor) and its
    manifest says so; the coordinator decoded it (the job above completed and registered a model from it)."""
    import torch

    from insitu.federated.state_bytes import payload_from_bytes, state_from_bytes

    fs, job = coordinator_exchange(deployed).fs, f"{EXCHANGE}/jobs/{digits_job['job_id']}"
    model = state_from_bytes(fs.cat(f"{job}/weights/coordinator/round-0000.pt"))
    fp32 = sum(v.numel() * 4 for v in model.values() if v.is_floating_point())
    for site in ("eu", "us", "apac"):
        for rnd in range(ROUNDS):
            man = json.loads(fs.cat(f"{job}/update/{site}/round-{rnd:04d}.manifest.json"))
            assert man["encoding"] == "int8-delta"
            assert man["bytes"] <= 0.27 * fp32, (site, rnd, man["bytes"], fp32)
            payload = payload_from_bytes(fs.cat(f"{job}/update/{site}/round-{rnd:04d}.pt"))
            assert payload["values"].dtype == torch.int8
            assert payload["values"].numel() == fp32 // 4


def test_the_summary_and_the_audit_speak_of_the_task(deployed: Platform, digits_job: dict[str, Any]) -> None:
    fs = coordinator_exchange(deployed).fs
    summary = job_summary(deployed, digits_job["job_id"])
    assert summary["task"] == "multiclass" and summary["metric_names"] == ["accuracy", "macro_f1", "log_loss"]
    assert summary["global_metrics"]["macro_f1"] > 0.7
    # the sites published confusion matrices (counts), never a row: the test rows add up, per site
    for site in ("eu", "us", "apac"):
        ev = json.loads(fs.cat(f"{EXCHANGE}/jobs/{digits_job['job_id']}/metrics/{site}/evaluate.json"))
        (model,) = [m for name, m in ev["models"].items() if name.startswith("round-")]
        assert model["task"] == "multiclass" and int(np.sum(model["confusion"])) == int(model["count"])
    decisions = job_events(deployed, "eu", digits_job["job_id"], "policy.decision")
    assert decisions and all(d["fields"]["allowed"] for d in decisions), decisions
    assert {d["fields"]["rule"] for d in decisions} == {"data-scientists-digits"}
