"""Checks of a model state (weights or an update) on its way to, and back from, the exchange.

A state is the one payload on the exchange that is not JSON, so it is where rows would be packed: an
extra tensor, a tensor of another shape, values that are not weights. Every state must be a plain mapping
of parameter names to finite dense tensors; an update must in addition have exactly the global model's
names (in its order), shapes and dtypes, and lie within a norm bound of it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from insitu.federated.kinds import ExchangeError, shown

if TYPE_CHECKING:  # torch is imported where states are checked: prepare never pays for it
    import torch

MAX_TENSORS = 1024
PARAM_NAME = re.compile(r"^[A-Za-z0-9_.]{1,200}$")
ALLOWED_DTYPES = ("float16", "bfloat16", "float32", "float64", "int32", "int64")  # int: counters like num_batches


def check_state(
    state: object,
    where: str,
    reference: Mapping[str, torch.Tensor] | None = None,
    max_norm: float | None = None,
) -> None:
    """Raise :class:`ExchangeError` (starting with ``where``) unless ``state`` is an acceptable model state.

    With ``reference`` (the global model the state was trained from) the state must have exactly its
    parameter names, order, shapes and dtypes; with ``max_norm`` too, the L2 norm of ``state - reference``
    over all floating-point tensors may not exceed it.
    """
    import torch

    if not isinstance(state, dict) or not state:
        raise ExchangeError(f"{where}: a model state is a non-empty mapping of names to tensors, "
                            f"not {type(state).__name__}")
    if len(state) > MAX_TENSORS:
        raise ExchangeError(f"{where}: {len(state)} tensors; a model state has at most {MAX_TENSORS}")
    for k, v in state.items():
        if not isinstance(k, str) or not PARAM_NAME.match(k):
            raise ExchangeError(f"{where}: key {shown(k)} is not a parameter name")
        if not isinstance(v, torch.Tensor) or v.layout != torch.strided:  # no sparse or other layouts
            raise ExchangeError(f"{where}: {k!r} is a {type(v).__name__}, not a dense tensor")
        if str(v.dtype).removeprefix("torch.") not in ALLOWED_DTYPES:
            raise ExchangeError(f"{where}: {k!r} has dtype {v.dtype}; allowed: {', '.join(ALLOWED_DTYPES)}")
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            raise ExchangeError(f"{where}: {k!r} holds NaN or infinite values")
    if reference is None:
        return
    if list(state) != list(reference):
        extra = ", ".join(shown(k) for k in state if k not in reference)
        missing = ", ".join(repr(k) for k in reference if k not in state)
        detail = f"extra [{extra}], missing [{missing}]" if extra or missing else "the same names in another order"
        raise ExchangeError(f"{where}: parameters differ from the global model's: {detail}")
    for k, ref in reference.items():
        v = state[k]
        if v.shape != ref.shape:
            raise ExchangeError(f"{where}: {k!r} has shape {tuple(v.shape)}; the global model's is {tuple(ref.shape)}")
        if v.dtype != ref.dtype:
            raise ExchangeError(f"{where}: {k!r} has dtype {v.dtype}; the global model's is {ref.dtype}")
    if max_norm is not None:
        norm = delta_norm(state, reference)
        if not norm <= max_norm:
            raise ExchangeError(f"{where}: ||update - global||_2 = {norm:.4g} exceeds the bound {max_norm:g}")


NORM_CHUNK = 1 << 20  # values per step of delta_norm: float64 temporaries stay a few MiB, whatever the model


def delta_norm(state: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> float:
    """L2 norm of ``state - reference`` over the floating-point tensors (computed in float64, a chunk at a time)."""
    sq = 0.0
    for k, ref in reference.items():
        if not ref.is_floating_point():
            continue
        a, b = state[k].detach().cpu().reshape(-1), ref.detach().cpu().reshape(-1)
        for i in range(0, a.numel(), NORM_CHUNK):
            sq += float(((a[i:i + NORM_CHUNK].double() - b[i:i + NORM_CHUNK].double()) ** 2).sum())
    return math.sqrt(sq)
