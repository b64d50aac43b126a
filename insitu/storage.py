"""fsspec access to one store (a site's, or the exchange), configured from this process's environment.

A site's worker holds the endpoint and credentials of its own store and of the exchange only. The
names of the environment variables come from ``conf/sites.yaml``; their values never do, so a
process that is not the site's cannot open the site's store even when it knows its URL.

Every whole-object call through :attr:`Store.fs` (and every write through :class:`Store`) rides out the store
being unreachable for up to its ``outage_s`` (:mod:`insitu.outage`); past it, :class:`StoreUnavailable` names it.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import fsspec

from insitu.conf import StorageRef
from insitu.outage import DEFAULT_OUTAGE_S, Outage, StoreUnavailable

__all__ = ["Store", "StorageAccessError", "StoreUnavailable", "store_from_env"]


class StorageAccessError(RuntimeError):
    """This process does not hold the credentials or endpoint for a store."""


class OutageTolerantFileSystem:
    """An fsspec filesystem whose whole-object calls ride out an outage of its store (:class:`insitu.outage.Outage`).

    Calls that do their work in one go are tried again while the store is unreachable; everything else (a file
    object's reads, the cache) goes straight to the filesystem. A conditional create is not among them: a retried
    create whose first try landed would report the object as existing (:meth:`Store.write_new` handles that).
    """

    WHOLE = frozenset({
        "cat", "cat_file", "copy", "du", "exists", "find", "get_file", "glob", "info", "isdir", "isfile", "ls",
        "makedirs", "mkdir", "modified", "open", "pipe", "put_file", "rm", "rm_file", "size",
    })

    def __init__(self, fs: fsspec.AbstractFileSystem, outage: Outage, store: str) -> None:
        self.raw, self._outage, self._store = fs, outage, store

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.raw, name)
        if name not in self.WHOLE:
            return attr
        return functools.partial(self._outage.call, attr, what=name, store=self._store)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        if mode == "create":
            raise ValueError("a conditional create is not retried blindly: use Store.write_new")
        self._outage.call(self.raw.pipe_file, path, value, what="pipe_file", store=self._store, **kwargs)


_SESSION: tuple[int, Any] | None = None  # (pid, this process's aiobotocore session): a fork builds its own
_SESSION_LOCK = threading.Lock()


def botocore_session() -> Any:
    """This process's one aiobotocore session, from which every S3 filesystem builds its own client.

    A session of its own per filesystem parsed botocore's JSON service model and endpoint rules again for every
    client (tenths of a second of CPU each, a third of a job's CPU, measured with py-spy); one session's loader
    parses them once. The session holds no connection and no credentials (each client is given its store's keys).
    """
    global _SESSION
    with _SESSION_LOCK:
        if _SESSION is None or _SESSION[0] != os.getpid():
            from aiobotocore.session import AioSession

            _SESSION = (os.getpid(), AioSession())
        return _SESSION[1]


@dataclass(frozen=True)
class Store:
    """A store root (``s3://bucket/`` or ``file:///dir/``), the options to open it, and how long calls to it ride
    out its being unreachable."""

    url: str
    options: dict[str, Any] = field(default_factory=dict)
    outage_s: float = DEFAULT_OUTAGE_S

    @property
    def outage(self) -> Outage:
        return Outage(self.outage_s)

    @property
    def open_options(self) -> dict[str, Any]:
        """The options every filesystem of this store is opened with (here, and by pandas or torch's checkpoint
        writer): :attr:`options` plus, for S3, this process's botocore session (not kept in :attr:`options`: a
        Store is pickled to the site's Dask workers)."""
        if self.url.startswith("s3://") and "session" not in self.options:
            return {**self.options, "session": botocore_session()}
        return self.options

    @property
    def fs(self) -> OutageTolerantFileSystem:
        protocol = self.url.split("://", 1)[0]
        return OutageTolerantFileSystem(fsspec.filesystem(protocol, **self.open_options), self.outage, self.url)

    def ride_out(self, fn: Any, *args: Any, what: str, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` — a multi-call read or write against this store — tried again while it is
        unreachable, within its outage bound."""
        return self.outage.call(fn, *args, what=what, store=self.url, **kwargs)

    def path(self, relative: str) -> str:
        """Full path (URL without the protocol for s3, as fsspec filesystems expect)."""
        return self.url.split("://", 1)[1].rstrip("/") + "/" + relative.lstrip("/")

    def full_url(self, relative: str) -> str:
        return self.url.rstrip("/") + "/" + relative.lstrip("/")

    def write_bytes(self, relative: str, data: bytes, fs: OutageTolerantFileSystem | None = None) -> None:
        """Write one object (creating its folder on stores that have folders; object stores have none), through
        ``fs`` when given (a client kept for many calls, e.g. the exchange's), else a filesystem of its own."""
        fs, path = fs or self.fs, self.path(relative)
        if self.url.startswith("file://"):
            fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, data)  # one PUT: a retry after an outage writes the whole object again

    def write_new(self, relative: str, data: bytes) -> None:
        """Write one object that must not exist yet (a conditional write: ``If-None-Match: *`` on S3).

        Raises
        ------
        FileExistsError
            When the object exists: it is left as it is.
        """
        fs, path = self.fs, self.path(relative)
        if self.url.startswith("file://"):
            fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            with open(path, "xb") as f:
                f.write(data)
            return
        tries = 0

        def create() -> None:
            nonlocal tries
            tries += 1
            try:
                fs.raw.pipe_file(path, data, mode="create")
            except FileExistsError:
                # A try whose answer the outage lost may have landed: the object is then ours, byte for byte.
                if tries > 1 and fs.raw.cat_file(path) == data:
                    return
                raise

        self.ride_out(create, what="a conditional write")


def store_from_env(ref: StorageRef, owner: str, env: dict[str, str] | None = None) -> Store:
    """Open ``ref`` with the endpoint and keys found in this process's environment.

    Raises
    ------
    StorageAccessError
        When a variable ``ref`` names is not set: this process does not hold that store's keys.
    """
    env = dict(os.environ) if env is None else env
    if not ref.storage.startswith("s3://"):
        return Store(ref.storage, {}, ref.outage_s)
    missing = [n for n in (ref.endpoint_env, ref.key_env, ref.secret_env) if n and not env.get(n)]
    if missing:
        raise StorageAccessError(
            f"this process does not hold the credentials of {owner}'s store {ref.storage}: "
            f"{', '.join(missing)} not set (only {owner}'s own workers are given them)"
        )
    # A filesystem (and so a client and its connection pool) per Store.fs access: a process's one cached client,
    # shared by every store and thread, hung a site's run for good after its border was cut for a minute
    # (tests/e2e/test_wan_border.py; aiobotocore waits for a free pooled connection without a timeout), and
    # listings are never stale. The costly part of a new client, botocore's parsed models, is shared through the
    # process's one session (Store.fs). An object that makes many calls keeps the filesystem it opened: the
    # exchange (its reads and, since 92a3d5a, its writes) and the checkpointer.
    opts: dict[str, Any] = {"skip_instance_cache": True}
    outage_s = ref.outage_s
    if ref.key_env:
        opts["key"] = env[ref.key_env]
    if ref.secret_env:
        opts["secret"] = env[ref.secret_env]
    if ref.endpoint_env:
        opts["client_kwargs"] = {"endpoint_url": env[ref.endpoint_env]}
    return Store(ref.storage, opts, outage_s)
