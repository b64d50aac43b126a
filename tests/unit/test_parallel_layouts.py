"""Pure logic of the strategies' layouts: pipeline stage splits, mesh and batch checks, the data replica."""

from __future__ import annotations

import pytest
import torch

from insitu.conf import ConfigError, ModelConfig, TrainingConfig
from insitu.job import resolve_strategy
from insitu.models import build_model
from insitu.parallel.pipeline import stage_bounds, stage_module

TRANSFORMER = ModelConfig(name="sequence_transformer", dropout=0.0,
                          options={"seq_len": 4, "d_model": 8, "n_heads": 2, "n_layers": 5})


def test_even_and_explicit_stage_bounds() -> None:
    assert stage_bounds(5, 2, None) == [0, 2, 5]
    assert stage_bounds(4, 4, None) == [0, 1, 2, 3, 4]
    assert stage_bounds(5, 3, [1, 4]) == [0, 1, 4, 5]
    with pytest.raises(ValueError, match="fewer than the 3 pipeline stages"):
        stage_bounds(2, 3, None)
    with pytest.raises(ValueError, match="do not cut 5 blocks into 3 non-empty stages"):
        stage_bounds(5, 3, [3, 3])
    with pytest.raises(ValueError, match="do not cut 5 blocks"):
        stage_bounds(5, 2, [5])


@pytest.mark.parametrize(("model", "n_features", "split"), [
    (TRANSFORMER, 12, None), (TRANSFORMER, 12, [1, 2]),
    (ModelConfig(hidden=[8, 8], dropout=0.0), 6, None),
])
def test_stages_keep_the_models_names_and_chain_to_its_output(model: ModelConfig, n_features: int,
                                                               split: list[int] | None) -> None:
    torch.manual_seed(0)
    whole = build_model(model, n_features).eval()
    stages = [stage_module(whole, i, 3, split).eval() for i in range(3)]
    params = [set(dict(s.named_parameters())) for s in stages]
    assert set.union(*params) == set(dict(whole.named_parameters()))  # together: the whole model
    assert sum(len(p) for p in params) == len(set.union(*params))  # each parameter in one stage only
    for s in stages:
        for k, v in s.state_dict().items():
            assert torch.equal(v, whole.state_dict()[k])  # a stage's names and values are the model's
    x = torch.randn(5, n_features)
    h = x
    for s in stages:
        h = s(h)
    assert torch.allclose(h, whole(x), atol=1e-6)


def test_a_model_that_cannot_be_split_is_refused_by_name() -> None:
    from insitu.models import Standardized

    odd = Standardized(torch.nn.Linear(3, 1), 3, 1)
    with pytest.raises(ValueError, match="Linear cannot be split into pipeline stages"):
        stage_module(odd, 0, 2, None)


@pytest.mark.parametrize(("keys", "message"), [
    ({"strategy": "pipeline", "ranks_per_site": 1}, "set ranks_per_site >= 2"),
    ({"strategy": "pipeline", "ranks_per_site": 2, "batch_size": 30}, r"microbatches \(4\) must divide"),
    ({"strategy": "pipeline", "ranks_per_site": 3, "parallel": {"pipeline": {"split_points": [1]}}},
     "3 stages need 2"),
    ({"strategy": "hybrid", "ranks_per_site": 4, "parallel": {"mesh": {"pp": 4}}}, "needs a 2-D mesh"),
    ({"strategy": "hybrid", "ranks_per_site": 6, "parallel": {"mesh": {"pp": 2, "dp_shard": 2}}},
     "has 4 ranks but ranks_per_site is 6"),
    ({"strategy": "hybrid", "ranks_per_site": 4, "parallel": {"mesh": {"pp": 2, "dp_replicate": 2}}},
     "dp_replicate needs dp_shard"),
    ({"strategy": "hybrid", "ranks_per_site": 4, "batch_size": 12,
      "parallel": {"mesh": {"pp": 2, "dp_shard": 2}}}, r"batch_size 12 / 2 = 6"),
    ({"strategy": "hybrid", "ranks_per_site": 4, "parallel": {"mesh": {"tp": 2, "dp_shard": 2}}},
     r"unknown mesh dimension\(s\) \['tp'\]"),
])
def test_a_layout_that_cannot_work_is_refused_naming_the_key(keys: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):  # the configuration's own check, or the strategy's
        resolve_strategy(TrainingConfig.model_validate(keys))


def test_layouts_that_work_load() -> None:
    t = TrainingConfig.model_validate({"strategy": "hybrid", "ranks_per_site": 8, "parallel": {
        "mesh": {"dp_shard": 2, "pp": 2, "dp_replicate": 2}}})
    # outermost first, whatever the file's order
    assert list(resolve_strategy(t).options_of(t).mesh) == ["pp", "dp_replicate", "dp_shard"]
    resolve_strategy(t)
    resolve_strategy(TrainingConfig.model_validate({"strategy": "fsdp", "ranks_per_site": 3}))
    resolve_strategy(TrainingConfig.model_validate({"strategy": "pipeline", "ranks_per_site": 4, "batch_size": 64}))


def test_a_strategys_options_are_validated_by_the_strategy_naming_the_key() -> None:
    bad = TrainingConfig.model_validate({"strategy": "fsdp", "ranks_per_site": 2,
                                         "parallel": {"fsdp": {"mixed_precision": "bf17"}}})
    with pytest.raises(ConfigError, match=r"key 'parallel\.fsdp\.mixed_precision': Input should be 'auto', 'bf16'"):
        resolve_strategy(bad)
    typo = TrainingConfig.model_validate({"strategy": "fsdp", "ranks_per_site": 2, "parallel": {"fsdb": {}}})
    with pytest.raises(ConfigError, match=r"key 'parallel\.fsdb': no in-site strategy has this section "
                                          r"\(did you mean 'fsdp'\?\)"):
        resolve_strategy(typo)
    # Another strategy's section is left to it: a config may switch strategy without deleting it.
    switched = TrainingConfig.model_validate({"strategy": "ddp", "ranks_per_site": 2,
                                              "parallel": {"fsdp": {"mixed_precision": "bf16"}}})
    assert resolve_strategy(switched).name == "ddp"
    # … but it must still be right: another strategy's section is checked by that strategy
    wrong = TrainingConfig.model_validate({"strategy": "ddp", "ranks_per_site": 2,
                                           "parallel": {"fsdp": {"mixed_precision": "bf17"}}})
    with pytest.raises(ConfigError, match=r"key 'parallel\.fsdp\.mixed_precision'"):
        resolve_strategy(wrong)
