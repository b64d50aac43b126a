"""What `insitu up` checks on a platform that ran before (deployments/platform/consistency.py), on file:// stores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from deployments.platform.consistency import check_exchange, check_platform, check_site_store
from insitu.governance.anchors import anchor_key
from insitu.storage import Store


def _read(shard: str, url: str, job: str = "job-1") -> dict[str, Any]:
    return {"event": "data.read", "fields": {"shard": shard, "path": url, "job_id": job}}


def test_a_site_store_misses_the_shards_its_log_says_it_read(tmp_path: Path) -> None:
    store = Store(f"file://{tmp_path}/eu/")
    store.write_bytes("raw/a.parquet", b"a")
    url_a, url_b = store.full_url("raw/a.parquet"), store.full_url("raw/b.parquet")
    assert check_site_store("eu", store, []).ok  # nothing read yet: nothing to miss
    ok = check_site_store("eu", store, [_read("eu-000", url_a)])
    assert ok.ok and "all 1 shards" in ok.detail
    gap = check_site_store("eu", store, [_read("eu-000", url_a), _read("eu-001", url_b)])
    assert not gap.ok and "eu-001" in gap.detail and url_b in gap.detail and "eu-000" not in gap.detail
    assert gap.line().startswith("store eu: MISSING")
    # the newest read of a shard is what counts (the shard moved, and the new place is there)
    assert check_site_store("eu", store, [_read("eu-000", url_b), _read("eu-000", url_a)]).ok


def test_the_exchange_misses_the_newest_jobs_objects_or_an_anchor(tmp_path: Path) -> None:
    ex = Store(f"file://{tmp_path}/exchange/")
    events = [{"event": "job.planned", "fields": {"job_id": "old"}}, {"event": "x", "fields": {"job_id": "new"}},
              {"event": "audit.anchor", "fields": {}}]
    last = {"coordinator": {"seq": 3, "sha256": "a" * 64}, "eu": None}
    gap = check_exchange(ex, events, last)
    assert not gap.ok and "newest job new" in gap.detail and "coordinator's newest anchor (seq 3" in gap.detail
    ex.write_bytes("jobs/new/stats/eu/prepare.json", b"{}")
    ex.write_bytes(anchor_key("coordinator", 3, "a" * 64), b"{}")
    ok = check_exchange(ex, events, last)
    assert ok.ok and "newest job new: 1 objects" in ok.detail and "seq 3" in ok.detail, ok.detail
    assert check_exchange(ex, [], {}).detail == "no job and no anchor recorded yet"


def test_one_line_per_store_and_a_store_that_cannot_be_read_says_so(tmp_path: Path) -> None:
    logs = tmp_path / "audit"
    logs.mkdir()
    eu = Store(f"file://{tmp_path}/eu/")
    eu.write_bytes("raw/a.parquet", b"a")
    (logs / "eu.jsonl").write_text(json.dumps(_read("eu-000", eu.full_url("raw/a.parquet"))) + "\n")
    (logs / "coordinator.jsonl").write_text("")

    def open_store(name: str) -> Store:
        if name == "us":
            raise RuntimeError("no keys for us")
        return eu if name == "eu" else Store(f"file://{tmp_path}/exchange/")

    lines = check_platform(["eu", "us"], lambda a: logs / f"{a}.jsonl", open_store)
    assert [c.store for c in lines] == ["store eu", "store us", "exchange"]
    assert lines[0].ok and not lines[1].ok and "could not be checked: RuntimeError: no keys for us" in lines[1].detail
    assert lines[2].ok
