"""Update codecs and their registry: how a site's update is made lean on the wire (``federation.compression``).

    enc = build_encoding(training.federation.compression)      # None: updates cross as full state dicts
    payload, residual = enc.encode(trained, global_state, residual)   # on the site
    update = enc.decode(payload, global_state)                        # on the coordinator, before any check
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from insitu.federated.codecs.base import Codec, CodecError
from insitu.federated.codecs.encoding import UpdateEncoding
from insitu.plugins import named_subclasses

if TYPE_CHECKING:
    from insitu.conf.training import CompressionConfig

# Every Codec subclass with its own `name` in a module of this package: a new codec is its file and its test.
CODECS: dict[str, type[Codec]] = named_subclasses(__name__, __path__, Codec)

__all__ = ["CODECS", "Codec", "CodecError", "UpdateEncoding", "build_codec", "build_encoding"]


def build_codec(name: str, options: dict[str, Any] | None = None) -> Codec:
    """The codec called ``name`` with ``options`` validated by its ``Options`` (ValueError naming the codecs)."""
    if name not in CODECS:
        raise ValueError(f"unknown update encoding {name!r}; known: none, {', '.join(sorted(CODECS))}")
    cls = CODECS[name]
    return cls(cls.Options.model_validate(options or {}))


def build_encoding(conf: CompressionConfig) -> UpdateEncoding | None:
    """The encoding a job's updates use, or None when they cross as full state dicts (``encoding: none``).

    Raises
    ------
    ValueError
        For an unknown codec, options its ``Options`` refuse, or a codec that only encodes a difference
        (top-k) without ``delta``; :func:`insitu.job.resolve_encoding` names the key.
    """
    if conf.encoding == "none":
        return None
    codec = build_codec(conf.encoding, conf.options)
    if codec.needs_delta and not conf.delta:
        raise ValueError(f"{conf.encoding} only encodes an update's difference from the global model; "
                         "set delta: true")
    return UpdateEncoding(codec, delta=conf.delta, error_feedback=conf.error_feedback)
