"""What the code writes today fits the protocol's schemas: each producer's real output goes through the Exchange."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
import torch
from protocol_examples import ran_as, store

from insitu.data.prepare import SPLITS, ShardReport, prepare_shard, prepared_prefix, quarantine_prefix
from insitu.data.synthetic import generate
from insitu.federated.documents.manifests import TrainMetrics
from insitu.federated.exchange import Exchange, ExchangeError
from insitu.federated.rounds import RoundResult, round_name
from insitu.federated.schemas import ARTEFACTS
from insitu.gate import decide
from insitu.job import JobSpec, load_job
from insitu.models import build_model
from insitu.parallel.loop import train_epochs
from insitu.summary import collect_identities, job_summary

JOB = "job-7"


@pytest.fixture(scope="module")
def conf(conf_dir: Path) -> JobSpec:
    return load_job("fraud", directory=conf_dir)


def _ex(tmp_path: Path, writer: str) -> Exchange:
    return Exchange(store(tmp_path), JOB, writer)


def test_every_artefact_has_a_byte_bound_and_one_writer() -> None:
    for a in ARTEFACTS:
        assert a.max_bytes > 0 and a.writer in ("coordinator", "site")
        assert (a.schema is None) == a.pattern.pattern.endswith(r"\.pt")


def test_the_plan_fits(tmp_path: Path, conf: JobSpec) -> None:
    plan = {s: [sh.id for sh in conf.dataset.shards_of(s)] for s in conf.sites.names}
    doc = {"job_id": JOB, "dataset": conf.dataset_name, "shards": plan, "config_hash": conf.config_hash,
           "training": conf.training.model_dump(mode="json")}  # as flows/retrain.py writes it
    coord = _ex(tmp_path, "coordinator")
    coord.put_json("plan", "plan.json", doc)
    assert coord.get_json("plan", "plan.json") == doc
    with pytest.raises(ExchangeError, match="its 'job_id' is 'job-7', not 'other'"):
        Exchange(store(tmp_path), "other", "coordinator").put_json("plan", "plan.json", doc)
    with pytest.raises(ExchangeError, match="training.rows: key not allowed"):
        coord.put_json("plan", "plan.json", {**doc, "training": {**doc["training"], "rows": [1, 2]}})


def _prepared(tmp_path: Path, conf: JobSpec) -> list[ShardReport]:
    """Real shard reports: one good shard, one unreadable (with a long error message)."""
    root = tmp_path / "site"
    (root / "raw/fraud").mkdir(parents=True)
    (root / quarantine_prefix("fraud", JOB)).mkdir(parents=True)
    for s in SPLITS:
        (root / prepared_prefix("fraud", JOB) / s).mkdir(parents=True)
    good, bad = conf.dataset.shard("eu-000"), conf.dataset.shard("eu-001")
    generate("eu", 400, seed=3).to_parquet(root / good.path, index=False)
    (root / bad.path).write_bytes(b"not parquet, " * 400)
    site = store(root)
    reports = [prepare_shard(site, sh, conf.dataset.schema_, conf.training.split, 7, "fraud", JOB)
               for sh in (good, bad)]
    reports[1].error = (reports[1].error or "") + " quoting the file: " + "not parquet, " * 100
    return reports


def test_the_prepare_statistics_and_the_global_statistics_fit(tmp_path: Path, conf: JobSpec) -> None:
    from tasks.federation import publish_global_stats, publish_initial_weights
    from tasks.prepare import MAX_ERROR_CHARS, publishable

    reports = _prepared(tmp_path, conf)
    for site in ("eu", "us"):
        summary = publishable(reports, raw_bytes=12_345, site=site)
        summary["site"], summary["ran_as"] = site, ran_as(site)  # as flows/site_prepare.py adds them
        _ex(tmp_path, site).put_json("stats", "prepare.json", summary)
    published = _ex(tmp_path, "coordinator").get_json("stats", "prepare.json", writer="eu")
    assert len(published["shards"]["eu-001"]["error"]) == MAX_ERROR_CHARS  # cut, not refused
    with pytest.raises(ValueError, match="statistics over fewer than 1000 rows"):
        publishable(reports, 0, "eu", floor=1000)

    coord = _ex(tmp_path, "coordinator")
    stats = publish_global_stats.fn(coord, conf, ["eu", "us"])
    assert coord.get_json("stats", "global.json") == stats["norm"]
    assert _ex(tmp_path, "eu").get_json("stats", "global.json", writer="coordinator") == stats["norm"]
    first = publish_initial_weights.fn(coord, conf, stats["norm"])
    assert publish_initial_weights.fn(coord, conf, stats["norm"]) == first  # a re-run reads it back


def test_a_site_with_statistics_of_another_width_is_refused(tmp_path: Path, conf: JobSpec) -> None:
    from protocol_examples import prepare_stats

    from tasks.federation import publish_global_stats

    _ex(tmp_path, "eu").put_json("stats", "prepare.json", prepare_stats("eu", width=3))
    with pytest.raises(ValueError, match="site eu published statistics of 3 features; the dataset has 30"):
        publish_global_stats.fn(_ex(tmp_path, "coordinator"), conf, ["eu"])


def test_an_update_manifest_with_the_real_training_metrics_fits(tmp_path: Path, conf: JobSpec) -> None:
    torch.manual_seed(0)
    model = build_model(conf.training.model, 30)
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 30)).astype(np.float32), (rng.random(64) < 0.2).astype(np.float32)
    metrics = train_epochs(model, x, y, conf.training, conf.task.loss({"pos_weight": 4.0}), seed=1)
    metrics.pop("loss_sum"), metrics.pop("loss_rows")  # rank_main reduces these into train_loss over the ranks
    metrics["ranks"], metrics["replicas"] = 2.0, 2.0  # what rank_main adds
    assert set(metrics) <= set(TrainMetrics.model_fields)
    base = _ex(tmp_path, "coordinator").put_state("weights", round_name(0), ref, round=0)
    man = _ex(tmp_path, "eu").put_state("update", round_name(0), model.state_dict(), reference=ref, round=0,
                                        n_samples=64, base_sha256=base["sha256"], metrics=metrics, ran_as=ran_as("eu"))
    _, read = _ex(tmp_path, "coordinator").get_state("update", round_name(0), writer="eu", reference=ref)
    assert read == man


def test_the_champion_weights_fit(tmp_path: Path) -> None:
    coord = _ex(tmp_path, "coordinator")
    coord.put_state("weights", "champion", {"w": torch.zeros(2)}, version="12")
    state, man = _ex(tmp_path, "us").get_state("weights", "champion", writer="coordinator")
    assert man["version"] == "12" and torch.equal(state["w"], torch.zeros(2))


def _summary(tmp_path: Path, conf: JobSpec, gate: dict[str, object]) -> dict[str, object]:
    from protocol_examples import evaluation, model_metrics, prepare_stats, publish_global, publish_update

    ref, base = publish_global(tmp_path, job=JOB)
    for s in ("eu", "us"):
        _ex(tmp_path, s).put_json("stats", "prepare.json", prepare_stats(s))
        publish_update(tmp_path, s, 0, ref, ref, base, job=JOB)
        _ex(tmp_path, s).put_json("metrics", "evaluate.json", evaluation(s))
    coord = _ex(tmp_path, "coordinator")
    per_site = {s: coord.get_json("stats", "prepare.json", writer=s) for s in ("eu", "us")}
    rounds = [RoundResult(0, ["eu"], ["us"], 100, {"eu": {"train_loss": 0.3}}, sha256="a" * 64,
                          rejected={"us": "update/round-0000.pt of us: 'w' holds NaN or infinite values"}).as_dict()]
    site_metrics = {"eu": model_metrics(), "us": {}}  # us withheld its metrics
    reg = {"model_name": "insitu-fraud", "version": "3", "alias": "champion", "run_id": "0123abcd" * 4, "gate": gate}
    ids = collect_identities(coord, {"actor": "coordinator", "os_user": "insitu-coordinator", "pool": "insitu-c"},
                             ["eu", "us"], ["eu"], 1)
    return job_summary(JOB, conf, per_site, rounds, site_metrics, {"pr_auc": float("nan"), "count": 100.0}, reg,
                       coord.ledger(), datetime.now(UTC), ids)


def test_the_job_summary_fits(tmp_path: Path, conf: JobSpec) -> None:
    decision = decide(conf.training.gate, conf.task.gate_metric(None), {"pr_auc": 0.4}, {"eu": {"pr_auc": 0.4}},
                      {"pr_auc": 0.3}, {"eu": {"pr_auc": 0.35}})
    gate = {**decision.as_dict(), "version": "3", "previous_champion": "2", "champion": "3"}  # gate_and_promote
    summary = _summary(tmp_path, conf, gate)
    coord = _ex(tmp_path, "coordinator")
    coord.put_json("summary", "summary.json", summary)
    back = coord.get_json("summary", "summary.json")
    assert back["model"]["gate"]["site_deltas"] == pytest.approx({"eu": 0.05})
    # a version judged before (a re-run) reports the candidate's global metrics
    rejudged = {"passed": True, "reason": "judged", "primary_metric": "pr_auc", "candidate": {"pr_auc": 0.4},
                "site_deltas": {}, "version": "3", "previous_champion": None, "champion": "3"}
    coord.put_json("summary", "summary.json", _summary(tmp_path / "again", conf, rejudged) | {"job_id": JOB})


def test_the_abort_marker_fits(tmp_path: Path) -> None:
    _ex(tmp_path, "coordinator").put_abort("QuorumError: round 2: quorum not met")
    assert _ex(tmp_path, "eu").get_json("control", "abort.json", writer="coordinator") == {
        "reason": "QuorumError: round 2: quorum not met"}


def test_a_read_survives_the_object_being_replaced_between_open_and_read(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """s3fs pins an object's ETag at open; a writer replacing it before the read raises FileExpired (EBUSY).
    The coordinator rewrites its async state while sites poll it: the read opens the object again."""
    from s3fs.utils import FileExpired

    coord = _ex(tmp_path, "coordinator")
    coord.put_abort("x")
    real_open, calls = coord.fs.raw.open, []

    def flaky_open(path: str, mode: str = "rb", **kw: object) -> object:
        calls.append(path)
        if len(calls) == 1:
            raise FileExpired(path, "etag-before")
        return real_open(path, mode, **kw)

    site = _ex(tmp_path, "eu")
    monkeypatch.setattr(site.fs.raw, "open", flaky_open)
    from insitu.federated.paths import ABORT

    assert site.get_json(ABORT, writer="coordinator")["reason"] == "x"
    assert len(calls) == 2


def test_a_summary_naming_suspect_sites_fits(tmp_path: Path, conf: JobSpec) -> None:
    gate = {"passed": True, "reason": "first", "primary_metric": "pr_auc"}
    summary = _summary(tmp_path, conf, gate) | {"suspects": {"us": ["the evaluation of round-0002 of us: pr_auc 1.5 "
                                                                    "is outside [0, 1] [integrity.metrics-range]"]}}
    coord = _ex(tmp_path, "coordinator")
    coord.put_json("summary", "summary.json", summary)
    assert coord.get_json("summary", "summary.json")["suspects"]["us"][0].startswith("the evaluation")
