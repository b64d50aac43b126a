"""Unit tests run on a fixture configuration, ``tests/fixtures/conf/``, not on the shipped ``conf/``: a new demo
site, dataset or training config in ``conf/`` must not break them. ``test_shipped_conf.py`` is the one unit test
that reads ``conf/`` (it loads and validates what ships); the e2e tests use the shipped ``conf/`` through the
platform, which serves it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

FIXTURE_CONF = Path(__file__).resolve().parents[1] / "fixtures" / "conf"


@pytest.fixture(autouse=True)
def _fixture_conf_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Code that falls back to ``$INSITU_CONF`` (else ``./conf``) finds the fixture, never the shipped one (per
    test: the end-to-end tests of the same session keep the shipped one)."""
    monkeypatch.setenv("INSITU_CONF", str(FIXTURE_CONF))


@pytest.fixture(scope="session")
def conf_dir() -> Path:
    """The fixture ``conf/`` (sites eu, us, apac; datasets fraud, digits, card_sequences; training fraud,
    fraud_single, digits, card_sequences). Read only: a test that changes a file takes ``conf_copy``."""
    return FIXTURE_CONF


@pytest.fixture
def conf_copy(tmp_path: Path) -> Path:
    """A private copy of the fixture ``conf/`` that a test may break."""
    d = tmp_path / "conf"
    shutil.copytree(FIXTURE_CONF, d)
    return d


@pytest.fixture
def file_conf(conf_copy: Path, tmp_path: Path) -> Path:
    """``conf_copy`` whose sites' stores and exchange are folders under ``tmp_path`` (``file://``): seeding,
    preparing and training on them needs no platform."""
    sites = yaml.safe_load((conf_copy / "sites.yaml").read_text())
    sites["exchange"]["storage"] = f"file://{tmp_path}/exchange/"
    for s in sites["sites"]:
        s["storage"] = f"file://{tmp_path}/stores/{s['name']}/"
    (conf_copy / "sites.yaml").write_text(yaml.safe_dump(sites, sort_keys=False))
    return conf_copy
