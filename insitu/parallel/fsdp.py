"""Strategy ``fsdp``: fully sharded data parallelism with FSDP2 (``fully_shard``).

Each rank holds 1/N of every parameter, gradient and optimizer state; a block's parameters are all-gathered
just before its forward (and again for its backward) and its gradients reduce-scattered after. Each
transformer block (the model's ``core.layers``) is its own unit, so only one block is whole at a time; a model
without ``layers`` is one unit. Options (``parallel.fsdp``): mixed precision (bf16 parameters in compute,
fp32 gradient reduction: ``auto`` is bf16 on GPU and fp32 on CPU), activation checkpointing per block, and
whether to free gathered parameters after forward (ZeRO-3) or keep them for backward (ZeRO-2).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from insitu.parallel.types import Parallelized, Strategy, TrainSpec


class FsdpOptions(BaseModel):
    """``parallel.fsdp``: FSDP2 ``fully_shard`` options (strategy ``fsdp``; the data-parallel part of ``hybrid``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    mixed_precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto", description="parameter dtype in forward/backward (gradients are reduced in fp32): auto is bf16 "
                            "on GPU and fp32 on CPU")
    activation_checkpointing: bool = Field(False, description="recompute each block's activations in backward "
                                           "(less memory, about a third more compute)")
    reshard_after_forward: bool = Field(True, description="free gathered parameters after forward (ZeRO-3); "
                                        "false keeps them until backward (ZeRO-2: more memory, less traffic)")


class Options(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)  # other strategies' sections are theirs
    fsdp: FsdpOptions = FsdpOptions()


def precision(cfg: FsdpOptions, device: torch.device) -> MixedPrecisionPolicy:
    bf16 = cfg.mixed_precision == "bf16" or (cfg.mixed_precision == "auto" and device.type == "cuda")
    # Gradients are reduced in fp32 either way: summing many bf16 gradients loses the small ones.
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 \
        else MixedPrecisionPolicy()


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, cfg: FsdpOptions, device: torch.device) -> nn.Module:
    """Shard ``model`` over ``mesh`` (1-D: FSDP; 2-D replicate × shard: HSDP), block by block, in place."""
    policy = precision(cfg, device)
    core = getattr(model, "core", model)
    layers = getattr(core, "layers", None)
    if isinstance(layers, nn.ModuleDict | nn.ModuleList):
        for name, block in list(layers.named_children()):
            if cfg.activation_checkpointing:  # the wrapper keeps state-dict names (it strips its own prefix)
                block = checkpoint_wrapper(block)
                layers.register_module(name, block)
            fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=cfg.reshard_after_forward)
    elif cfg.activation_checkpointing and isinstance(core, nn.Module) and core is not model:
        model.core = checkpoint_wrapper(core)
    # The root unit holds what is left (embedding, head, norm); backward starts right after its forward, so
    # resharding it after forward would only gather it again.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    return model


def parallelize(model: nn.Module, mesh: DeviceMesh | None, spec: TrainSpec) -> Parallelized:
    if mesh is None:
        raise ValueError("strategy 'fsdp' needs a device mesh over the site's ranks (an initialised process group)")
    device = next(model.parameters()).device
    # Collective time is not measured: FSDP overlaps its all-gathers and reduce-scatters with compute.
    options = Options.model_validate(spec.training.parallel)
    return Parallelized(apply_fsdp(model, mesh, options.fsdp, device))


STRATEGY = Strategy("fsdp", distributed=True, parallelize=parallelize, options=Options)
