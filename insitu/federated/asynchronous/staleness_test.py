"""The staleness functions: s(0) = 1, non-increasing, each with its own shape."""

from __future__ import annotations

import pytest

from insitu.conf import StalenessConfig
from insitu.federated.asynchronous.staleness import staleness_weight


def test_constant_ignores_staleness() -> None:
    c = StalenessConfig(function="constant")
    assert [staleness_weight(c, t) for t in (0, 1, 50)] == [1.0, 1.0, 1.0]


def test_polynomial() -> None:
    c = StalenessConfig(function="polynomial", a=0.5)
    assert staleness_weight(c, 0) == 1.0
    assert staleness_weight(c, 3) == pytest.approx(0.5)  # (1 + 3) ** -0.5
    assert staleness_weight(c, 8) == pytest.approx(1 / 3)


def test_hinge_is_flat_up_to_b_then_falls() -> None:
    c = StalenessConfig(function="hinge", a=2.0, b=2)
    assert [staleness_weight(c, t) for t in (0, 1, 2)] == [1.0, 1.0, 1.0]
    assert staleness_weight(c, 3) == pytest.approx(1 / 3)  # 1 / (2 * 1 + 1)
    assert staleness_weight(c, 4) == pytest.approx(1 / 5)


@pytest.mark.parametrize("function", ["constant", "polynomial", "hinge"])
def test_never_increasing_and_in_unit_interval(function: str) -> None:
    c = StalenessConfig(function=function, a=1.0, b=1)  # type: ignore[arg-type]
    values = [staleness_weight(c, t) for t in range(20)]
    assert values[0] == 1.0 and all(0 < v <= 1 for v in values)
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))


def test_negative_staleness_is_an_error() -> None:
    with pytest.raises(ValueError, match="future version"):
        staleness_weight(StalenessConfig(), -1)
