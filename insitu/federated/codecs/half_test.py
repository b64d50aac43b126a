"""fp16 and bf16: half the bytes, the error each format's mantissa promises, and fp16's range refused clearly."""

from __future__ import annotations

import pytest
import torch

from insitu.federated.codecs import CodecError, build_codec

SHAPES = [torch.Size([8, 4]), torch.Size([4])]


@pytest.mark.parametrize(("name", "rel"), [("fp16", 2.0**-11), ("bf16", 2.0**-8)])
def test_round_trip_within_the_format_s_relative_error(name: str, rel: float) -> None:
    flat = torch.randn(36, generator=torch.Generator().manual_seed(0))
    codec = build_codec(name)
    parts = codec.encode(flat, SHAPES)
    assert parts["values"].element_size() == 2
    back = codec.decode(parts, SHAPES)
    assert back.dtype == torch.float32
    assert bool(((back - flat).abs() <= rel * flat.abs() + 1e-30).all())


def test_fp16_refuses_a_value_beyond_its_range() -> None:
    with pytest.raises(CodecError, match="beyond fp16's range"):
        build_codec("fp16").encode(torch.tensor([1e6] + [0.0] * 35), SHAPES)
    assert build_codec("bf16").decode(build_codec("bf16").encode(torch.tensor([1e6] + [0.0] * 35), SHAPES),
                                      SHAPES)[0] == pytest.approx(1e6, rel=2**-8)
