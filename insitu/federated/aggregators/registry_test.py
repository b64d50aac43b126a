"""The registry: the known names, building with validated options, and errors that say what is known."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from insitu.federated.aggregators import (
    AGGREGATORS,
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedProx,
    FedYogi,
    Median,
    TrimmedMean,
    build_aggregator,
)


def test_known_names() -> None:
    assert AGGREGATORS == {"fedavg": FedAvg, "fedprox": FedProx, "fedadam": FedAdam, "fedyogi": FedYogi,
                           "fedadagrad": FedAdagrad, "median": Median, "trimmed_mean": TrimmedMean}
    assert all(cls.name == name for name, cls in AGGREGATORS.items())


@pytest.mark.parametrize("name", sorted(AGGREGATORS))
def test_build_with_defaults(name: str) -> None:
    agg = build_aggregator(name, None)
    assert type(agg) is AGGREGATORS[name]
    assert agg.options == AGGREGATORS[name].Options()
    assert agg.max_update_norm is None
    assert build_aggregator(name, {}).options == agg.options


def test_build_with_options_and_norm_bound() -> None:
    agg = build_aggregator("fedadam", {"eta": 0.5, "beta_2": 0.9, "tau": 1}, max_update_norm=3.0)
    assert (agg.options.eta, agg.options.beta_1, agg.options.beta_2, agg.options.tau) == (0.5, 0.9, 0.9, 1.0)
    assert agg.max_update_norm == 3.0
    assert build_aggregator("trimmed_mean", {"beta": 0.25}).options.beta == 0.25
    assert build_aggregator("fedprox", {"mu": 0}).configure(1) == {"proximal_mu": 0.0}


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown aggregator 'fedsgd'; known: \['fedadagrad', 'fedadam', 'fedavg', "
                                         r"'fedprox', 'fedyogi', 'median', 'trimmed_mean'\]"):
        build_aggregator("fedsgd", None)


def test_unknown_option_named_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"aggregator 'fedprox': 'muu' is not an option of this aggregator "
                                         r"\(got 0.1\); known options: \['mu'\]"):
        build_aggregator("fedprox", {"muu": 0.1})
    with pytest.raises(ValueError, match=r"'beta_2' is not an option .*known options: \['eta', 'beta_1', 'tau'\]"):
        build_aggregator("fedadagrad", {"beta_2": 0.9})  # Adagrad's v never decays: no beta_2
    with pytest.raises(ValueError, match=r"aggregator 'median': 'beta' is not an option .*known options: none"):
        build_aggregator("median", {"beta": 0.1})


@pytest.mark.parametrize(("name", "options", "expected"), [
    ("fedprox", {"mu": -0.1}, r"'mu' Input should be greater than or equal to 0 \(got -0.1\)"),
    ("trimmed_mean", {"beta": 0.5}, r"'beta' Input should be less than 0.5 \(got 0.5\)"),
    ("trimmed_mean", {"beta": -0.01}, r"'beta' Input should be greater than or equal to 0"),
    ("fedadam", {"beta_1": 1.0}, r"'beta_1' Input should be less than 1"),
    ("fedyogi", {"tau": 0}, r"'tau' Input should be greater than 0"),
    ("fedadagrad", {"eta": float("nan")}, r"'eta' Input should be a finite number"),
    ("fedprox", {"mu": "0.1"}, r"'mu' Input should be a valid number \(got '0.1'\)"),  # strict: no coercion
    ("fedprox", {"mu": True}, r"'mu' Input should be a valid number \(got True\)"),
])
def test_bad_option_values_name_the_option(name: str, options: dict[str, object], expected: str) -> None:
    with pytest.raises(ValueError, match=rf"aggregator '{name}': {expected}.*known options"):
        build_aggregator(name, options)


def test_options_must_be_a_mapping() -> None:
    with pytest.raises(ValueError, match=r"options must be a mapping .* not list; known options: \['mu'\]"):
        build_aggregator("fedprox", [("mu", 0.1)])  # type: ignore[arg-type]


def test_options_are_frozen() -> None:
    agg = build_aggregator("fedprox", {"mu": 0.1})
    with pytest.raises(ValidationError, match="frozen"):
        agg.options.mu = 5.0  # type: ignore[misc]


def test_core_does_not_import_prefect() -> None:
    # The aggregators run in the coordinator and in the bench alike; they must not pull in the orchestrator.
    code = ("import sys, insitu.federated.aggregators, insitu.federated.fedavg; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('prefect', 'mlflow', 'dask')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
