"""The aggregators and their registry: the one list of known names that config validation and jobs share.

    agg = build_aggregator("fedprox", {"mu": 0.1})
    site_config = agg.configure(rnd)
    new_global, server_state = agg.aggregate(rnd, global_state, updates, server_state)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from insitu.federated.aggregators.base import Aggregator, Update
from insitu.federated.aggregators.fedadagrad import FedAdagrad
from insitu.federated.aggregators.fedadam import FedAdam
from insitu.federated.aggregators.fedavg import FedAvg, fedavg
from insitu.federated.aggregators.fedopt import FedOpt
from insitu.federated.aggregators.fedprox import FedProx, ProximalGradient, proximal_term
from insitu.federated.aggregators.fedyogi import FedYogi
from insitu.federated.aggregators.median import Median
from insitu.federated.aggregators.trimmed_mean import TrimmedMean
from insitu.plugins import named_subclasses

# Every Aggregator subclass with its own `name` in a module of this package: a new aggregator is its file (and
# the test beside it), nothing else to edit.
AGGREGATORS: dict[str, type[Aggregator]] = named_subclasses(__name__, __path__, Aggregator)

__all__ = ["AGGREGATORS", "Aggregator", "FedAdagrad", "FedAdam", "FedAvg", "FedOpt", "FedProx", "FedYogi", "Median",
           "ProximalGradient", "TrimmedMean", "Update", "build_aggregator", "fedavg", "proximal_term"]


def build_aggregator(
    name: str, options: Mapping[str, Any] | None = None, *, max_update_norm: float | None = None
) -> Aggregator:
    """The aggregator called ``name`` with ``options`` validated by its ``Options``.

    Raises
    ------
    ValueError
        For an unknown name (the message lists the known ones) or bad options (the message names the option,
        what is wrong with it, and the options this aggregator knows).
    """
    cls = AGGREGATORS.get(name)
    if cls is None:
        raise ValueError(f"unknown aggregator {name!r}; known: {sorted(AGGREGATORS)}")
    known = list(cls.Options.model_fields)
    if options is not None and not isinstance(options, Mapping):
        raise ValueError(f"aggregator {name!r}: options must be a mapping of option names to values, "
                         f"not {type(options).__name__}; known options: {known}")
    try:
        opts = cls.Options.model_validate(dict(options or {}))
    except ValidationError as e:
        problems = []
        for err in e.errors():
            where = ".".join(str(p) for p in err["loc"]) or "options"
            what = "is not an option of this aggregator" if err["type"] == "extra_forbidden" else err["msg"]
            problems.append(f"{where!r} {what} (got {err['input']!r})")
        raise ValueError(f"aggregator {name!r}: {'; '.join(problems)}; known options: {known or 'none'}") from None
    return cls(opts, max_update_norm=max_update_norm)
