"""The whole model's weights out of whatever a strategy made of it, and names without wrapper prefixes."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

# What wrappers put in front of a parameter's name: DDP's `module.`, activation checkpointing's wrapper, and
# torch.compile's `_orig_mod.`. A state dict from get_model_state_dict has none of them.
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.")


def clean_name(name: str, wrapped_in_ddp: bool = False) -> str:
    """``name`` as the unwrapped model calls it."""
    if wrapped_in_ddp:
        name = name.removeprefix("module.")
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def named_parameters(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``module``'s parameters under the unwrapped model's names (DTensor shards for FSDP)."""
    ddp = isinstance(module, nn.parallel.DistributedDataParallel)
    return [(clean_name(n, ddp), p) for n, p in module.named_parameters()]


def local_full_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict of ``module`` on this rank, on the CPU. A collective under FSDP."""
    if not (dist.is_available() and dist.is_initialized()):
        sd = module.state_dict()
    else:
        sd = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().cpu().clone() for k, v in sd.items()}


def gather_stage_states(stage_state: dict[str, torch.Tensor], send: bool) -> dict[str, torch.Tensor]:
    """Collective over all ranks: global rank 0 gets the union of the stages' state dicts (each stage keeps
    the model's own names, so the union is the whole model); ranks with ``send`` False contribute nothing
    (replicas of a stage that another rank already sends)."""
    parts: list[dict[str, torch.Tensor] | None] | None = None
    if dist.get_rank() == 0:
        parts = [None] * dist.get_world_size()
    dist.gather_object(stage_state if send else {}, parts, dst=0)
    merged: dict[str, torch.Tensor] = {}
    for part in parts or []:
        merged.update(part or {})
    return merged
