"""The in-site strategies in a real retrain job: the sequence transformer on `card_sequences`, trained inside each
site with the pipeline × FSDP hybrid (a GPipe schedule over two stages, each sharded over two ranks: both
parallelisms composed) on the site's own Dask workers; it registers a model that predicts from raw sequences.

FSDP alone and the 1F1B pipeline are each checked against one process on real process groups in
tests/parallel/test_strategies.py (and under torchrun in test_torchrun.py); a platform job apiece added five
minutes to CI for the same code path from the flow down to the launch."""

from __future__ import annotations

import uuid
from typing import Any

import mlflow.pytorch
import pytest
import torch
from mlflow.tracking import MlflowClient
from platform_helpers import job_events, shipped_training, start_retrain, wait_for_flow_runs, write_training

from deployments.platform import Platform
from insitu.conf import load_conf
from insitu.data.features import featurize
from insitu.data.seed import seed
from insitu.data.sequences import generate

# Four ranks per site on 2 cores, the platform started by the first test of the session: more than the default
# 900 s when the machine is shared.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]
ROUNDS = 1  # one round proves each strategy trains, aggregates and registers; more only cost CI time
# strategy → (ranks per site, data-parallel replicas among them, extra training keys)
LAYOUTS: dict[str, tuple[int, int, dict[str, Any]]] = {
    "hybrid": (4, 2, {"parallel": {"mesh": {"pp": 2, "dp_shard": 2}, "pipeline": {"schedule": "gpipe",
                                                                                   "microbatches": 2}}}),
}


@pytest.fixture(scope="module")
def jobs(deployed: Platform, signer: Any) -> dict[str, dict[str, Any]]:
    seed(load_conf("card_sequences", "card_sequences", deployed.conf_dir), rows_per_site=900, seed=11)
    base = shipped_training(deployed.conf_dir, "card_sequences")
    tag = uuid.uuid4().hex[:6]
    made: dict[str, dict[str, Any]] = {}
    paths = []
    try:
        for strategy, (ranks, _, extra) in LAYOUTS.items():
            training = f"e2e-seq-{strategy}-{tag}"
            cfg = {**base, "rounds": ROUNDS, "strategy": strategy, "ranks_per_site": ranks,
                   "registry": {"model_name": f"insitu-{training}"}}
            cfg["parallel"] = {**base["parallel"], **extra.get("parallel", {})}
            paths.append(write_training(deployed.conf_dir / "training", training, cfg))
            job_id = f"e2e-seq-{strategy}-{tag}"
            request = signer(training=training, job_id=job_id, dataset="card_sequences")
            flow_run_id = start_retrain({"training": training, "dataset": "card_sequences", "job_id": job_id,
                                         "request": request})
            made[strategy] = {"flow_run_id": flow_run_id, "job_id": job_id, "model_name": f"insitu-{training}"}
        # each job judged by its own test: one that hangs does not hide how the others ended
        runs = wait_for_flow_runs([m["flow_run_id"] for m in made.values()], 1800, poll_s=3)
    finally:
        for p in paths:
            p.unlink()
    for m, fr in zip(made.values(), runs, strict=True):
        m["flow_run"] = fr
    return made


@pytest.mark.parametrize("strategy", list(LAYOUTS))
def test_a_retrain_job_trains_with_the_strategy_and_registers_the_model(
    deployed: Platform, jobs: dict[str, dict[str, Any]], strategy: str
) -> None:
    job = jobs[strategy]
    assert job["flow_run"].state.is_completed(), job["flow_run"].state.message
    ranks, replicas, _ = LAYOUTS[strategy]
    # Each site ran the strategy on its own workers, every round (its audit log says so, with the ranks).
    for site in ("eu", "us", "apac"):
        trained = [e["fields"] for e in job_events(deployed, site, job["job_id"], "data.read")
                   if e["fields"].get("what") == "prepared/train"]
        assert [(f["round"], f["strategy"], f["ranks"]) for f in trained] == [(r, strategy, ranks)
                                                                               for r in range(ROUNDS)]
    client = MlflowClient(deployed.mlflow_url)
    (mv,) = client.search_model_versions(f"name = '{job['model_name']}'")
    assert mv.tags["job_id"] == job["job_id"]
    run = client.get_run(mv.run_id)
    assert run.data.params["strategy"] == strategy and run.data.params["ranks_per_site"] == str(ranks)
    children = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'")
    for child in children:
        assert [m.step for m in client.get_metric_history(child.info.run_id, "train_loss")] == list(range(ROUNDS))
        assert child.data.metrics["replicas"] == replicas
    assert 0.0 < run.data.metrics["global_test_pr_auc"] <= 1.0
    # The registered model is the whole transformer (every stage's and shard's weights, gathered): it scores
    # raw sequences, fraud above the rest.
    conf = load_conf("card_sequences", "card_sequences", deployed.conf_dir)
    x, y = featurize(generate("us", 1500, seed=99), conf.dataset.schema_)
    model = mlflow.pytorch.load_model(f"models:/{job['model_name']}/{mv.version}")
    with torch.no_grad():
        scores = model(torch.from_numpy(x))
    assert scores.shape == (len(y),) and torch.isfinite(scores).all()
    assert scores[torch.from_numpy(y) == 1].mean() > scores[torch.from_numpy(y) == 0].mean()
