"""int8: each value as a signed byte times a scale, per tensor or per channel (a quarter of fp32's bytes).

The scale of a group (a tensor, or one slice along a tensor's first dimension) is its largest magnitude / 127, so
that every value rounds to the nearest of 255 evenly spaced levels: the error of a value is at most half its
group's scale. A group of zeros has scale 0.
"""

from __future__ import annotations

from typing import Literal

import torch

from insitu.federated.codecs.base import Codec, CodecError, Layout, Parts, numels

LEVELS = 127


class Int8(Codec):
    name = "int8"

    class Options(Codec.Options):
        scale: Literal["tensor", "channel"] = "tensor"
        """one scale per tensor, or one per slice along its first dimension (tensors of 2+ dimensions)"""

    def _groups(self, shapes: list[torch.Size]) -> list[int]:
        """The size of each scale's group, in order (they tile the flat vector)."""
        groups: list[int] = []
        for shape, n in zip(shapes, numels(shapes), strict=True):
            if self.options.scale == "channel" and len(shape) >= 2 and n:
                groups += [n // shape[0]] * shape[0]
            else:
                groups.append(n)
        return groups

    def layout(self, shapes: list[torch.Size]) -> Layout:
        return {"values": ((sum(numels(shapes)),), torch.int8), "scales": ((len(self._groups(shapes)),), torch.float32)}

    def encode(self, flat: torch.Tensor, shapes: list[torch.Size]) -> Parts:
        groups = self._groups(shapes)
        sizes = torch.tensor(groups)
        peak = torch.stack([g.abs().max() if g.numel() else torch.zeros(()) for g in flat.split(groups)]) \
            if groups else torch.zeros(0)
        scales = (peak / LEVELS).to(torch.float32)
        per_value = scales.repeat_interleave(sizes)
        safe = torch.where(per_value > 0, per_value, torch.ones_like(per_value))
        values = torch.round(flat / safe).clamp_(-LEVELS, LEVELS).to(torch.int8)
        return {"values": values, "scales": scales}

    def decode(self, parts: Parts, shapes: list[torch.Size]) -> torch.Tensor:
        # In place, group by group: no per-value copy of the scales (a coordinator reading many sites' updates
        # holds one model-sized vector here, not three).
        out = parts["values"].to(torch.float32)
        for chunk, scale in zip(out.split(self._groups(shapes)), parts["scales"].tolist(), strict=True):
            chunk.mul_(scale)
        return out

    def check(self, parts: Parts, shapes: list[torch.Size]) -> None:
        if bool((parts["scales"] < 0).any()):
            raise CodecError("int8 payload: a scale is negative")
        if bool((parts["values"] == -128).any()):  # the encoder never writes it: levels are symmetric
            raise CodecError("int8 payload: a value is -128, outside the levels ±127")
