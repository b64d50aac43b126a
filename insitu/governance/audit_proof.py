"""An audit service proves who it is: every answer is signed, over a fresh challenge the client chose.

A site's runtime could otherwise start a service of its own and have its flows log there (the real log gets
no line, and ``insitu audit verify`` still says ok). So the service holds an Ed25519 key of its own (the same
key it signs anchors with), its public key is pinned in the actor's identity file (which the site's admin
owns, not its runtime), and a client sends a fresh random challenge with each request. The service signs
``{actor, challenge, answer}`` (the answer as its SHA-256); the client checks the signature with the pinned key
and refuses any answer that is unsigned, signed by another key, for another actor or for another challenge:
it fails closed, so a flow never reads data without a verified audit line.

Pure functions; the socket protocol is :mod:`insitu.governance.audit_service`.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from insitu.governance.principals import canonical, sign, verify_signature

RULE_AUDIT_SERVICE = "audit.service-verified"
PURPOSE = "insitu-audit-answer"
CHALLENGE_BYTES = 32


def new_challenge() -> str:
    """A fresh random challenge (hex), one per request: an old signed answer cannot be replayed."""
    return secrets.token_hex(CHALLENGE_BYTES)


def new_service_key() -> str:
    """A new Ed25519 private key for an audit service, as hex (the raw 32 bytes)."""
    return Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                                      serialization.NoEncryption()).hex()


def service_key(private_hex: str) -> Ed25519PrivateKey:
    """The service's private key from its hex form (see :func:`new_service_key`)."""
    return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(private_hex))


def service_public_hex(private_hex: str) -> str:
    """The public key to pin in the actor's identity file (hex)."""
    return service_key(private_hex).public_key().public_bytes(serialization.Encoding.Raw,
                                                              serialization.PublicFormat.Raw).hex()


def _statement(actor: str, challenge: str, answer: dict[str, Any]) -> dict[str, str]:
    return {"purpose": PURPOSE, "actor": actor, "challenge": challenge,
            "answer": hashlib.sha256(canonical(answer)).hexdigest()}


def prove(key: Ed25519PrivateKey, actor: str, challenge: str, answer: dict[str, Any]) -> str:
    """The service's signature (hex) of ``answer`` to ``challenge``, as ``actor``'s audit service."""
    return sign(key, _statement(actor, challenge, answer))


def proof_refusal(pinned_hex: str, actor: str, challenge: str, answer: dict[str, Any]) -> str:
    """Why ``answer`` (carrying ``proof``) is not ``actor``'s audit service answering ``challenge``; "" when it is.

    ``answer`` is what the service sent, ``proof`` included; the proof covers everything else in it.
    """
    body = {k: v for k, v in answer.items() if k != "proof"}
    proof = answer.get("proof")
    if not isinstance(proof, str):
        return "the answer is not signed"
    if not verify_signature(pinned_hex, _statement(actor, challenge, body), proof):
        return ("the answer's signature does not verify with the audit service key pinned in the identity "
                "(another service, or an answer to another challenge or actor)")
    return ""
