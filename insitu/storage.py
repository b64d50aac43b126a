"""fsspec access to one store (a site's, or the exchange), configured from this process's environment.

A site's worker holds the endpoint and credentials of its own store and of the exchange only. The
names of the environment variables come from ``conf/sites.yaml``; their values never do, so a
process that is not the site's cannot open the site's store even when it knows its URL.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import fsspec

from insitu.conf import StorageRef


class StorageAccessError(RuntimeError):
    """This process does not hold the credentials or endpoint for a store."""


@dataclass(frozen=True)
class Store:
    """A store root (``s3://bucket/`` or ``file:///dir/``) plus the options to open it."""

    url: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        protocol = self.url.split("://", 1)[0]
        return fsspec.filesystem(protocol, **self.options)

    def path(self, relative: str) -> str:
        """Full path (URL without the protocol for s3, as fsspec filesystems expect)."""
        return self.url.split("://", 1)[1].rstrip("/") + "/" + relative.lstrip("/")

    def full_url(self, relative: str) -> str:
        return self.url.rstrip("/") + "/" + relative.lstrip("/")

    def write_bytes(self, relative: str, data: bytes) -> None:
        """Write one object (creating its folder on stores that have folders; object stores have none)."""
        fs, path = self.fs, self.path(relative)
        if self.url.startswith("file://"):
            fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with fs.open(path, "wb") as f:
            f.write(data)

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
        fs.pipe_file(path, data, mode="create")


def store_from_env(ref: StorageRef, owner: str, env: dict[str, str] | None = None) -> Store:
    """Open ``ref`` with the endpoint and keys found in this process's environment.

    Raises
    ------
    StorageAccessError
        When a variable ``ref`` names is not set: this process does not hold that store's keys.
    """
    env = dict(os.environ) if env is None else env
    if not ref.storage.startswith("s3://"):
        return Store(ref.storage, {})
    missing = [n for n in (ref.endpoint_env, ref.key_env, ref.secret_env) if n and not env.get(n)]
    if missing:
        raise StorageAccessError(
            f"this process does not hold the credentials of {owner}'s store {ref.storage}: "
            f"{', '.join(missing)} not set (only {owner}'s own workers are given them)"
        )
    opts: dict[str, Any] = {"skip_instance_cache": True}
    if ref.key_env:
        opts["key"] = env[ref.key_env]
    if ref.secret_env:
        opts["secret"] = env[ref.secret_env]
    if ref.endpoint_env:
        opts["client_kwargs"] = {"endpoint_url": env[ref.endpoint_env]}
    return Store(ref.storage, opts)
