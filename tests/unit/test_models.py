"""Models (``insitu.models``): the built-in MLP, the normalising wrapper, a user's factory by import path,
and the contract errors that tell a user what is wrong with theirs."""

from __future__ import annotations

import re
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pydantic
import pytest
import torch
from torch import nn

from insitu.conf import ConfigError, ModelConfig, TrainingConfig
from insitu.job import resolve_model
from insitu.models import ModelContractError, Normalization, Standardized, build_model, model_factory


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
                ) -> Iterator[Callable[[str], str]]:
    """``write(source)``: a module of that source, importable under a name unique to this test."""
    written: list[str] = []

    def write(source: str) -> str:
        # a parametrized test's name holds brackets and spaces: not an identifier
        name = re.sub(r"\W", "_", f"insitu_usermodel_{request.node.name}_{len(written)}")
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        written.append(name)
        return name

    monkeypatch.syspath_prepend(str(tmp_path))
    yield write
    for name in written:  # a later test must not get this test's module from the import cache
        sys.modules.pop(name, None)


# --------------------------------------------------------------------------- built in
@pytest.mark.parametrize(("n_outputs", "shape"), [(1, (5,)), (10, (5, 10))])
def test_tabular_mlp_builds_for_any_number_of_outputs(n_outputs: int, shape: tuple[int, ...]) -> None:
    model = build_model(ModelConfig(hidden=[12, 6], dropout=0.0), n_features=7, n_outputs=n_outputs)
    out = model(torch.randn(5, 7))
    assert tuple(out.shape) == shape
    widths = [m.out_features for m in model.core if isinstance(m, nn.Linear)]
    assert widths == [12, 6, n_outputs]  # the config's hidden widths reach the factory


def test_builtin_model_gets_hidden_dropout_and_options() -> None:
    factory, kwargs = model_factory(ModelConfig(hidden=[8], dropout=0.25))
    assert kwargs == {"hidden": [8], "dropout": 0.25}
    model = factory(3, 1, **kwargs)
    assert [m.p for m in model if isinstance(m, nn.Dropout)] == [0.25]
    # the name older configs used builds the same model
    assert model_factory(ModelConfig(name="fraud_mlp"))[0] is model_factory(ModelConfig())[0]


def test_standardized_normalises_inputs_and_scales_outputs() -> None:
    mean, std = [1.0, -2.0, 3.0], [2.0, 0.5, 4.0]
    core = nn.Linear(3, 1)
    with torch.no_grad():
        core.weight.copy_(torch.tensor([[0.5, -1.0, 2.0]]))
        core.bias.fill_(0.25)
    model = Standardized(core, 3, 1, Normalization(mean, std, out_shift=300.0, out_scale=50.0))
    x = np.array([[1.0, -2.0, 3.0], [3.0, -1.5, 7.0], [0.0, 0.0, 0.0]])
    # by hand: z = (x - mean) / std; out = 300 + 50 · (z · w + b)
    z = (x - np.array(mean)) / np.array(std)
    want = 300.0 + 50.0 * (z @ np.array([0.5, -1.0, 2.0]) + 0.25)
    out = model(torch.tensor(x, dtype=torch.float32))
    assert out.shape == (3,)
    assert np.allclose(out.detach().numpy(), want, atol=1e-4)
    assert float(out[0].detach()) == pytest.approx(300.0 + 50.0 * 0.25)  # the mean row maps to shift + scale · bias
    # the normalisation travels in the state dict (a model loaded elsewhere predicts the same)
    state = model.state_dict()
    assert state["out_shift"] == 300.0 and state["out_scale"] == 50.0 and state["std"].tolist() == std


def test_standardized_with_several_outputs_is_not_squeezed() -> None:
    core = nn.Linear(2, 3)
    model = Standardized(core, 2, 3, Normalization([0.0, 10.0], [1.0, 2.0], 1.0, 2.0))
    x = torch.tensor([[1.0, 12.0]])
    want = 1.0 + 2.0 * core(torch.tensor([[1.0, 1.0]]))
    assert torch.allclose(model(x), want)


