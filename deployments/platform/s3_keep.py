"""Write-once prefixes on the local S3 endpoint (moto), kept on disk across ``insitu down`` / ``up``.

Audit anchors (``insitu.governance.anchors``) must never be written over: a site holds credentials that
may add objects under its ``anchors/<site>/``, and nothing else should decide what an existing anchor
says. In production the exchange bucket does this itself (S3 Object Lock in compliance mode, and a bucket
policy that denies a ``PutObject`` under ``anchors/`` without ``If-None-Match: *``; see docs/security.md).
Locally, moto's IAM ignores conditions, so this endpoint enforces it where every write ends: moto's
``S3Backend.put_object``, which PutObject, CopyObject and CompleteMultipartUpload all go through, after
moto has authenticated and authorised the request. A write to an existing key under a write-once prefix
is refused with 403 ``AccessDenied`` naming the key and the rule.

moto keeps everything in memory, and the platform starts a fresh endpoint at each ``up``. So each
write-once object is also written to ``keep`` (a directory of the operator's; one file per object, named by
a hash, never by the key, so no key can reach outside it) and put back, without a request, when the
platform creates the bucket again.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RULE = "audit.anchor-write-once"
MAX_OBJECT_BYTES = 64 * 1024  # an anchor is a few hundred bytes; nothing larger is kept under these prefixes
_lock = threading.Lock()


def _refusal(code: str, message: str) -> Exception:
    from moto.s3.exceptions import S3ClientError

    class WriteOnceRefused(S3ClientError):
        pass

    err = WriteOnceRefused(code, message)
    err.code = code
    return err


def _kept_name(bucket: str, key: str) -> str:
    return hashlib.sha256(f"{bucket}/{key}".encode()).hexdigest() + ".json"


def keep(directory: Path, bucket: str, key: str, value: bytes) -> None:
    """Write one object to ``directory`` (atomically; an existing copy is the same object)."""
    final = directory / _kept_name(bucket, key)
    tmp = final.with_name(f"{final.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"bucket": bucket, "key": key, "data": base64.b64encode(value).decode()}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)


def kept(directory: Path, bucket: str) -> list[tuple[str, bytes]]:
    """The objects kept for ``bucket``: (key, bytes), in key order."""
    out = []
    for f in sorted(directory.glob("*.json")):
        try:
            rec = json.loads(f.read_text())
            if rec["bucket"] == bucket and f.name == _kept_name(bucket, rec["key"]):
                out.append((str(rec["key"]), base64.b64decode(rec["data"])))
        except (ValueError, KeyError, TypeError):
            log.warning("%s: not a kept object; skipped", f)
    return sorted(out)


def install(prefixes: tuple[str, ...], keep_dir: str | None) -> None:
    """Make moto's S3 backend refuse to write over a key under ``prefixes``, and keep those objects in
    ``keep_dir`` (put back when their bucket is created)."""
    from moto.s3.models import S3Backend

    directory = Path(keep_dir) if keep_dir else None
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    original_put, original_create = S3Backend.put_object, S3Backend.create_bucket

    def put_object(self: S3Backend, bucket_name: str, key_name: str, value: bytes, *a: Any, **kw: Any) -> Any:
        if not key_name.startswith(prefixes):
            return original_put(self, bucket_name, key_name, value, *a, **kw)
        if len(value) > MAX_OBJECT_BYTES:
            raise _refusal("EntityTooLarge", f"{key_name}: {len(value)} bytes; objects under a write-once prefix "
                                             f"have at most {MAX_OBJECT_BYTES} (rule {RULE})")
        with _lock:
            if self.get_bucket(bucket_name).keys.get(key_name) is not None:
                log.warning("refused to write over %s/%s (rule %s)", bucket_name, key_name, RULE)
                raise _refusal("AccessDenied", f"{key_name} exists and is write-once: an audit anchor is never "
                                               f"written over (rule {RULE}). Fix: write a new anchor key")
            new = original_put(self, bucket_name, key_name, value, *a, **kw)
            if directory is not None:
                keep(directory, bucket_name, key_name, bytes(value))
        return new

    def create_bucket(self: S3Backend, bucket_name: str, *a: Any, **kw: Any) -> Any:
        bucket = original_create(self, bucket_name, *a, **kw)
        if directory is not None:
            objects = kept(directory, bucket_name)
            for key, value in objects:
                original_put(self, bucket_name, key, value, disable_notification=True)
            log.info("bucket %s: %d kept objects put back from %s", bucket_name, len(objects), directory)
        return bucket

    S3Backend.put_object = put_object  # type: ignore[method-assign]
    S3Backend.create_bucket = create_bucket  # type: ignore[method-assign]
