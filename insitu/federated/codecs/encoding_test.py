"""An update's encoding: delta against the global model, integer tensors kept, error feedback delivering what
top-k dropped, and a payload of any other form refused before decoding."""

from __future__ import annotations

import pytest
import torch

from insitu.federated.codecs import CodecError, UpdateEncoding, build_codec


def _model(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"fc.weight": torch.randn(16, 8, generator=g), "fc.bias": torch.randn(16, generator=g),
            "bn.num_batches_tracked": torch.tensor(seed, dtype=torch.int64)}


def _trained(reference: dict[str, torch.Tensor], step: float, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + step * torch.randn(v.shape, generator=g) if v.is_floating_point() else v + 1
            for k, v in reference.items()}


def test_decoded_update_has_the_global_model_s_names_shapes_dtypes_and_kept_integers() -> None:
    ref = _model(0)
    enc = UpdateEncoding(build_codec("int8"))
    payload, _ = enc.encode(_trained(ref, 0.01, 1), ref)
    out = enc.decode(payload, ref)
    assert list(out) == list(ref)
    assert all(out[k].shape == ref[k].shape and out[k].dtype == ref[k].dtype for k in ref)
    assert int(out["bn.num_batches_tracked"]) == 1


def test_delta_encoding_is_far_more_exact_than_encoding_the_weights() -> None:
    ref = _model(0)
    trained = _trained(ref, 0.001, 1)  # a round moves weights little: the difference is what matters
    errors = {}
    for delta in (True, False):
        enc = UpdateEncoding(build_codec("int8"), delta=delta, error_feedback=False)
        out = enc.decode(enc.encode(trained, ref)[0], ref)
        errors[delta] = float((out["fc.weight"] - trained["fc.weight"]).abs().max())
    assert errors[True] < errors[False] / 50


def test_error_feedback_delivers_what_topk_dropped() -> None:
    """Over rounds, sum(sent) + residual == sum(true deltas) exactly: nothing is lost, only delayed; without
    error feedback the dropped mass is gone."""
    ref = _model(0)
    with_ef = UpdateEncoding(build_codec("topk", {"fraction": 0.05}))
    without = UpdateEncoding(build_codec("topk", {"fraction": 0.05}), error_feedback=False)
    residual = None
    sent_ef, sent_plain, true = torch.zeros(144), torch.zeros(144), torch.zeros(144)
    for r in range(20):
        trained = _trained(ref, 0.01, 100 + r)
        delta = torch.cat([(trained[k] - ref[k]).reshape(-1) for k in ("fc.weight", "fc.bias")])
        true += delta
        payload, residual = with_ef.encode(trained, ref, residual)
        out = with_ef.decode(payload, ref)
        sent_ef += torch.cat([(out[k] - ref[k]).reshape(-1) for k in ("fc.weight", "fc.bias")])
        out = without.decode(without.encode(trained, ref)[0], ref)
        sent_plain += torch.cat([(out[k] - ref[k]).reshape(-1) for k in ("fc.weight", "fc.bias")])
    assert residual is not None
    assert torch.allclose(sent_ef + residual, true, atol=1e-5)
    assert float((sent_ef - true).norm()) < 0.6 * float((sent_plain - true).norm())


def test_the_residual_is_kept_only_with_error_feedback() -> None:
    ref = _model(0)
    assert UpdateEncoding(build_codec("int8"), error_feedback=False).encode(_trained(ref, 0.01, 1), ref)[1] is None
    assert UpdateEncoding(build_codec("int8")).encode(_trained(ref, 0.01, 1), ref)[1] is not None


def test_a_payload_of_another_form_is_refused() -> None:
    ref = _model(0)
    enc = UpdateEncoding(build_codec("int8"))
    payload, _ = enc.encode(_trained(ref, 0.01, 1), ref)
    with pytest.raises(CodecError, match="kept tensors"):
        enc.decode({k: v for k, v in payload.items() if not k.startswith("keep.")}, ref)
    with pytest.raises(CodecError, match="kept tensors"):
        enc.decode({**payload, "keep.rows": torch.zeros(5)}, ref)
    with pytest.raises(CodecError, match="kept tensor 'bn.num_batches_tracked' differs"):
        enc.decode({**payload, "keep.bn.num_batches_tracked": torch.zeros(5, dtype=torch.int64)}, ref)
    with pytest.raises(CodecError, match="extra \\['rows'\\]"):
        enc.decode({**payload, "rows": torch.zeros(5)}, ref)
    with pytest.raises(CodecError, match="NaN"):
        enc.decode({**payload, "scales": torch.full_like(payload["scales"], float("nan"))}, ref)


def test_the_manifest_name_says_delta() -> None:
    assert UpdateEncoding(build_codec("int8")).name == "int8-delta"
    assert UpdateEncoding(build_codec("fp16"), delta=False).name == "fp16"