def test_standardized_without_normalization_is_the_core() -> None:
    core = nn.Linear(4, 1)
    x = torch.randn(6, 4)
    assert torch.allclose(Standardized(core, 4, 1)(x), core(x).squeeze(-1))


# --------------------------------------------------------------------------- a user's factory
def test_user_factory_by_import_path_builds_with_its_options(user_module: Callable[[str], str]) -> None:
    mod = user_module("""
        from torch import nn

        CALLS = []

        def make(n_features, n_outputs, width=4, activation="relu"):
            CALLS.append((n_features, n_outputs, width, activation))
            act = nn.Tanh() if activation == "tanh" else nn.ReLU()
            return nn.Sequential(nn.Linear(n_features, width), act, nn.Linear(width, n_outputs))
    """)
    cfg = ModelConfig(name=f"{mod}:make", options={"width": 9, "activation": "tanh"})
    model = build_model(cfg, n_features=5, n_outputs=3, norm=Normalization([0.0] * 5, [1.0] * 5))
    assert sys.modules[mod].CALLS == [(5, 3, 9, "tanh")]  # options reached the factory, hidden/dropout did not
    assert isinstance(model, Standardized)
    assert model.core[0].out_features == 9 and isinstance(model.core[1], nn.Tanh)
    assert model(torch.randn(4, 5)).shape == (4, 3)
    # the same config builds the same parameter names, as every site and the coordinator must
    assert list(build_model(cfg, 5, 3).state_dict()) == list(model.state_dict())


def test_user_factory_in_a_package(user_module: Callable[[str], str], tmp_path: Path) -> None:
    pkg = tmp_path / "insitu_userpkg_models"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "nets.py").write_text("from torch import nn\n\ndef linear(n_features, n_outputs):\n"
                                 "    return nn.Linear(n_features, n_outputs)\n")
    try:
        model = build_model(ModelConfig(name="insitu_userpkg_models.nets:linear"), 3, 1)
        assert model(torch.randn(2, 3)).shape == (2,)  # (batch, 1) from the core, squeezed for one output
    finally:
        for name in ("insitu_userpkg_models.nets", "insitu_userpkg_models"):
            sys.modules.pop(name, None)


def test_contract_error_when_the_module_is_missing() -> None:
    with pytest.raises(ModelContractError) as e:
        build_model(ModelConfig(name="insitu_no_such_module_xyz:make"), 3)
    msg = str(e.value)
    assert "cannot import 'make' from 'insitu_no_such_module_xyz'" in msg and "ModuleNotFoundError" in msg
    assert "install the module" in msg and "tabular_mlp" in msg


def test_contract_error_when_the_attribute_is_missing(user_module: Callable[[str], str]) -> None:
    mod = user_module("def build(n_features, n_outputs):\n    raise AssertionError\n")
    with pytest.raises(ModelContractError, match=f"cannot import 'make' from '{mod}' \\(AttributeError"):
        build_model(ModelConfig(name=f"{mod}:make"), 3)


def test_contract_error_when_the_module_fails_to_import(user_module: Callable[[str], str]) -> None:
    # the user's module is there but broken: the error names the model and the cause, whatever it is
    mod = user_module("import torch\n\nraise RuntimeError('needs a GPU driver')\n")
    with pytest.raises(ModelContractError, match=f"cannot import 'make' from '{mod}' "
                                                 r"\(RuntimeError: needs a GPU driver\)"):
        build_model(ModelConfig(name=f"{mod}:make"), 3)


def test_contract_error_when_the_attribute_is_not_callable(user_module: Callable[[str], str]) -> None:
    mod = user_module("make = 42\n")
    with pytest.raises(ModelContractError, match="'make' is not callable"):
        build_model(ModelConfig(name=f"{mod}:make"), 3)


