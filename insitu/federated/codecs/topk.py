"""top-k: only the largest ``fraction`` of the values by magnitude, as (index, value) pairs.

The k = ⌈fraction · n⌉ entries of largest magnitude over the whole update (not per tensor, so that a layer
that changed much takes more of the budget) are sent as int32 positions in the flat vector, ascending, and
their fp32 values: 8 bytes an entry, so 1 % of the values costs 2 % of fp32's bytes. Everything else decodes
as 0; with error feedback (:mod:`insitu.federated.codecs.encoding`) the site adds what was dropped to its
next update, so it is delayed, not lost.
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
from pydantic import Field

from insitu.federated.codecs.base import Codec, CodecError, Layout, Parts, numels

MAX_INDEX = 2**31 - 1


class TopK(Codec):
    name = "topk"
    needs_delta = True

    class Options(Codec.Options):
        # At 8 bytes an entry, more than half the values would cost more than fp32 itself.
        fraction: Annotated[float, Field(gt=0.0, le=0.5)] = 0.01
        """share of the values sent (by largest magnitude), at most 0.5"""

    def _k(self, n: int) -> int:
        return min(n, max(1, math.ceil(self.options.fraction * n))) if n else 0

    def layout(self, shapes: list[torch.Size]) -> Layout:
        n = sum(numels(shapes))
        if n > MAX_INDEX:
            raise CodecError(f"topk: {n:,} values; int32 positions reach {MAX_INDEX:,}")
        k = self._k(n)
        return {"indices": ((k,), torch.int32), "values": ((k,), torch.float32)}

    def encode(self, flat: torch.Tensor, shapes: list[torch.Size]) -> Parts:
        k = self.layout(shapes)["indices"][0][0]
        top = torch.topk(flat.abs(), k, sorted=False).indices.sort().values
        return {"indices": top.to(torch.int32), "values": flat[top].to(torch.float32)}

    def decode(self, parts: Parts, shapes: list[torch.Size]) -> torch.Tensor:
        out = torch.zeros(sum(numels(shapes)), dtype=torch.float32)
        out[parts["indices"].long()] = parts["values"]
        return out

    def check(self, parts: Parts, shapes: list[torch.Size]) -> None:
        idx = parts["indices"].long()
        n = sum(numels(shapes))
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise CodecError(f"topk payload: a position is outside 0..{n - 1}")
        if idx.numel() > 1 and not bool((idx[1:] > idx[:-1]).all()):  # ascending, so no position twice
            raise CodecError("topk payload: positions are not strictly ascending")
