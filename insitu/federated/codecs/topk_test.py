"""top-k: exactly the largest entries, positions ascending and in range, nothing else accepted."""

from __future__ import annotations

import pytest
import torch

from insitu.federated.codecs import CodecError, build_codec
from insitu.federated.codecs.base import check_parts

SHAPES = [torch.Size([10, 10]), torch.Size([100])]


def test_keeps_the_largest_magnitudes_and_zeroes_the_rest() -> None:
    flat = torch.randn(200, generator=torch.Generator().manual_seed(2))
    codec = build_codec("topk", {"fraction": 0.05})
    parts = codec.encode(flat, SHAPES)
    assert parts["indices"].shape == (10,) and parts["indices"].dtype == torch.int32
    back = codec.decode(parts, SHAPES)
    kept = set(parts["indices"].tolist())
    assert kept == set(flat.abs().topk(10).indices.tolist())
    assert all(back[i] == flat[i] for i in kept)
    assert int((back != 0).sum()) == 10


def test_k_is_at_least_one_and_fixed_by_the_layout() -> None:
    assert build_codec("topk", {"fraction": 1e-9}).layout(SHAPES)["indices"] == ((1,), torch.int32)
    assert build_codec("topk", {"fraction": 0.011}).layout(SHAPES)["values"][0] == (3,)  # ceil(2.2)


def test_positions_out_of_range_or_repeated_are_refused() -> None:
    codec = build_codec("topk", {"fraction": 0.01})
    ok = {"indices": torch.tensor([3, 150], dtype=torch.int32), "values": torch.tensor([1.0, 2.0])}
    check_parts(codec, ok, SHAPES)
    with pytest.raises(CodecError, match="outside 0..199"):
        check_parts(codec, {**ok, "indices": torch.tensor([3, 200], dtype=torch.int32)}, SHAPES)
    with pytest.raises(CodecError, match="outside"):
        check_parts(codec, {**ok, "indices": torch.tensor([-1, 5], dtype=torch.int32)}, SHAPES)
    with pytest.raises(CodecError, match="ascending"):
        check_parts(codec, {**ok, "indices": torch.tensor([7, 7], dtype=torch.int32)}, SHAPES)
    with pytest.raises(CodecError, match="its layout says"):  # more entries than k: rows would fit there
        check_parts(codec, {"indices": torch.arange(5, dtype=torch.int32), "values": torch.ones(5)}, SHAPES)
