"""A model state's bytes on the exchange and in the registry: ``torch.save`` of its CPU tensors, read back with
``weights_only`` (a state file is never unpickled into arbitrary objects).

An encoded update (:mod:`insitu.federated.codecs`) is stored as safetensors instead: no pickle at all, and a
header of a few hundred bytes where ``torch.save``'s zip archive spends kilobytes, which would dominate a small
model's int8 or top-k update."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where weights are (de)serialised: prepare never pays for it
    import torch


def state_to_bytes(state: dict[str, torch.Tensor]) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in state.items()}, buf)
    return buf.getvalue()


def state_from_bytes(data: bytes) -> dict[str, torch.Tensor]:
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def payload_to_bytes(payload: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save({k: v.detach().cpu().contiguous() for k, v in payload.items()})


def payload_from_bytes(data: bytes) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    return load(data)
