"""The codec seam: how a site's update is put on the wire, and how the coordinator reads it back.

A codec sees one flat float32 vector: every floating-point tensor of the update (or of its difference from the
global model, see :mod:`insitu.federated.codecs.encoding`), flattened and concatenated in the global model's
order, with each tensor's shape. It returns a few named *parts* (plain dense tensors, e.g. ``values`` and
``scales``) whose names, shapes and dtypes are fixed by the global model's layout alone (:meth:`Codec.layout`),
so that a reader can refuse a payload of any other form before decoding it: no extra tensor, no tensor of
another size, can ride along. Like an aggregator, a codec is one file with its test beside it, and holds no
state: what a lossy codec drops is the caller's to keep (error feedback).

This module is core: it imports neither Prefect nor the exchange.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
from pydantic import BaseModel, ConfigDict

Parts = dict[str, torch.Tensor]
Layout = dict[str, tuple[tuple[int, ...], torch.dtype]]


class CodecError(ValueError):
    """A payload that is not what its codec writes (a part missing, of another size or dtype, out of range)."""


class Codec(ABC):
    """Base of every codec; subclasses set ``name``, may extend ``Options`` and implement the three methods."""

    name: ClassVar[str]
    lossless: ClassVar[bool] = False
    # Whether it only makes sense of an update's difference from the global model (top-k: of the weights
    # themselves it would zero almost all of them).
    needs_delta: ClassVar[bool] = False

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)

    def __init__(self, options: Codec.Options | None = None) -> None:
        self.options = options if options is not None else self.Options()

    @abstractmethod
    def layout(self, shapes: list[torch.Size]) -> Layout:
        """The parts a payload for tensors of ``shapes`` has: name → (shape, dtype). Nothing else is accepted."""

    @abstractmethod
    def encode(self, flat: torch.Tensor, shapes: list[torch.Size]) -> Parts:
        """The parts for ``flat`` (float32, the tensors of ``shapes`` concatenated)."""

    @abstractmethod
    def decode(self, parts: Parts, shapes: list[torch.Size]) -> torch.Tensor:
        """The flat float32 vector the parts stand for (of ``sum(numel)`` elements)."""

    def check(self, parts: Parts, shapes: list[torch.Size]) -> None:  # noqa: B027 (optional hook)
        """Value checks beyond the layout (e.g. indices in range); raise :class:`CodecError`. Default: none."""


def numels(shapes: list[torch.Size]) -> list[int]:
    return [int(torch.Size(s).numel()) for s in shapes]


def check_parts(codec: Codec, parts: Parts, shapes: list[torch.Size]) -> None:
    """Raise :class:`CodecError` unless ``parts`` has exactly the codec's layout for ``shapes``, only finite
    floating-point values, and passes the codec's own checks."""
    expected = codec.layout(shapes)
    if set(parts) != set(expected):
        extra = sorted(set(parts) - set(expected))
        missing = sorted(set(expected) - set(parts))
        raise CodecError(f"{codec.name} payload: parts differ from its layout: extra {extra}, missing {missing}")
    for key, (shape, dtype) in expected.items():
        v = parts[key]
        if not isinstance(v, torch.Tensor) or v.layout != torch.strided:
            raise CodecError(f"{codec.name} payload: {key!r} is not a dense tensor")
        if v.dtype != dtype or tuple(v.shape) != shape:
            raise CodecError(f"{codec.name} payload: {key!r} is {v.dtype} {tuple(v.shape)}; its layout says "
                             f"{dtype} {shape}")
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            raise CodecError(f"{codec.name} payload: {key!r} holds NaN or infinite values")
    codec.check(parts, shapes)
