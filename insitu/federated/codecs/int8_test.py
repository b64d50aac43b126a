"""int8: error at most half a group's scale, per-channel scales, zeros, and payloads it never writes refused."""

from __future__ import annotations

import pytest
import torch

from insitu.federated.codecs import CodecError, build_codec
from insitu.federated.codecs.base import check_parts

SHAPES = [torch.Size([4, 8]), torch.Size([8]), torch.Size([3])]


def _flat() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(4, 8, generator=g) * torch.tensor([[1.0], [10.0], [0.01], [0.0]])  # rows of very other scale
    return torch.cat([w.reshape(-1), torch.randn(8, generator=g), torch.zeros(3)])


def test_per_tensor_error_is_at_most_half_a_scale() -> None:
    flat = _flat()
    codec = build_codec("int8")
    parts = codec.encode(flat, SHAPES)
    assert parts["values"].dtype == torch.int8 and parts["scales"].shape == (3,)
    back = codec.decode(parts, SHAPES)
    per_value = parts["scales"].repeat_interleave(torch.tensor([32, 8, 3]))
    assert bool(((back - flat).abs() <= per_value / 2 + 1e-7).all())
    assert torch.equal(back[-3:], torch.zeros(3))  # a tensor of zeros: scale 0, decodes to zeros
    assert float(parts["scales"][0]) == pytest.approx(float(flat[:32].abs().max()) / 127)


def test_per_channel_scales_keep_a_small_row_exact_where_one_scale_cannot() -> None:
    flat = _flat()
    tensor, channel = build_codec("int8"), build_codec("int8", {"scale": "channel"})
    t_parts, c_parts = tensor.encode(flat, SHAPES), channel.encode(flat, SHAPES)
    assert c_parts["scales"].shape == (4 + 1 + 1,)  # 4 rows of the matrix, one per 1-d tensor
    small_row = slice(16, 24)  # the row scaled by 0.01
    t_err = (tensor.decode(t_parts, SHAPES) - flat)[small_row].abs().max()
    c_err = (channel.decode(c_parts, SHAPES) - flat)[small_row].abs().max()
    assert c_err < t_err / 100


def test_a_payload_it_never_writes_is_refused() -> None:
    codec = build_codec("int8")
    parts = codec.encode(_flat(), SHAPES)
    check_parts(codec, parts, SHAPES)
    with pytest.raises(CodecError, match="negative"):
        check_parts(codec, {**parts, "scales": -parts["scales"]}, SHAPES)
    with pytest.raises(CodecError, match="-128"):
        check_parts(codec, {**parts, "values": torch.full_like(parts["values"], -128)}, SHAPES)
    with pytest.raises(CodecError, match="its layout says"):
        check_parts(codec, {**parts, "values": parts["values"].to(torch.int32)}, SHAPES)
    with pytest.raises(CodecError, match="extra \\['rows'\\]"):
        check_parts(codec, {**parts, "rows": torch.zeros(3)}, SHAPES)


@pytest.mark.parametrize("scale", ["tensor", "channel"])
def test_free_bytes_under_a_scale_are_refused(scale: str) -> None:
    """A payload decoding like an honest one but carrying other bytes: levels under a zero scale (they decode to 0
    whatever they are), or a group whose largest level is not 127 (a scale inflated to make room)."""
    codec = build_codec("int8", {"scale": scale})
    flat = _flat()
    parts = codec.encode(flat, SHAPES)
    check_parts(codec, parts, SHAPES)
    hidden = parts["values"].clone()
    hidden[-3:] = torch.tensor([72, 105, 33], dtype=torch.int8)  # under the zero tensor's scale 0
    with pytest.raises(CodecError, match="not what its scale says"):
        check_parts(codec, {**parts, "values": hidden}, SHAPES)
    halved = {"values": torch.round(parts["values"].float() / 2).to(torch.int8), "scales": parts["scales"] * 2}
    assert torch.allclose(codec.decode(halved, SHAPES), codec.decode(parts, SHAPES), atol=float(parts["scales"].max()))
    with pytest.raises(CodecError, match="not what its scale says"):
        check_parts(codec, halved, SHAPES)


def test_a_group_below_the_smallest_normal_float_is_sent_as_zeros() -> None:
    codec = build_codec("int8")
    flat = torch.cat([torch.full((32,), 1e-39), torch.ones(8), torch.zeros(3)])
    parts = codec.encode(flat, SHAPES)
    check_parts(codec, parts, SHAPES)
    assert float(parts["scales"][0]) == 0.0 and not bool(parts["values"][:32].any())
