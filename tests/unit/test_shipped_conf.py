"""The shipped ``conf/`` (what ``make demo`` runs and a user starts from) loads and validates as ``insitu validate``
checks it, fits the example data ``insitu seed`` writes, agrees with the AWS documents generated from it, and its
digits config trains to a useful model.

The one unit test that reads ``conf/``: the others run on the fixture ``tests/fixtures/conf/`` (tests/unit/conftest.py),
so that a new demo site, dataset or training config changes nothing for them. Its assertions hold for any valid
``conf/``; what a particular site or shard looks like is asserted on the fixture.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from insitu.conf import (
    DatasetConfig,
    TaskConfig,
    load_datasets,
    load_sites,
    load_training,
    trusted_training,
)
from insitu.data import sequences, synthetic
from insitu.data.digits import digits_frames
from insitu.data.features import label_classes
from insitu.data.loader import load_split
from insitu.data.prepare import prepare_shard, summarize
from insitu.data.schema import validate
from insitu.data.seed import seed
from insitu.federated.aggregators import Update, build_aggregator
from insitu.federated.stats import combine, mean_std
from insitu.job import ModelDoesNotFit, load_job
from insitu.models import Normalization, build_model
from insitu.parallel.loop import train_epochs
from insitu.specs import build_task
from insitu.storage import Store

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "conf"
# While an e2e test runs, its own configs (e2e-*.yaml, git ignores them) lie in conf/training too.
TRAININGS = sorted(p for p in (SHIPPED / "training").glob("*.yaml") if not p.name.startswith("e2e-"))


def _datasets() -> dict[str, DatasetConfig]:
    return load_datasets(SHIPPED / "datasets.yaml").datasets


def _fits(task: TaskConfig, dataset: DatasetConfig) -> bool:
    """Whether a learning task can learn this dataset's label (a multi-class config needs a category label)."""
    try:
        build_task(task, dataset.schema_)
    except ValueError:
        return False
    return True


def test_sites_and_every_dataset_load() -> None:
    sites = load_sites(SHIPPED / "sites.yaml")
    datasets = _datasets()
    assert sites.names and datasets and TRAININGS
    for name, ds in datasets.items():
        assert ds.shards and {s.site for s in ds.shards} <= set(sites.names), name


@pytest.mark.parametrize("path", TRAININGS, ids=[p.stem for p in TRAININGS])
def test_each_training_config_loads_with_every_dataset_its_task_fits(path: Path) -> None:
    task = load_training(path).task
    fitting = [name for name, ds in _datasets().items() if _fits(task, ds)]
    assert fitting, f"{path.name}: task {task.name!r} fits no dataset of datasets.yaml"
    built = []
    for name in fitting:
        job = load_job(path.stem, name, directory=SHIPPED)  # the cross-file checks and components, as a job runs
        assert job.training.federation.min_sites <= len({s.site for s in job.dataset.shards}), (path.name, name)
        try:
            job.check_model()
            built.append(name)
        except ModelDoesNotFit:  # e.g. the sequence model on a flat dataset: a pair no one runs
            pass
    assert built, f"{path.name}: its model builds for no dataset it fits"


def test_each_schedule_runs_a_training_config_that_loads_with_its_dataset() -> None:
    for name, ds in _datasets().items():
        for s in ds.schedules:
            trusted_training(s.training, SHIPPED)
            load_job(s.training, name, directory=SHIPPED).check_model()


# Each example dataset `insitu seed` writes, and the check that its generator writes the shipped schema.
def _digits_fit(schema: Any) -> None:
    for site, frame in digits_frames(0).items():
        _, bad = validate(frame, schema)
        assert len(bad) == 0, (site, bad.head())


GENERATORS = {"fraud": synthetic.check_matches_schema, "card_sequences": sequences.check_matches_schema,
              "digits": _digits_fit}


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_the_example_data_fits_the_shipped_schema(name: str) -> None:
    datasets = _datasets()
    if name not in datasets:
        pytest.skip(f"conf/datasets.yaml ships no {name!r} dataset")
    GENERATORS[name](datasets[name].schema_)


