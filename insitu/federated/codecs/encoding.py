"""An update as it crosses the border: its floating-point tensors through a codec, optionally as the difference
from the global model it was trained from, with the site keeping what a lossy codec dropped (error feedback).

The payload is a flat mapping of dense tensors, stored like any state file (``torch.save``, read back with
``weights_only``): the codec's parts, plus each integer tensor of the model (a counter such as BatchNorm's
``num_batches_tracked``) unchanged as ``keep.<name>``. Its form is fixed by the global model and the encoding,
so the reader (:meth:`UpdateEncoding.decode`) refuses any other before decoding; the decoded update then goes
through the same checks as an uncompressed one (names, shapes, dtypes, finite, norm bound), and the
aggregators only ever see decoded updates.

Error feedback (Seide et al. 2014; Karimireddy et al. 2019, EF-SGD): the site encodes ``x = delta + residual``
and keeps ``residual' = x − decode(encode(x))``; what top-k leaves out this round is sent in a later one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from insitu.federated.codecs.base import Codec, CodecError, check_parts

KEEP = "keep."
State = dict[str, torch.Tensor]


@dataclass(frozen=True)
class UpdateEncoding:
    """How every update of a job is encoded (``federation.compression`` of its training config)."""

    codec: Codec
    delta: bool = True
    error_feedback: bool = True

    @property
    def name(self) -> str:
        """What an update's manifest says it is encoded as: a reader refuses any other."""
        return f"{self.codec.name}-delta" if self.delta else self.codec.name

    @property
    def keeps_residual(self) -> bool:
        return self.error_feedback and not self.codec.lossless

    # ------------------------------------------------------------------ site
    def encode(self, state: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor],
               residual: torch.Tensor | None = None) -> tuple[State, torch.Tensor | None]:
        """The payload for ``state`` (trained from ``reference``) and the residual to keep for the next one.

        ``residual`` is what the previous update's encoding dropped (None: nothing, or no error feedback).
        """
        floats, shapes = _floats(reference)
        x = torch.cat([state[k].detach().cpu().reshape(-1).to(torch.float32) for k in floats]) if floats \
            else torch.zeros(0)
        if self.delta:
            x = x - _flat(reference, floats)
        if self.keeps_residual and residual is not None:
            if residual.shape != x.shape:
                raise CodecError(f"the residual kept from the last update has {residual.numel():,} values; this "
                                 f"model has {x.numel():,}")
            x = x + residual
        parts = self.codec.encode(x, shapes)
        payload: State = dict(parts)
        for k, v in reference.items():
            if not v.is_floating_point():
                payload[KEEP + k] = state[k].detach().cpu().clone()
        kept = x - self.codec.decode(parts, shapes) if self.keeps_residual else None
        return payload, kept

    # ------------------------------------------------------------------ coordinator
    def decode(self, payload: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> State:
        """The update a payload stands for, in the global model's names, order, shapes and dtypes.

        Raises
        ------
        CodecError
            When the payload is not of this encoding's form for ``reference`` (a part or kept tensor missing,
            extra, of another shape or dtype, or out of range).
        """
        floats, shapes = _floats(reference)
        ints = [k for k, v in reference.items() if not v.is_floating_point()]
        parts = {k: v for k, v in payload.items() if not k.startswith(KEEP)}
        kept = {k[len(KEEP):]: v for k, v in payload.items() if k.startswith(KEEP)}
        if set(kept) != set(ints):
            raise CodecError(f"{self.name} payload: its kept tensors {sorted(kept)} are not the model's integer "
                             f"tensors {ints}")
        for k in ints:
            if not isinstance(kept[k], torch.Tensor) or kept[k].shape != reference[k].shape \
                    or kept[k].dtype != reference[k].dtype:
                raise CodecError(f"{self.name} payload: kept tensor {k!r} differs from the global model's")
        check_parts(self.codec, parts, shapes)
        flat = self.codec.decode(parts, shapes)
        out: State = {}
        chunks = iter(flat.split([s.numel() for s in shapes])) if floats else iter(())
        for k, ref in reference.items():
            if not ref.is_floating_point():
                out[k] = kept[k]
                continue
            # In the wider of float32 and the tensor's dtype (a float64 tensor keeps its precision), tensor by
            # tensor and in place: no second model-sized vector of the global weights.
            wide = torch.promote_types(torch.float32, ref.dtype)
            chunk = next(chunks).reshape(ref.shape).to(wide)
            if self.delta:
                chunk.add_(ref.detach().cpu().to(wide))
            out[k] = chunk.to(ref.dtype)
        return out


def _floats(reference: Mapping[str, torch.Tensor]) -> tuple[list[str], list[torch.Size]]:
    names = [k for k, v in reference.items() if v.is_floating_point()]
    return names, [reference[k].shape for k in names]


def _flat(reference: Mapping[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    if not names:
        return torch.zeros(0)
    return torch.cat([reference[k].detach().cpu().reshape(-1).to(torch.float32) for k in names])
