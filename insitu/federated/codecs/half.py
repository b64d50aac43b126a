"""fp16 and bf16: every value cast to 16 bits (half the bytes of fp32).

fp16 keeps 10 bits of mantissa (relative error ≤ 2⁻¹¹) over a narrow range (|x| ≤ 65504): suited to an update's
difference from the global model. bf16 keeps fp32's range with 7 bits (relative error ≤ 2⁻⁸).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from insitu.federated.codecs.base import Codec, CodecError, Layout, Parts, numels


class _Cast(Codec):
    dtype: ClassVar[torch.dtype]

    def layout(self, shapes: list[torch.Size]) -> Layout:
        return {"values": ((sum(numels(shapes)),), self.dtype)}

    def encode(self, flat: torch.Tensor, shapes: list[torch.Size]) -> Parts:
        values = flat.to(self.dtype)
        if not bool(torch.isfinite(values).all()):
            raise CodecError(f"{self.name}: a value of the update is beyond {self.name}'s range "
                             f"(|x| ≤ {torch.finfo(self.dtype).max:g}); use bf16, or delta encoding")
        return {"values": values}

    def decode(self, parts: Parts, shapes: list[torch.Size]) -> torch.Tensor:
        return parts["values"].to(torch.float32)


class Fp16(_Cast):
    name = "fp16"
    dtype = torch.float16


class Bf16(_Cast):
    name = "bf16"
    dtype = torch.bfloat16
