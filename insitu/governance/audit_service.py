"""The audit service: the only process that holds an actor's audit key and writes its log.

A site's flows, Dask workers and Prefect worker run as the site's OS user. If they held the audit key
they could rewrite and re-sign their own log. So each actor's log is written by a small service of its
own, running as a separate OS user (``insitu-audit`` on the local platform), listening on a Unix socket:

- a client sends one JSON line, ``{"op": "append", "event": …, "fields": {…}}`` or ``{"op": "head"}``;
- the service checks the caller's OS user with ``SO_PEERCRED`` (only the actor's own user may log to the
  actor's log; anyone may ask for the head, which anchors publish anyway), appends the record as its own
  actor (the caller cannot choose whose log it writes), and answers with the record, or ``{"error": …}``.

The key and the log live in a directory only the service's user can read. :class:`AuditClient` is what a
site's processes use; it has the same ``append`` / ``with_fields`` / ``head`` interface as
:class:`~insitu.governance.audit.AuditLog`.

The service proves who it is (:mod:`insitu.governance.audit_proof`): a request may carry a fresh
``challenge``; the answer then carries ``proof``, the service's Ed25519 signature (key ``signing_key`` of its
configuration) over the actor, the challenge and the answer. A client given the service's pinned public key
sends a challenge with every request and refuses any answer without a valid proof (fails closed).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import socketserver
import struct
import threading
from pathlib import Path
from typing import Any

from insitu.governance import anchor_signing
from insitu.governance.audit import AuditLog, log_head
from insitu.governance.audit_proof import RULE_AUDIT_SERVICE, new_challenge, proof_refusal, prove, service_key

log = logging.getLogger(__name__)

MAX_REQUEST = 1 << 20  # one record's fields; a request larger than this is refused


class AuditServiceError(RuntimeError):
    """The audit service refused or could not record an entry (the caller must not go on unaudited)."""


def socket_address(path: str | Path) -> str:
    """The address to bind or connect: a file's path, or for ``@name`` the abstract socket ``name``, which exists in
    its network namespace only (an isolated platform's actors each have their own: another site cannot reach it)."""
    text = str(path)
    return "\0" + text[1:] if text.startswith("@") else text


def _peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        uid = _peer_uid(self.request)
        line = self.rfile.readline(MAX_REQUEST + 1)
        req: Any = {}
        try:
            if len(line) > MAX_REQUEST:
                raise AuditServiceError(f"request larger than {MAX_REQUEST} bytes")
            req = json.loads(line)
            if req.get("op") != "head" and uid not in self.server.allowed_uids:
                raise AuditServiceError(f"uid {uid} may not write {self.server.audit.actor}'s audit log")
            if req.get("op") == "head":  # the head is no secret: anchors publish it (and the platform polls it)
                h = self.server.audit.head()
                out: dict[str, Any] = {"head": list(h) if h else None}
            elif req.get("op") == "anchor":
                out = {"anchor": _anchor(self.server)}
            elif req.get("op") == "append" and isinstance(req.get("event"), str) \
                    and isinstance(req.get("fields"), dict):
                out = {"record": self.server.audit.append(req["event"], **req["fields"])}
            else:
                raise AuditServiceError("expected {op: append, event, fields}, {op: head} or {op: anchor}")
        except Exception as e:  # answer every failure: the client raises it
            log.warning("audit service %s: refused a request from uid %d: %s", self.server.audit.actor, uid, e)
            out = {"error": f"{type(e).__name__}: {e}"}
        out = _with_proof(self.server, req if isinstance(req, dict) else {}, out)
        self.wfile.write(json.dumps(out).encode() + b"\n")


def _with_proof(server: _Server, req: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """``out`` signed over the request's challenge, when the request carries one and the service has a key."""
    challenge = req.get("challenge")
    if server.signing_key is None or not isinstance(challenge, str) or len(challenge) > 256:
        return out
    return {**out, "proof": prove(server.signing_key, server.audit.actor, challenge, out)}
def _anchor(server: _Server) -> dict[str, Any] | None:
    """The service's signed anchor for its log's head (``insitu.governance.anchor_signing``), or None when the
    log is empty; only the service holds the key, so only it can vouch for the head."""
    if server.anchor_key is None:
        raise AuditServiceError(f"{server.audit.actor}'s audit service has no signing key: it cannot sign anchors")
    with server.anchor_lock:  # one chain: two anchors are never signed after the same one
        h = server.audit.head()
        if h is None:
            return None
        record = anchor_signing_record(server.audit.path)
        last = anchor_signing.read_last(record)
        signed = anchor_signing.next_anchor(server.anchor_key, server.audit.actor, h, last)
        if signed != last:
            anchor_signing.write_last(record, signed)
        return signed


def anchor_signing_record(log_path: Path) -> Path:
    """Where the service keeps the last anchor it signed: beside the log, out of every actor's reach."""
    return log_path.with_name(log_path.name + ".anchor")


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    signing_key: Any = None  # the service's Ed25519 key: it signs its answers (audit_proof)
    anchor_key: Any = None
    anchor_lock = threading.Lock()

    def __init__(self, path: str, audit: AuditLog, allowed_uids: set[int]) -> None:
        self.audit = audit
        self.allowed_uids = allowed_uids
        super().__init__(path, _Handler)


def serve(config: Path) -> None:
    """Run one actor's audit service from its configuration file (``actor``, ``log``, ``key``, ``socket``,
    ``allowed_uids``, and ``signing_key``: its Ed25519 key, hex, which signs its answers and its anchors) until
    terminated."""
    spec = json.loads(config.read_text())
    audit = AuditLog(spec["log"], bytes.fromhex(spec["key"]), spec["actor"])
    sock = Path(spec["socket"])
    abstract = str(spec["socket"]).startswith("@")
    if not abstract:
        sock.unlink(missing_ok=True)
    server = _Server(socket_address(spec["socket"]), audit, {int(u) for u in spec["allowed_uids"]})
    server.signing_key = service_key(spec["signing_key"]) if spec.get("signing_key") else None
    server.anchor_key = server.signing_key  # one key: the one pinned in the identity also vouches for anchors
    if not abstract:
        os.chmod(sock, 0o666)  # who may write is decided per connection, by SO_PEERCRED
    if log_head(audit.path) is None:
        audit.append("audit.started", pid=os.getpid())  # a deployed actor's log exists from the start
    log.info("audit service for %s on %s", spec["actor"], sock)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        if not abstract:
            sock.unlink(missing_ok=True)


class AuditClient:
    """Append to an actor's log through its audit service (same interface as ``AuditLog``)."""

    def __init__(self, socket_path: str | Path, actor: str, path: str | Path, service_key: str | None = None) -> None:
        self.socket_path = str(socket_path)
        self.actor = actor
        self.path = Path(path)  # where the service keeps the log (not readable by the actor)
        self.service_key = service_key  # the service's pinned public key (hex): every answer must be signed by it
        self.defaults: dict[str, Any] = {}

    def with_fields(self, **defaults: Any) -> AuditClient:
        bound = AuditClient(self.socket_path, self.actor, self.path, self.service_key)
        bound.defaults = {**self.defaults, **defaults}
        return bound

    def _call(self, req: dict[str, Any]) -> dict[str, Any]:
        challenge = new_challenge() if self.service_key else None
        if challenge:
            req = {**req, "challenge": challenge}
        out = self._exchange(req)
        if challenge:
            _check_answer(self, challenge, out)
        if "error" in out:
            raise AuditServiceError(f"{self.actor}'s audit service refused: {out['error']}")
        return out

    def _exchange(self, req: dict[str, Any]) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            try:
                s.connect(socket_address(self.socket_path))
            except OSError as e:
                raise AuditServiceError(f"{self.actor}'s audit service at {self.socket_path} is unreachable: {e}") \
                    from None
            s.sendall(json.dumps(req, allow_nan=False).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        try:
            out = json.loads(data)
        except ValueError:
            raise AuditServiceError(f"{self.actor}'s audit service at {self.socket_path} sent no valid answer") \
                from None
        if not isinstance(out, dict):
            raise AuditServiceError(f"{self.actor}'s audit service at {self.socket_path} sent no valid answer")
        return out

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        return self._call({"op": "append", "event": event, "fields": {**self.defaults, **fields}})["record"]

    def head(self) -> tuple[int, str] | None:
        h = self._call({"op": "head"})["head"]
        return (int(h[0]), str(h[1])) if h else None

    def anchor(self) -> dict[str, Any] | None:
        """The service's signed anchor of the log's head (see ``insitu.governance.anchor_signing``)."""
        a = self._call({"op": "anchor"})["anchor"]
        return dict(a) if a else None


def _check_answer(client: AuditClient, challenge: str, out: dict[str, Any]) -> None:
    """Fail closed unless ``out`` is signed by the pinned service key over this very challenge."""
    assert client.service_key is not None
    why = proof_refusal(client.service_key, client.actor, challenge, out)
    if why:
        raise AuditServiceError(f"{client.actor}'s audit service at {client.socket_path} is not the one its "
                                f"identity pins: {why}; nothing is done unaudited; rule {RULE_AUDIT_SERVICE}. Fix: "
                                "check the identity file's audit_socket and audit_service_key (the site admin's)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(args.config)


if __name__ == "__main__":
    main()


Auditor = AuditLog | AuditClient
"""Anything an actor appends audit records through: its log directly, or its audit service."""