def test_contract_error_when_the_factory_fails(user_module: Callable[[str], str]) -> None:
    mod = user_module("""
        def make(n_features, n_outputs, activation="relu"):
            raise ValueError(f"unknown activation {activation!r}")
    """)
    with pytest.raises(ModelContractError) as e:
        build_model(ModelConfig(name=f"{mod}:make", options={"activation": "swishy"}), 3)
    msg = str(e.value)
    assert f"model '{mod}:make' failed to build with n_features=3, n_outputs=1 and options ['activation']" in msg
    assert "ValueError: unknown activation 'swishy'" in msg


def test_contract_error_when_the_factory_returns_no_module(user_module: Callable[[str], str]) -> None:
    mod = user_module("def make(n_features, n_outputs):\n    return {'weights': [0.0] * n_features}\n")
    with pytest.raises(ModelContractError, match="the factory returned dict, not an nn.Module"):
        build_model(ModelConfig(name=f"{mod}:make"), 3)


@pytest.mark.parametrize(("n_outputs", "core_out", "got", "want"), [
    (1, 3, "(2, 3)", "(2,)"),  # three outputs where the task needs one
    (4, 1, "(2, 1)", "(2, 4)"),  # one output where the task needs four
])
def test_contract_error_on_the_wrong_output_shape(user_module: Callable[[str], str], n_outputs: int, core_out: int,
                                                  got: str, want: str) -> None:
    mod = user_module(f"from torch import nn\n\ndef make(n_features, n_outputs):\n"
                      f"    return nn.Linear(n_features, {core_out})\n")
    with pytest.raises(ModelContractError) as e:
        build_model(ModelConfig(name=f"{mod}:make"), 3, n_outputs)
    assert f"returns shape {got} for input (2, 3); the task needs {want} (n_outputs={n_outputs})" in str(e.value)


def test_contract_error_when_the_module_fails_on_its_input(user_module: Callable[[str], str]) -> None:
    mod = user_module("from torch import nn\n\ndef make(n_features, n_outputs):\n"
                      "    return nn.Linear(n_features + 1, n_outputs)\n")
    with pytest.raises(ModelContractError, match=r"fails on input of shape \(2, 3\): RuntimeError"):
        build_model(ModelConfig(name=f"{mod}:make"), 3)


def test_contract_error_when_the_factory_does_not_accept_n_outputs(user_module: Callable[[str], str]) -> None:
    mod = user_module("from torch import nn\n\ndef make(n_features):\n    return nn.Linear(n_features, 1)\n")
    with pytest.raises(ModelContractError) as e:
        build_model(ModelConfig(name=f"{mod}:make"), 3, 2)
    msg = str(e.value)
    assert "cannot be built with n_features=3, n_outputs=2 and options []" in msg
    assert "takes 1 positional argument but 2 were given" in msg  # Python's own reason, passed on


def test_contract_error_when_the_factory_does_not_accept_an_option(user_module: Callable[[str], str]) -> None:
    mod = user_module("from torch import nn\n\ndef make(n_features, n_outputs):\n"
                      "    return nn.Linear(n_features, n_outputs)\n")
    with pytest.raises(ModelContractError, match=r"and options \['width'\]: .*unexpected keyword argument 'width'"):
        build_model(ModelConfig(name=f"{mod}:make", options={"width": 3}), 3)


def test_model_config_refuses_a_name_that_is_neither_builtin_nor_an_import_path() -> None:
    for bad in ("pkg.mod", "pkg/mod:make", "pkg.mod:make()", ":make"):
        with pytest.raises(pydantic.ValidationError, match="'package.module:function'"):
            ModelConfig(name=bad)
    # A plain name is parsed, and refused when the job resolves it: it is no built-in model.
    with pytest.raises(ConfigError, match=r"unknown model 'my_mlp'.*'package.module:function'"):
        resolve_model(TrainingConfig(model=ModelConfig(name="my_mlp")))
    assert ModelConfig(name="pkg.sub_mod:make_net").name == "pkg.sub_mod:make_net"
