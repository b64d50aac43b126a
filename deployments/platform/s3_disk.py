"""A local S3 endpoint (moto) that keeps every object and its IAM set-up on disk, written through.

moto keeps its buckets, objects, IAM users and access keys in memory, so a restarted endpoint used to come back
empty: every shard a user put, every prepared split, every job's exchange objects. Here the endpoint writes each
change to its data directory before it answers the request — what a client saw acknowledged is on disk, even if
the process is killed the next instant — and puts everything back before it serves its first request:

- ``objects/<sha256(bucket/key)>``: one file per object, a JSON header line ``{"bucket", "key"}`` and then the
  object's bytes; written to a temporary file, fsynced and renamed over the old one (after a crash an object is
  the old or the new one, never half of either), then the directory fsynced. A key is never a path: the name is
  its hash, so no key reaches outside the directory.
- ``setup.json``: the buckets, the IAM users, their inline policies and access keys (the endpoint's own
  secrets; the directory is the store's alone, mode 0700).

An endpoint that restored a set-up authenticates every request from the first one: there is no unauthenticated
set-up window to abuse, the platform provisioned it once, and the keys the platform handed to the sites still
work, so nothing that holds them needs a restart. Why moto kept and not another server: moto is what enforces
the IAM policies the sites and the exchange rely on (per-site prefixes on the exchange), with the S3 API the
sites use today, and it starts in under a second; no maintained persistent S3 server with IAM policies installs
from the package registries here (MinIO's server is packaged for neither pip nor Debian; Debian's rclone 1.60
predates ``rclone serve s3``, which has no per-user policies anyway).

What is not kept: object metadata beyond the bytes (content type, user metadata, tags), versions, multipart uploads
not yet completed (not acknowledged as objects either).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

REGION = "us-east-1"  # the region the platform provisions its buckets in (insitu.governance.iam.provision)
_STRIPES = 64


class DiskStore:
    """The data directory of one endpoint: its objects and its set-up."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.objects = root / "objects"
        self.setup_file = root / "setup.json"
        self._setup_lock = threading.Lock()
        self._locks = [threading.Lock() for _ in range(_STRIPES)]
        self.setup: dict[str, Any] = {"buckets": [], "users": {}}

    def open(self) -> bool:
        """Create the directories; load the set-up. True when there was one to restore."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.objects.mkdir(exist_ok=True, mode=0o700)
        if not self.setup_file.is_file():
            return False
        self.setup = json.loads(self.setup_file.read_text())
        return True

    # ------------------------------------------------------------------ objects
    def name(self, bucket: str, key: str) -> str:
        return hashlib.sha256(f"{bucket}/{key}".encode()).hexdigest()

    def lock(self, bucket: str, key: str) -> threading.Lock:
        """One lock per key (striped): the write to memory and the write to disk of one key stay in order."""
        return self._locks[int(self.name(bucket, key)[:8], 16) % _STRIPES]

    def write_object(self, bucket: str, key: str, value: bytes) -> None:
        final = self.objects / self.name(bucket, key)
        header = json.dumps({"bucket": bucket, "key": key}).encode() + b"\n"
        _write_atomically(final, header + value)

    def delete_object(self, bucket: str, key: str) -> None:
        try:
            (self.objects / self.name(bucket, key)).unlink()
        except FileNotFoundError:
            return
        _fsync_dir(self.objects)

    def stored(self) -> Iterator[tuple[str, str, bytes]]:
        """Every kept object: (bucket, key, bytes). A file that is not one is skipped with a warning."""
        for f in sorted(self.objects.iterdir()):
            if f.name.endswith(".tmp"):  # a write the process did not finish: never acknowledged
                f.unlink(missing_ok=True)
                continue
            data = f.read_bytes()
            head, sep, value = data.partition(b"\n")
            try:
                rec = json.loads(head) if sep else None
                bucket, key = str(rec["bucket"]), str(rec["key"])  # type: ignore[index]
            except (ValueError, KeyError, TypeError):
                log.warning("%s: not a kept object; skipped", f)
                continue
            if f.name != self.name(bucket, key):
                log.warning("%s: named for another key than %s/%s; skipped", f, bucket, key)
                continue
            yield bucket, key, value

    # ------------------------------------------------------------------ set-up
    def change_setup(self, change: Any) -> None:
        """Apply ``change(setup)`` and write the set-up through."""
        with self._setup_lock:
            change(self.setup)
            _write_atomically(self.setup_file, json.dumps(self.setup, indent=1, sort_keys=True).encode())


def _write_atomically(final: Path, data: bytes) -> None:
    tmp = final.with_name(f"{final.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(final.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _backends() -> tuple[Any, Any]:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.iam.models import iam_backends
    from moto.s3.models import s3_backends

    return s3_backends[DEFAULT_ACCOUNT_ID]["aws"], iam_backends[DEFAULT_ACCOUNT_ID]["global"]


def restore(store: DiskStore) -> dict[str, int]:
    """Put the kept set-up and objects back into moto's memory (before :func:`install`, before serving)."""
    s3, iam = _backends()
    for bucket in store.setup["buckets"]:
        s3.create_bucket(bucket, REGION)
    keys = 0
    for user, rec in store.setup["users"].items():
        iam.create_user(REGION, user)
        for policy, document in rec["policies"].items():
            iam.put_user_policy(user, policy, document)
        for key_id, secret in rec["keys"]:
            key = iam.create_access_key(user)
            del iam.access_keys[key.physical_resource_id]
            key.access_key_id, key.secret_access_key = key_id, secret
            iam.access_keys[key.physical_resource_id] = key
            keys += 1
    objects = 0
    for bucket, key, value in store.stored():
        if bucket not in store.setup["buckets"]:
            log.warning("kept object %s/%s: its bucket is gone; skipped", bucket, key)
            continue
        s3.put_object(bucket, key, value, disable_notification=True)
        objects += 1
    return {"buckets": len(store.setup["buckets"]), "users": len(store.setup["users"]), "keys": keys,
            "objects": objects}


