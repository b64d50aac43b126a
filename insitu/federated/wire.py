"""A model state's bytes as they cross the exchange, checked both ways: a full state dict (``torch.save``), or
an update encoded as the job's ``federation.compression`` says (:mod:`insitu.federated.codecs`, stored as
safetensors). Either way the state is checked by :func:`insitu.federated.states.check_state` in its decoded
form, so that every bound on an update holds whatever its encoding.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from insitu.federated.kinds import ExchangeError
from insitu.federated.state_bytes import payload_from_bytes, payload_to_bytes, state_from_bytes, state_to_bytes
from insitu.federated.states import check_state

if TYPE_CHECKING:
    import torch

    from insitu.federated.codecs import UpdateEncoding


def to_wire(state: dict[str, torch.Tensor], where: str, reference: Mapping[str, torch.Tensor] | None,
            max_norm: float | None, encoding: UpdateEncoding | None) -> bytes:
    """The bytes of ``state`` (with ``encoding``: an update's payload), once it passed the checks."""
    if encoding is None:
        check_state(state, where, reference, max_norm if reference is not None else None)
        return state_to_bytes(state)
    from insitu.federated.codecs import CodecError

    if reference is None:
        raise ExchangeError(f"{where}: only an update is encoded, against the global weights it came from")
    try:
        decoded = encoding.decode(state, reference)
    except CodecError as e:
        raise ExchangeError(f"{where}: {e}") from None
    check_state(decoded, where, reference, max_norm)
    return payload_to_bytes(state)


def from_wire(data: bytes, manifest: Mapping[str, Any], where: str, reference: Mapping[str, torch.Tensor] | None,
              max_norm: float | None, encoding: UpdateEncoding | None) -> dict[str, torch.Tensor]:
    """The state the bytes stand for, decoded and checked; refused unless encoded as the reader expects."""
    expected = encoding.name if encoding is not None else None
    if manifest.get("encoding") != expected:
        raise ExchangeError(f"{where}: encoded as {manifest.get('encoding') or 'a full state dict'}; this job's "
                            f"updates are {expected or 'full state dicts'} (federation.compression)")
    if encoding is None:
        try:
            state = state_from_bytes(data)
        except Exception as e:  # weights_only refuses anything but tensors and plain containers
            raise ExchangeError(f"{where}: not a state file ({type(e).__name__})") from None
    else:
        from insitu.federated.codecs import CodecError

        if reference is None:
            raise ExchangeError(f"{where}: an encoded update is decoded against the global weights it came from")
        try:
            payload = payload_from_bytes(data)
        except Exception as e:  # not a safetensors file at all
            raise ExchangeError(f"{where}: not an encoded update ({type(e).__name__})") from None
        # Byte for byte what its tensors are written as: a safetensors header may carry free text (__metadata__,
        # padding), and the byte budget leaves room for it; only the tensors' own bytes may cross.
        if payload_to_bytes(payload) != data:
            raise ExchangeError(f"{where}: not in the form its tensors are written in (a header with metadata or "
                                "extra bytes); refused")
        try:
            state = encoding.decode(payload, reference)
        except CodecError as e:
            raise ExchangeError(f"{where}: {e}") from None
    check_state(state, where, reference, max_norm if reference is not None else None)
    return state
