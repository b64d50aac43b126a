"""Write-once prefixes on the local S3 endpoint (moto).

Audit anchors (``insitu.governance.anchors``) must never be written over: a site holds credentials that
may add objects under its ``anchors/<site>/``, and nothing else should decide what an existing anchor
says. In production the exchange bucket does this itself (S3 Object Lock in compliance mode, and a bucket
policy that denies a ``PutObject`` under ``anchors/`` without ``If-None-Match: *``; see docs/security.md).
Locally, moto's IAM ignores conditions, so this endpoint enforces it where every write ends: moto's
``S3Backend.put_object``, which PutObject, CopyObject and CompleteMultipartUpload all go through, after
moto has authenticated and authorised the request. A write to an existing key under a write-once prefix
is refused with 403 ``AccessDenied`` naming the key and the rule.

Like every object of the local endpoints, anchors are kept on disk across ``insitu down`` / ``up`` and a crash
of the endpoint (:mod:`deployments.platform.s3_disk`).
"""

from __future__ import annotations

import logging
import threading
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


def install(prefixes: tuple[str, ...]) -> None:
    """Make moto's S3 backend refuse to write over a key under ``prefixes``."""
    from moto.s3.models import S3Backend

    original_put = S3Backend.put_object

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
            return original_put(self, bucket_name, key_name, value, *a, **kw)

    S3Backend.put_object = put_object  # type: ignore[method-assign]
