"""A job's plan and resume rules (insitu/federated/job.py)."""

from __future__ import annotations

from pathlib import Path

from insitu.conf import load_conf
from insitu.federated.plan import resume_refusal, shard_plan, sites_prepared_before


def test_each_shard_goes_to_its_own_site_only(conf_dir: Path) -> None:
    conf = load_conf("fraud", "fraud", conf_dir)
    plan = shard_plan(conf)
    assert plan == {"eu": ["eu-000", "eu-001"], "us": ["us-000", "us-001"],
                    "apac": ["apac-000", "apac-001", "apac-002"]}
    for site, ids in plan.items():
        assert all(conf.dataset.shard(i).site == site for i in ids)


def test_a_job_resumes_only_under_its_configuration() -> None:
    assert resume_refusal(None, "abc", "j", "fraud", {}) is None  # a new job
    assert resume_refusal({"config_hash": "abc"}, "abc", "j", "fraud", {}) is None
    why = resume_refusal({"config_hash": "abc"}, "def", "j", "fraud", {"rounds": 3})
    assert why is not None and "started with configuration hash abc; this run's is def" in why
    assert "overrides {'rounds': 3}" in why and "leave job_id empty to start a new job" in why


def test_a_preparation_is_reused_once_global_statistics_exist() -> None:
    assert sites_prepared_before(False, {"eu": True, "us": False}) is None  # nothing trained yet: prepare again
    assert sites_prepared_before(True, {"eu": True, "us": False, "apac": True}) == ["eu", "apac"]
