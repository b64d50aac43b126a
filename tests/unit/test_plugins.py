"""Each seam finds its implementations in its package: a new task, aggregator, strategy or model is one file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from insitu.plugins import functions_named_as_their_module, modules_with, named_subclasses


class Base:
    name: str


def _package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> tuple[str, list[str]]:
    pkg = tmp_path / "seam_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, text in files.items():
        (pkg / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    for mod in [m for m in sys.modules if m.startswith("seam_pkg")]:
        del sys.modules[mod]
    return "seam_pkg", [str(pkg)]


def test_a_new_file_is_a_new_implementation_and_tests_and_private_modules_are_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head = "from test_plugins import Base\n"
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    name, path = _package(tmp_path, monkeypatch, {
        "alpha.py": head + "class Alpha(Base):\n    name = 'alpha'\n",
        "middle.py": head + "class Middle(Base):\n    pass\n",  # an intermediate base: no name of its own
        "alpha_test.py": head + "class NotOne(Base):\n    name = 'from-a-test'\n",
        "_private.py": head + "class Hidden(Base):\n    name = 'hidden'\n",
        "user.py": head + "from seam_pkg.alpha import Alpha\nclass Beta(Alpha):\n    name = 'beta'\n",
    })
    found = named_subclasses(name, path, Base)
    assert sorted(found) == ["alpha", "beta"]  # Alpha imported into user.py is counted once, where it is defined


def test_two_classes_with_one_name_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    head = "from test_plugins import Base\n"
    name, path = _package(tmp_path, monkeypatch, {"a.py": head + "class A(Base):\n    name = 'x'\n",
                                                  "b.py": head + "class B(Base):\n    name = 'x'\n"})
    with pytest.raises(RuntimeError, match="A and B are both called 'x'"):
        named_subclasses(name, path, Base)


def test_modules_and_functions_are_found_by_what_they_define(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name, path = _package(tmp_path, monkeypatch, {
        "fast.py": "DISTRIBUTED = True\ndef parallelize(m, mesh, spec): return m\n",
        "helper.py": "def parallelize(m, mesh, spec): return m\n",  # no DISTRIBUTED: not a strategy
        "wide_mlp.py": "def wide_mlp(n_features, n_outputs): return None\n",
    })
    assert list(modules_with(name, path, "parallelize", "DISTRIBUTED")) == ["fast"]
    assert list(functions_named_as_their_module(name, path)) == ["wide_mlp"]


def test_the_shipped_seams_list_what_is_shipped() -> None:
    from insitu.federated.aggregators import AGGREGATORS
    from insitu.models import MODELS
    from insitu.parallel.strategies import strategies
    from insitu.specs import TASKS

    assert sorted(TASKS) == ["binary", "multiclass", "regression"]
    assert sorted(AGGREGATORS) == ["fedadagrad", "fedadam", "fedavg", "fedprox", "fedyogi", "median", "trimmed_mean"]
    assert sorted(strategies()) == ["ddp", "fsdp", "hybrid", "pipeline", "single"]
    assert sorted(MODELS) == ["fraud_mlp", "sequence_transformer", "tabular_mlp"]


def test_a_strategy_is_looked_up_by_the_same_rule_that_lists_them() -> None:
    from insitu.parallel.strategies import strategy

    for name in ("ddp", "fsdp", "pipeline", "hybrid", "single"):
        assert strategy(name).name == name and strategy(name).parallelize.__module__ == f"insitu.parallel.{name}"
    # modules of insitu/parallel that are not strategies, and names that are not modules at all
    for name in ("loop", "rank", "_private", "ddp_test", "../ddp", "nope"):
        with pytest.raises(ValueError, match=rf"unknown strategy '{re.escape(name)}'; known: \['ddp', "):
            strategy(name)
    # Validating a config imports its own strategy only (every config load would pay for all of them).
    out = subprocess.run([sys.executable, "-c", (
        "import sys; from insitu.parallel.strategies import strategy; strategy('ddp'); "
        "import json; print(json.dumps([m for m in sys.modules if m.startswith('insitu.parallel.')]))")],
        capture_output=True, text=True, check=True, timeout=120)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert "insitu.parallel.ddp" in loaded and not {"insitu.parallel.pipeline", "insitu.parallel.fsdp"} & set(loaded)
