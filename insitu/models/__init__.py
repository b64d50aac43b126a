"""Models: the built-in ones by name, and a user's own ``nn.Module`` factory by import path.

Contract of a model factory (built in, or ``model.name: "package.module:function"`` in a training config)::

    def make(n_features: int, n_outputs: int, **options) -> torch.nn.Module

``options`` are the config's ``model.options`` (for the built-in ``tabular_mlp``: ``hidden`` and
``dropout``). The module takes a float32 tensor ``(batch, n_features)`` of *standardised* features and
returns ``(batch, n_outputs)`` (or ``(batch,)`` when ``n_outputs`` is 1): logits for classification, the
standardised prediction for regression. insitu wraps it in :class:`Standardized`, whose buffers carry the
global feature mean and std (from federated statistics) and the label's shift and scale, so the registered
model takes raw features and predicts in the label's units. The factory must build the same module, with
the same parameter names, on every site and on the coordinator: its module must be importable in every
site's environment (installed, or in the checkout the site runs from). Adding a built-in model is one file
here plus its entry in ``MODELS``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from insitu.conf import ModelConfig
from insitu.models.tabular_mlp import tabular_mlp
from insitu.plugins import functions_named_as_their_module

ModelFactory = Callable[..., nn.Module]

# The one list of built-in models: each module of this package whose function has the module's name
# (tabular_mlp.py: tabular_mlp); adding one is its file and its test. `fraud_mlp` is the name configs used
# before the MLP became generic.
MODELS: dict[str, ModelFactory] = {**functions_named_as_their_module(__name__, __path__), "fraud_mlp": tabular_mlp}


class ModelContractError(ValueError):
    """A model factory is missing, or builds a module that does not keep the contract."""


@dataclass(frozen=True)
class Normalization:
    """The global feature mean and std, and the shift and scale of the output (regression's label)."""

    mean: Sequence[float]
    std: Sequence[float]
    out_shift: float = 0.0
    out_scale: float = 1.0

    @classmethod
    def from_global(cls, stats: Mapping[str, Any]) -> Normalization:
        """From a job's global statistics (``stats/global.json`` on the exchange)."""
        return cls(stats["mean"], stats["std"], float(stats.get("out_shift", 0.0)), float(stats.get("out_scale", 1.0)))


class Standardized(nn.Module):
    """``out_shift + out_scale · core((x - mean) / std)``: a model that carries its own normalisation."""

    def __init__(self, core: nn.Module, n_features: int, n_outputs: int, norm: Normalization | None = None) -> None:
        super().__init__()
        norm = norm or Normalization([0.0] * n_features, [1.0] * n_features)
        self.register_buffer("mean", torch.tensor(list(norm.mean), dtype=torch.float32))
        self.register_buffer("std", torch.tensor(list(norm.std), dtype=torch.float32))
        self.register_buffer("out_shift", torch.tensor(float(norm.out_shift)))
        self.register_buffer("out_scale", torch.tensor(float(norm.out_scale)))
        self.core = core
        self.n_outputs = n_outputs
        # A pipeline stage (insitu/parallel/pipeline.py) holds a slice of the core: only the first stage reads
        # raw features, only the last one produces the prediction.
        self.first_stage = True
        self.last_stage = True
        # "exp" on a registered model whose training output is a log (Poisson's log-rate): what it serves is then in
        # the label's units. Training and site scoring keep "identity" (their losses and metrics take the log).
        self.output_link = "identity"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Back to the input's dtype: under bf16 mixed precision the input arrives as bf16 and the fp32
        # buffers would otherwise promote it to fp32 ahead of bf16 weights.
        z = self.core(((x - self.mean) / self.std).to(x.dtype) if self.first_stage else x)
        if not self.last_stage:
            return z
        if self.n_outputs == 1 and z.dim() == 2:
            z = z.squeeze(-1)
        z = z * self.out_scale + self.out_shift
        # getattr: a model pickled before the link existed serves as it did
        return torch.exp(z) if getattr(self, "output_link", "identity") == "exp" else z


def model_factory(cfg: ModelConfig) -> tuple[ModelFactory, dict[str, Any]]:
    """The factory ``cfg`` names and the keyword arguments it is called with."""
    if cfg.name in MODELS:
        factory = MODELS[cfg.name]
        # `hidden` and `dropout` are the MLP's own keys at the top of `model:`; other built-ins take `options`.
        accepted = inspect.signature(factory).parameters
        common = {k: v for k, v in (("hidden", list(cfg.hidden)), ("dropout", cfg.dropout)) if k in accepted}
        return factory, {**common, **cfg.options}
    module, _, attr = cfg.name.partition(":")
    # Any exception, not only ImportError/AttributeError: a user's module that raises while it is imported (a
    # missing driver, a typo) must fail as a contract error naming the model too, not as a bare exception.
    try:
        factory = getattr(importlib.import_module(module), attr)
    except Exception as e:
        raise ModelContractError(f"model {cfg.name!r}: cannot import {attr!r} from {module!r} ({type(e).__name__}: "
                                 f"{e}); install the module where every site and the coordinator run, or name a "
                                 f"built-in model ({sorted(MODELS)})") from None
    if not callable(factory):
        raise ModelContractError(f"model {cfg.name!r}: {attr!r} is not callable")
    return factory, dict(cfg.options)


def build_model(
    cfg: ModelConfig, n_features: int, n_outputs: int = 1, norm: Normalization | None = None
) -> Standardized:
    """Build the configured model; every site and the coordinator build it the same way.

    Raises
    ------
    ModelContractError
        When the factory cannot be imported, fails, returns no ``nn.Module`` or one whose output has the
        wrong shape (checked on two rows of zeros).
    """
    factory, options = model_factory(cfg)
    try:
        core = factory(n_features, n_outputs, **options)
    except TypeError as e:
        raise ModelContractError(f"model {cfg.name!r} cannot be built with n_features={n_features}, "
                                 f"n_outputs={n_outputs} and options {sorted(options)}: {e}") from None
    except Exception as e:
        # The factory ran and raised (e.g. it refuses an option's value): a contract error naming the model, as
        # documented, chained to the user's exception so that its traceback points into their factory.
        msg = (f"model {cfg.name!r} failed to build with n_features={n_features}, n_outputs={n_outputs} and "
               f"options {sorted(options)}: {type(e).__name__}: {e}")
        raise ModelContractError(msg) from e
    if not isinstance(core, nn.Module):
        raise ModelContractError(f"model {cfg.name!r}: the factory returned {type(core).__name__}, not an nn.Module")
    model = Standardized(core, n_features, n_outputs, norm)
    _check_shape(model, cfg.name, n_features, n_outputs)
    return model


def _check_shape(model: nn.Module, name: str, n_features: int, n_outputs: int) -> None:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros(2, n_features))
    except Exception as e:
        raise ModelContractError(f"model {name!r} fails on input of shape (2, {n_features}): "
                                 f"{type(e).__name__}: {e}") from None
    finally:
        model.train(was_training)
    want = (2,) if n_outputs == 1 else (2, n_outputs)
    if tuple(out.shape) != want:
        raise ModelContractError(f"model {name!r} returns shape {tuple(out.shape)} for input (2, {n_features}); "
                                 f"the task needs {want} (n_outputs={n_outputs})")
