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

    def _blocks(self, shapes: list[torch.Size]) -> list[tuple[int, int, int]]:
        """Per tensor: where its values start in the flat vector, how many there are, and how many scales they
        have (its rows with per-channel scales, else one). The blocks tile the values and the scales in order."""
        blocks, start = [], 0
        for shape, n in zip(shapes, numels(shapes), strict=True):
            rows = shape[0] if self.options.scale == "channel" and len(shape) >= 2 and n else 1
            blocks.append((start, n, rows))
            start += n
        return blocks

    def layout(self, shapes: list[torch.Size]) -> Layout:
        scales = sum(rows for _, _, rows in self._blocks(shapes))
        return {"values": ((sum(numels(shapes)),), torch.int8), "scales": ((scales,), torch.float32)}

    def encode(self, flat: torch.Tensor, shapes: list[torch.Size]) -> Parts:
        values, scales = [], []
        for start, n, rows in self._blocks(shapes):
            block = flat[start:start + n].reshape(rows, -1)
            peak = block.abs().amax(dim=1) if n else torch.zeros(rows)
            scale = (peak / LEVELS).to(torch.float32)
            # Below the smallest normal float a scale cannot carry 127 levels exactly: such a group is sent as 0,
            # so that every group's largest level is exactly 127 or the group is all zeros (what check() demands).
            scale = torch.where(scale >= torch.finfo(torch.float32).tiny, scale, torch.zeros_like(scale))
            safe = torch.where(scale > 0, scale, torch.ones_like(scale))
            q = torch.where(scale[:, None] > 0, torch.round(block / safe[:, None]), torch.zeros_like(block))
            values.append(q.clamp_(-LEVELS, LEVELS).to(torch.int8).reshape(-1))
            scales.append(scale)
        return {"values": torch.cat(values) if values else torch.zeros(0, dtype=torch.int8),
                "scales": torch.cat(scales) if scales else torch.zeros(0)}

    def decode(self, parts: Parts, shapes: list[torch.Size]) -> torch.Tensor:
        # In place, tensor by tensor: no per-value copy of the scales (a coordinator reading many sites' updates
        # holds one model-sized vector here, not three).
        out = parts["values"].to(torch.float32)
        first = 0
        for start, n, rows in self._blocks(shapes):
            out[start:start + n].view(rows, -1).mul_(parts["scales"][first:first + rows, None])
            first += rows
        return out

    def check(self, parts: Parts, shapes: list[torch.Size]) -> None:
        """Only the form the encoder writes: every group's largest level is exactly ±127, or the group is all
        zeros with scale 0. Anything else (levels under a zero scale, a group that never reaches 127) would decode
        the same and carry free bytes: a site could hide rows in it."""
        values, scales = parts["values"], parts["scales"]
        if bool((scales < 0).any()):
            raise CodecError("int8 payload: a scale is negative")
        if bool((values == -128).any()):  # the encoder never writes it: levels are symmetric
            raise CodecError("int8 payload: a value is -128, outside the levels ±127")
        first = 0
        for start, n, rows in self._blocks(shapes):
            block = values[start:start + n].view(rows, -1)
            peak = block.abs().amax(dim=1) if n else torch.zeros(rows, dtype=torch.int8)
            expected = torch.where(scales[first:first + rows] > 0, LEVELS, 0).to(peak.dtype)
            if not torch.equal(peak, expected):
                raise CodecError("int8 payload: a group's levels are not what its scale says (its largest level must "
                                 "be 127, or 0 with a zero scale)")
            first += rows
