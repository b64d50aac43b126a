"""What the local exchange keeps of its write-once objects across restarts (the endpoint itself is tested in
tests/security/test_anchors_signed.py)."""

from __future__ import annotations

from pathlib import Path

from deployments.platform.s3_keep import keep, kept


def test_kept_objects_come_back_per_bucket_and_no_key_reaches_outside(tmp_path: Path) -> None:
    d = tmp_path / "kept"
    d.mkdir()
    keep(d, "insitu-exchange", "anchors/eu/000000000001-" + "a" * 64 + ".json", b"one")
    keep(d, "insitu-exchange", "anchors/eu/../../../../etc/evil", b"two")  # a key is a name, never a path
    keep(d, "other", "anchors/us/x.json", b"three")
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file() and p.parent != d) == []
    assert kept(d, "insitu-exchange") == [("anchors/eu/../../../../etc/evil", b"two"),
                                          ("anchors/eu/000000000001-" + "a" * 64 + ".json", b"one")]
    assert kept(d, "other") == [("anchors/us/x.json", b"three")]
    (d / "junk.json").write_text("{not json")
    assert len(kept(d, "insitu-exchange")) == 2  # skipped, with a warning
