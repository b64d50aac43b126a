"""What every aggregator inherits from the base: checks of the updates, integer pass-through, output dtypes."""

from __future__ import annotations

import pytest
import torch

from insitu.federated.aggregators import AGGREGATORS, Aggregator, FedAvg, FedProx, Update, build_aggregator

ALL = sorted(AGGREGATORS)


def _global() -> dict[str, torch.Tensor]:
    return {"w": torch.tensor([0.0, 0.0]), "count": torch.tensor(5, dtype=torch.int64)}


def _update(site: str, w: list[float], n: int, count: int = 5) -> Update:
    return Update(site, {"w": torch.tensor(w), "count": torch.tensor(count, dtype=torch.int64)}, n)


@pytest.mark.parametrize("name", ALL)
def test_empty_updates_raise(name: str) -> None:
    with pytest.raises(ValueError, match="at least one update"):
        build_aggregator(name).aggregate(1, _global(), [], None)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_update_names_site_and_tensor(name: str, bad: float) -> None:
    updates = [_update("eu", [1.0, 1.0], 10), _update("us", [1.0, bad], 10)]
    with pytest.raises(ValueError, match=r"site 'us': 'w' holds NaN or infinite values"):
        build_aggregator(name).aggregate(1, _global(), updates, None)


def test_non_finite_global_raises() -> None:
    g = {"w": torch.tensor([0.0, float("nan")]), "count": torch.tensor(5)}
    with pytest.raises(ValueError, match="global state's 'w' holds NaN"):
        FedAvg().aggregate(1, g, [_update("eu", [1.0, 1.0], 1)], None)


@pytest.mark.parametrize("name", ALL)
def test_mismatched_keys_name_the_site(name: str) -> None:
    odd = Update("apac", {"w": torch.tensor([1.0, 1.0]), "extra": torch.tensor([0.0])}, 3)
    with pytest.raises(ValueError, match=r"site 'apac' has different parameter names .*extra \['extra'\], "
                                         r"missing \['count'\]"):
        build_aggregator(name).aggregate(1, _global(), [_update("eu", [1.0, 1.0], 1), odd], None)


def test_same_names_in_another_order_raise() -> None:
    swapped = Update("us", {"count": torch.tensor(5), "w": torch.tensor([1.0, 1.0])}, 3)
    with pytest.raises(ValueError, match=r"site 'us' has different parameter names .*extra \[\], missing \[\]"):
        FedAvg().aggregate(1, _global(), [swapped], None)


@pytest.mark.parametrize("name", ALL)
def test_mismatched_shape_names_site_and_tensor(name: str) -> None:
    odd = Update("us", {"w": torch.tensor([1.0, 1.0, 1.0]), "count": torch.tensor(5)}, 3)
    with pytest.raises(ValueError, match=r"site 'us': 'w' has shape \(3,\); the global model's is \(2,\)"):
        build_aggregator(name).aggregate(1, _global(), [_update("eu", [1.0, 1.0], 1), odd], None)


def test_mismatched_dtype_raises() -> None:
    odd = Update("us", {"w": torch.tensor([1.0, 1.0], dtype=torch.float64), "count": torch.tensor(5)}, 3)
    with pytest.raises(ValueError, match=r"site 'us': 'w' has dtype torch.float64; the global model's is "
                                         r"torch.float32"):
        FedAvg().aggregate(1, _global(), [odd], None)


@pytest.mark.parametrize("n", [-1, True, 2.5])
def test_bad_sample_count_raises(n: object) -> None:
    with pytest.raises(ValueError, match=r"site 'eu' has sample count .*non-negative integer"):
        FedAvg().aggregate(1, _global(), [_update("eu", [1.0, 1.0], n)], None)  # type: ignore[arg-type]


def test_all_zero_sample_counts_raise() -> None:
    with pytest.raises(ValueError, match="sum to 0"):
        FedAvg().aggregate(1, _global(), [_update("eu", [1.0, 1.0], 0), _update("us", [1.0, 1.0], 0)], None)


@pytest.mark.parametrize("name", ALL)
def test_max_update_norm_bounds_each_update(name: str) -> None:
    # ||(3, 4) - (0, 0)||_2 = 5; the integer counter does not count towards the norm.
    updates = [_update("eu", [0.0, 0.0], 1, count=10**6), _update("us", [3.0, 4.0], 1)]
    with pytest.raises(ValueError, match=r"site 'us': \|\|update - global\|\|_2 = 5 exceeds max_update_norm 4.9"):
        build_aggregator(name, max_update_norm=4.9).aggregate(1, _global(), updates, None)
    build_aggregator(name, max_update_norm=5.0).aggregate(1, _global(), updates, None)  # on the bound is fine


@pytest.mark.parametrize("bound", [0.0, -1.0, float("inf"), float("nan")])
def test_max_update_norm_must_be_positive_finite(bound: float) -> None:
    with pytest.raises(ValueError, match="max_update_norm must be a positive finite number"):
        FedAvg(max_update_norm=bound)


def test_options_of_another_aggregator_are_refused() -> None:
    with pytest.raises(TypeError, match="FedAvg takes FedAvg.Options, not FedProx.Options"):
        FedAvg(FedProx.Options(mu=0.5))


def test_no_options_means_defaults() -> None:
    assert FedProx().options == FedProx.Options(mu=0.01)


@pytest.mark.parametrize("name", ALL)
def test_integers_from_largest_site_and_dtypes_of_the_global(name: str) -> None:
    g = {"h": torch.tensor([0.0, 0.0], dtype=torch.float16), "d": torch.tensor([1.0], dtype=torch.float64),
         "count": torch.tensor(0, dtype=torch.int32)}

    def up(site: str, x: float, n: int, count: int) -> Update:
        return Update(site, {"h": torch.tensor([x, x], dtype=torch.float16),
                             "d": torch.tensor([x], dtype=torch.float64),
                             "count": torch.tensor(count, dtype=torch.int32)}, n)

    # The 50-sample site is listed second: position must not matter.
    out, _ = build_aggregator(name).aggregate(1, g, [up("eu", 1.0, 10, 7), up("us", 1.5, 50, 9),
                                                     up("apac", 2.0, 20, 11)], None)
    assert list(out) == ["h", "d", "count"]
    assert {k: v.dtype for k, v in out.items()} == {k: v.dtype for k, v in g.items()}
    assert {k: tuple(v.shape) for k, v in out.items()} == {k: tuple(v.shape) for k, v in g.items()}
    assert int(out["count"]) == 9


@pytest.mark.parametrize("name", ALL)
def test_inputs_are_not_modified(name: str) -> None:
    g = _global()
    updates = [_update("eu", [1.0, 2.0], 1, 3), _update("us", [3.0, -1.0], 2, 4)]
    before_g = {k: v.clone() for k, v in g.items()}
    before_u = [{k: v.clone() for k, v in u.state.items()} for u in updates]
    out, state = build_aggregator(name).aggregate(1, g, updates, None)
    out["count"] += 100  # the pass-through counter is a copy, not the site's tensor
    out["w"] += 100
    assert all(torch.equal(g[k], before_g[k]) for k in g)
    for u, b in zip(updates, before_u, strict=True):
        assert all(torch.equal(u.state[k], b[k]) for k in b)


def test_configure_is_empty_by_default() -> None:
    for name in ("fedavg", "fedadam", "median", "trimmed_mean"):
        assert build_aggregator(name).configure(3) == {}


def test_a_subclass_must_implement_aggregate() -> None:
    class Incomplete(Aggregator):
        name = "incomplete"

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()  # type: ignore[abstract]
