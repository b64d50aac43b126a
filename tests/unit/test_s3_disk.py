"""The on-disk form of a local S3 endpoint's objects (the endpoint itself: tests/e2e/test_store_durable.py)."""

from __future__ import annotations

from pathlib import Path

from deployments.platform.s3_disk import DiskStore


def test_objects_come_back_by_bucket_and_key_and_no_key_reaches_outside(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "store")
    assert store.open() is False  # nothing to restore yet
    store.write_object("insitu-eu", "raw/fraud/part-000.parquet", b"one")
    store.write_object("insitu-eu", "../../../../etc/evil", b"two\nwith a newline")  # a key is a name, not a path
    store.write_object("insitu-eu", "raw/fraud/part-000.parquet", b"one, rewritten")
    store.delete_object("insitu-eu", "never-written")  # deleting what is not there is no error
    assert sorted(p.parent for p in tmp_path.rglob("*") if p.is_file()) == [store.objects] * 2
    assert sorted(store.stored()) == [("insitu-eu", "../../../../etc/evil", b"two\nwith a newline"),
                                      ("insitu-eu", "raw/fraud/part-000.parquet", b"one, rewritten")]
    store.delete_object("insitu-eu", "../../../../etc/evil")
    assert [k for _, k, _ in store.stored()] == ["raw/fraud/part-000.parquet"]


def test_unfinished_writes_and_foreign_files_are_not_objects(tmp_path: Path) -> None:
    store = DiskStore(tmp_path)
    store.open()
    store.write_object("b", "k", b"v")
    (store.objects / "abc.123.456.tmp").write_bytes(b'{"bucket": "b", "key": "half"}\nhal')  # killed mid-write
    (store.objects / "junk").write_bytes(b"not a header")
    (store.objects / ("0" * 64)).write_bytes(b'{"bucket": "b", "key": "k2"}\nnamed for another key')
    assert list(store.stored()) == [("b", "k", b"v")]
    assert not (store.objects / "abc.123.456.tmp").exists()


def test_the_setup_is_written_through_and_read_back(tmp_path: Path) -> None:
    store = DiskStore(tmp_path)
    store.open()
    store.change_setup(lambda s: s["buckets"].append("insitu-eu"))
    store.change_setup(lambda s: s["users"].setdefault("eu", {"policies": {"insitu": "{}"}, "keys": [["AK", "S"]]}))
    again = DiskStore(tmp_path)
    assert again.open() is True
    assert again.setup == {"buckets": ["insitu-eu"],
                           "users": {"eu": {"policies": {"insitu": "{}"}, "keys": [["AK", "S"]]}}}
    assert oct(store.setup_file.stat().st_mode & 0o777) == "0o600"