def install(store: DiskStore) -> None:
    """Make moto write every object change and every set-up change through to ``store`` before it answers."""
    from moto.iam.models import IAMBackend
    from moto.s3.models import S3Backend

    put, delete = S3Backend.put_object, S3Backend.delete_object
    create_bucket, delete_bucket = S3Backend.create_bucket, S3Backend.delete_bucket

    def put_object(self: Any, bucket_name: str, key_name: str, value: bytes, *a: Any, **kw: Any) -> Any:
        with store.lock(bucket_name, key_name):
            new = put(self, bucket_name, key_name, value, *a, **kw)
            store.write_object(bucket_name, key_name, bytes(value))
        return new

    def delete_object(self: Any, bucket_name: str, key_name: str, *a: Any, **kw: Any) -> Any:
        with store.lock(bucket_name, key_name):
            out = delete(self, bucket_name, key_name, *a, **kw)
            if self.get_bucket(bucket_name).keys.get(key_name) is None:
                store.delete_object(bucket_name, key_name)
        return out

    def on_create_bucket(self: Any, bucket_name: str, *a: Any, **kw: Any) -> Any:
        bucket = create_bucket(self, bucket_name, *a, **kw)
        store.change_setup(lambda s: s["buckets"].append(bucket_name) if bucket_name not in s["buckets"] else None)
        return bucket

    def on_delete_bucket(self: Any, bucket_name: str) -> Any:
        out = delete_bucket(self, bucket_name)
        store.change_setup(lambda s: s["buckets"].remove(bucket_name) if bucket_name in s["buckets"] else None)
        return out

    S3Backend.put_object = put_object  # type: ignore[method-assign]
    S3Backend.delete_object = delete_object  # type: ignore[method-assign]
    S3Backend.create_bucket = on_create_bucket  # type: ignore[method-assign]
    S3Backend.delete_bucket = on_delete_bucket  # type: ignore[method-assign]
    _install_iam(IAMBackend, store)


def _install_iam(backend: Any, store: DiskStore) -> None:
    create_user, delete_user = backend.create_user, backend.delete_user
    put_policy, delete_policy = backend.put_user_policy, backend.delete_user_policy
    create_key, delete_key = backend.create_access_key, backend.delete_access_key

    def user(s: dict[str, Any], name: str) -> dict[str, Any]:
        return s["users"].setdefault(name, {"policies": {}, "keys": []})

    def on_create_user(self: Any, region_name: str, user_name: str, *a: Any, **kw: Any) -> Any:
        out = create_user(self, region_name, user_name, *a, **kw)
        store.change_setup(lambda s: user(s, user_name))
        return out

    def on_delete_user(self: Any, user_name: str) -> Any:
        out = delete_user(self, user_name)
        store.change_setup(lambda s: s["users"].pop(user_name, None))
        return out

    def on_put_policy(self: Any, user_name: str, policy_name: str, policy_json: str) -> Any:
        out = put_policy(self, user_name, policy_name, policy_json)
        store.change_setup(lambda s: user(s, user_name)["policies"].__setitem__(policy_name, policy_json))
        return out

    def on_delete_policy(self: Any, user_name: str, policy_name: str) -> Any:
        out = delete_policy(self, user_name, policy_name)
        store.change_setup(lambda s: user(s, user_name)["policies"].pop(policy_name, None))
        return out

    def on_create_key(self: Any, user_name: str, *a: Any, **kw: Any) -> Any:
        key = create_key(self, user_name, *a, **kw)
        store.change_setup(lambda s: user(s, user_name)["keys"].append([key.access_key_id, key.secret_access_key]))
        return key

    def on_delete_key(self: Any, access_key_id: str, user_name: str) -> Any:
        out = delete_key(self, access_key_id, user_name)
        store.change_setup(lambda s: user(s, user_name).__setitem__(
            "keys", [k for k in user(s, user_name)["keys"] if k[0] != access_key_id]))
        return out

    backend.create_user, backend.delete_user = on_create_user, on_delete_user
    backend.put_user_policy, backend.delete_user_policy = on_put_policy, on_delete_policy
    backend.create_access_key, backend.delete_access_key = on_create_key, on_delete_key
