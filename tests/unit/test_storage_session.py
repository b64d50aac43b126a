"""Each S3 filesystem gets a client of its own, built from the process's one botocore session."""

from __future__ import annotations

import os
import pickle

from insitu.storage import Store, botocore_session

OPTIONS = {"skip_instance_cache": True, "key": "k", "secret": "s",
           "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}  # building a client connects nowhere


def test_every_filesystem_has_its_own_client_from_one_session() -> None:
    a, b = Store("s3://bucket/", OPTIONS), Store("s3://other/", OPTIONS)
    fa, fb = a.fs.raw, b.fs.raw
    assert fa is not fb and a.fs.raw is not fa  # a filesystem per call: no connection pool shared between calls
    ca, cb = fa.connect(), fb.connect()
    assert ca is not cb
    assert fa.session is fb.session is botocore_session()
    assert ca._loader is cb._loader  # botocore's parsed models: loaded once per process


def test_the_session_stays_out_of_the_stores_options() -> None:
    store = Store("s3://bucket/", OPTIONS)
    store.fs.raw.connect()
    assert "session" not in store.options
    assert pickle.loads(pickle.dumps(store)) == store  # a Store is sent to the site's Dask workers


def test_a_forked_process_builds_its_own_session() -> None:
    parent = id(botocore_session())
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(w, b"1" if id(botocore_session()) != parent and botocore_session() is botocore_session() else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"


def test_what_pandas_and_the_checkpoint_writer_open_shares_the_session() -> None:
    """prepare's parquet reads and writes and torch's checkpoint writer open the store from Store.open_options."""
    import fsspec

    store = Store("s3://bucket/", OPTIONS)
    fs, _ = fsspec.core.url_to_fs(store.full_url("x.parquet"), **store.open_options)
    assert fs.session is botocore_session()
    assert Store("file:///tmp/", {}).open_options == {}