def test_the_shipped_aws_documents_are_the_ones_the_platform_enforces() -> None:
    """docs/iam/ is what `insitu iam-policies` writes for conf/sites.yaml; regenerate it when they differ."""
    from insitu.governance.iam import policy_documents, render

    sites = load_sites(SHIPPED / "sites.yaml")
    bucket = lambda url: url.split("://", 1)[1].split("/", 1)[0]  # noqa: E731
    docs = policy_documents(bucket(sites.exchange.storage), {s.name: bucket(s.storage) for s in sites.sites})
    shipped = {p.name: p.read_text() for p in (REPO / "docs" / "iam").glob("*.json")}
    assert shipped == {name: render(doc) for name, doc in docs.items()}, "run `insitu iam-policies`"


def test_the_shipped_digits_config_trains_the_seeded_digits_federatedly(file_conf: Path) -> None:
    """seed → prepare on each site's store → FedAvg rounds in-process, as the sites and coordinator run them:
    the global test macro-F1 after the configured rounds must clear the gate's first-model floor by far.

    The shipped ``training/digits.yaml`` (its settings are what this checks) on the fixture's sites and datasets,
    whose stores are folders."""
    c = load_job(str(SHIPPED / "training" / "digits.yaml"), "digits", file_conf)
    t, task, schema = c.training, c.task, c.dataset.schema_
    seed(c, seed=42)
    data = {}
    for shard in c.dataset.shards:
        store = Store(c.sites.site(shard.site).storage, {})
        rep = prepare_shard(store, shard, schema, t.split, c.dataset.split_key, "digits", "job-1")
        assert rep.error is None and rep.rows_quarantined == 0
        data[shard.site] = (summarize([rep]), {s: load_split(store, "digits", "job-1", s) for s in ("train", "test")})
    stats = combine(d[0]["train_stats"] for d in data.values())
    assert sum(stats["label_counts"]) == stats["n"] and len(stats["label_counts"]) == label_classes(schema) == 10
    mean, std = mean_std(stats)
    params = task.loss_params(stats)
    torch.manual_seed(t.seed)
    state = build_model(t.model, len(mean), task.n_outputs, Normalization(mean, std)).state_dict()
    agg = build_aggregator(t.aggregator.name, t.aggregator.options)
    kept = None
    for rnd in range(t.rounds):
        updates = []
        for site, (_, splits) in data.items():
            model = build_model(t.model, len(mean), task.n_outputs)
            model.load_state_dict(state)
            train_epochs(model, *splits["train"], t, task.loss(params), t.seed * 1000 + rnd)
            updates.append(Update(site, model.state_dict(), len(splits["train"][1])))
        state, kept = agg.aggregate(rnd, state, updates, kept)
    per_site = {}
    for site, (_, splits) in data.items():
        model = build_model(t.model, len(mean), task.n_outputs)
        model.load_state_dict(state)
        model.eval()
        x, y = splits["test"]
        with torch.no_grad():
            per_site[site] = task.site_metrics(model(torch.from_numpy(x)), y, params)
    g = task.global_metrics(per_site)
    assert g["count"] == sum(len(d[1]["test"][1]) for d in data.values())
    assert g["macro_f1"] >= 0.85, (g, {s: m["macro_f1"] for s, m in per_site.items()})
    assert all(m["macro_f1"] >= 0.8 for m in per_site.values()), per_site
    assert task.gate_metric(t.gate.primary_metric).meets(g["macro_f1"], t.gate.absolute_floor)


def test_the_demo_job_aggregates_robustly() -> None:
    """fraud.yaml names no aggregator and 3 sites hold the demo's shards: the median (docs/security.md)."""
    assert load_job("fraud", "fraud", directory=SHIPPED).aggregator.name == "median"
