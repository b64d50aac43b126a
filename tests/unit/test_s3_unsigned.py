"""The local S3 endpoint answers an unsigned request with S3's 403 AccessDenied and a reason (moto gave 500)."""

from __future__ import annotations

from typing import Any

from deployments.platform.s3 import RefuseAdminApi, is_signed


def _call(environ: dict[str, Any]) -> tuple[str, bytes]:
    seen: list[str] = []
    app = RefuseAdminApi(lambda env, start: (start("200 OK", []), [b"moto"])[1])
    body = b"".join(app({"PATH_INFO": "/bucket/key", "QUERY_STRING": "", **environ}, lambda s, h: seen.append(s)))
    return seen[0], body


def test_unsigned_requests_get_403_with_the_reason() -> None:
    status, body = _call({})
    assert status.startswith("403") and b"<Code>AccessDenied</Code>" in body and b"Anonymous requests" in body


def test_signed_and_presigned_requests_go_to_moto() -> None:
    assert _call({"HTTP_AUTHORIZATION": "AWS4-HMAC-SHA256 Credential=x"}) == ("200 OK", b"moto")
    assert _call({"QUERY_STRING": "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=ab"}) == ("200 OK", b"moto")
    assert not is_signed({"HTTP_AUTHORIZATION": "  "})
    assert _call({"PATH_INFO": "/moto-api/data.json", "HTTP_AUTHORIZATION": "x"})[0].startswith("403")
