"""One local S3 endpoint (``python -m deployments.platform.s3 --port P``): moto's server without its admin API.

moto serves ``/moto-api/`` beside S3 and IAM: unauthenticated, it can switch authentication off
(``reset-auth``) and lists every user's secret key (``data.json``). Any local process could then read
every site's store, so this endpoint answers 403 there: S3 and IAM requests are all that remain, and
moto authenticates those once the platform's setup requests are spent (``INITIAL_NO_AUTH_ACTION_COUNT``).

moto answers a request that carries no signature at all with HTTP 500 (it fails parsing the missing
``Authorization``). Here such a request gets what S3 answers: 403 ``AccessDenied`` with the reason. Every
request the platform makes is signed (its setup calls too, with a placeholder key), so unsigned requests are
refused from the first one: they never use up moto's unauthenticated setup window either.

With ``--data DIR`` the endpoint keeps every object and its IAM set-up in ``DIR``, written through before it
answers, and puts them back when it starts again (:mod:`deployments.platform.s3_disk`): after ``insitu down`` /
``up`` or a crash, the same objects under the same keys and policies. The exchange's endpoint also keeps audit
anchors write-once (``--write-once anchors/``, :mod:`deployments.platform.s3_keep`): an object under a
write-once prefix is never written over, whatever the request (PutObject, CopyObject, a multipart upload, any
addressing style).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from deployments.platform.s3_disk import DiskStore, install, restore

ADMIN_PREFIX = "/moto-api"
log = logging.getLogger("deployments.platform.s3")


UNSIGNED = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code><Message>Anonymous '
            b"requests are not accepted by this endpoint: sign the request with an access key of this store (AWS "
            b"Signature Version 4)</Message></Error>\n")


def is_signed(environ: dict[str, Any]) -> bool:
    """Whether a request carries an AWS signature: an ``Authorization`` header, or a presigned URL's query."""
    if environ.get("HTTP_AUTHORIZATION", "").strip():
        return True
    query = environ.get("QUERY_STRING", "")
    return "X-Amz-Signature=" in query or "Signature=" in query


class RefuseAdminApi:
    """WSGI middleware: 403 for moto's admin API and for unsigned requests, everything else to moto."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "").startswith(ADMIN_PREFIX):
            start_response("403 Forbidden", [("Content-Type", "text/plain")])
            return [b"the admin API of this S3 endpoint is disabled\n"]
        if not is_signed(environ):
            start_response("403 Forbidden", [("Content-Type", "application/xml"),
                                             ("Content-Length", str(len(UNSIGNED)))])
            return [UNSIGNED]
        return self.app(environ, start_response)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m deployments.platform.s3")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--write-once", action="append", default=[], metavar="PREFIX",
                    help="keys under PREFIX are never written over (audit anchors)")
    ap.add_argument("--data", type=Path, default=None, metavar="DIR",
                    help="keep every object and the IAM set-up in DIR, and put them back at start")
    args = ap.parse_args(argv)
    # refusals and restores go to the endpoint's log (logs/s3-<server>.log), beside moto's requests
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    store = DiskStore(args.data) if args.data else None
    if store is not None and store.open():
        # Provisioned before: authenticate from the first request, no set-up window.
        from moto import settings

        settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
        log.info("restored from %s: %s", args.data, restore(store))
    if store is not None:
        install(store)
    if args.write_once:
        from deployments.platform.s3_keep import install as install_write_once

        install_write_once(tuple(args.write_once))
    from moto import backends
    from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import run_simple

    # moto finds a request's service by listing its own package directory (a stat per service) on every request:
    # a twelfth of the endpoint's CPU during a job. What is installed does not change while the server runs.
    services = frozenset(backends.list_of_moto_modules())
    backends.list_of_moto_modules = lambda: services

    os.environ.setdefault("MOTO_PORT", str(args.port))  # as moto_server does (moto builds URLs from it)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = RefuseAdminApi(DomainDispatcherApplication(create_backend_app))
    run_simple(args.host, args.port, app, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
