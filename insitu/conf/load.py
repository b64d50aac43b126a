"""Loading ``conf/``: each file on its own, and the three that make a job (sites, datasets, one training config)
cross-checked. Nothing here resolves a component name: that is :func:`insitu.job.load_job`'s, one floor up.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from insitu.conf.alerts import AlertsConfig
from insitu.conf.datasets import DatasetConfig, DatasetsConfig
from insitu.conf.errors import ConfigError, explain, short
from insitu.conf.names import CONF_NAME
from insitu.conf.sites import SitesConfig
from insitu.conf.training import TrainingConfig, default_aggregator
from insitu.conf.yaml_loader import read_yaml


def _load(model: type[BaseModel], path: Path) -> Any:
    try:
        return model.model_validate(read_yaml(path))
    except ValidationError as e:
        raise explain(path, e, model) from None


def conf_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The configuration directory: the argument, else ``$INSITU_CONF``, else ``./conf``."""
    return Path(path or os.environ.get("INSITU_CONF") or "conf")


def load_sites(path: str | os.PathLike[str] | None = None) -> SitesConfig:
    return _load(SitesConfig, Path(path) if path else conf_dir() / "sites.yaml")


def load_datasets(path: str | os.PathLike[str] | None = None, only: str | None = None) -> DatasetsConfig:
    """``datasets.yaml``; with ``only``, just that dataset is validated (when it is defined), so that a broken
    entry of another dataset does not stop a job on this one (``insitu validate`` checks them all)."""
    p = Path(path) if path else conf_dir() / "datasets.yaml"
    if only is None:
        return _load(DatasetsConfig, p)
    raw = read_yaml(p)
    entries = raw.get("datasets") if isinstance(raw, dict) else None
    if isinstance(entries, dict) and only in entries:
        raw = {**raw, "datasets": {only: entries[only]}}
    try:
        return DatasetsConfig.model_validate(raw)
    except ValidationError as e:
        raise explain(p, e, DatasetsConfig) from None


def load_alerts(path: str | os.PathLike[str] | None = None) -> AlertsConfig:
    """``alerts.yaml``; no file: no alerts (the defaults)."""
    p = Path(path) if path else conf_dir() / "alerts.yaml"
    return _load(AlertsConfig, p) if p.is_file() else AlertsConfig()


def load_training(path: str | os.PathLike[str]) -> TrainingConfig:
    return _load(TrainingConfig, Path(path))


class Conf(BaseModel):
    """Everything a job needs, cross-checked across files."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    sites: SitesConfig
    datasets: DatasetsConfig
    training: TrainingConfig
    dataset_name: str
    paths: dict[str, str]

    @property
    def dataset(self) -> DatasetConfig:
        return self.datasets.datasets[self.dataset_name]

    def config_hash(self) -> str:
        """A stable hash of the effective configuration (for lineage tags)."""
        blob = json.dumps(
            {
                "sites": self.sites.model_dump(mode="json"),
                # When a dataset is retrained is no part of what a job computes: editing a schedule must not
                # stop a job from resuming.
                "dataset": self.dataset.model_dump(mode="json", by_alias=True, exclude={"schedules"}),
                "training": self.training.model_dump(mode="json"),
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def trusted_training(training: str, directory: str | os.PathLike[str] | None = None) -> str:
    """A run's ``training`` parameter, admitted only as the name of a config in this actor's ``conf/training/``.

    A flow's parameters come from whoever created the run: a path would make the site read (and report errors
    about) a file the caller chose. So only a plain name (:data:`CONF_NAME`: no ``/``, no ``..``, no suffix)
    of a file ``<conf>/training/<name>.yaml`` is admitted, and that file may not be a link out of the folder.

    Returns
    -------
    str
        The config's resolved path.

    Raises
    ------
    ConfigError
        For anything else; the message shows at most 40 characters of ``training``.
    """
    root = (conf_dir(directory) / "training").resolve()
    fix = f"give the name of a config there (e.g. 'fraud'), or add yours to {root}"
    if not isinstance(training, str) or not re.fullmatch(CONF_NAME, training):
        raise ConfigError(f"training {short(training)}: only configs in {root} may be run, named without "
                          f"path or suffix ({CONF_NAME}); {fix}")
    path = (root / f"{training}.yaml").resolve()
    if path.parent != root:  # a symlink whose target lies elsewhere
        raise ConfigError(f"training {training!r}: only configs in {root} may be run, and "
                          f"{training}.yaml links out of it; copy the config there instead")
    if not path.is_file():
        known = sorted(p.stem for p in root.glob("*.yaml") if re.fullmatch(CONF_NAME, p.stem))
        raise ConfigError(f"training {training!r}: only configs in {root} may be run, and it holds no "
                          f"{training}.yaml (it holds {known}); {fix}")
    return str(path)


def load_conf(
    training: str | os.PathLike[str],
    dataset: str = "fraud",
    directory: str | os.PathLike[str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> Conf:
    """Load and cross-check sites, datasets and one training config.

    ``training`` is a name (``fraud``: ``<conf>/training/fraud.yaml``, admitted as by :func:`trusted_training`)
    or a path ending in ``.yaml``/``.yml``, read as given: a path is for the operator's own tools and tests,
    and a run's parameter must go through :func:`trusted_training` first. ``dataset`` is a key of
    ``datasets.yaml``. ``overrides`` are top-level training keys (e.g. ``{"rounds": 2}``) applied after loading.
    """
    d = conf_dir(directory)
    if isinstance(training, str) and not training.endswith((".yaml", ".yml")):
        trusted_training(training, d)  # a name: refused unless it names a file of conf/training/
        tpath = d / "training" / f"{training}.yaml"
    else:
        tpath = Path(training)
        if not tpath.is_absolute() and not tpath.exists() and (d.parent / tpath).exists():
            tpath = d.parent / tpath
    sites = load_sites(d / "sites.yaml")
    datasets = load_datasets(d / "datasets.yaml", only=dataset if isinstance(dataset, str) else None)
    if overrides:
        raw = read_yaml(tpath)
        raw.update({k: v for k, v in overrides.items() if v is not None})
        try:
            train = TrainingConfig.model_validate(raw)
        except ValidationError as e:
            raise explain(Path(f"{tpath} (with overrides {overrides})"), e, TrainingConfig) from None
    else:
        train = load_training(tpath)
    dpath = d / "datasets.yaml"
    if not isinstance(dataset, str) or not re.fullmatch(CONF_NAME, dataset):
        raise ConfigError(f"{dpath}: dataset {short(dataset)}: a run names a dataset by its key in datasets.yaml "
                          f"({CONF_NAME}); defined: {sorted(datasets.datasets)}")
    if dataset not in datasets.datasets:
        raise ConfigError(
            f"{dpath}: key 'datasets.{dataset}': dataset not defined; defined: {sorted(datasets.datasets)} "
            "(name one of them, or add yours to datasets.yaml)"
        )
    ds = datasets.datasets[dataset]
    for i, shard in enumerate(ds.shards):
        if shard.site not in sites.names:
            raise ConfigError(
                f"{dpath}: key 'datasets.{dataset}.shards[{i}].site': unknown site {shard.site!r}; "
                f"sites.yaml defines {sites.names}"
            )
    with_data = {s.site for s in ds.shards}
    if train.federation.min_sites > len(with_data):
        raise ConfigError(
            f"{tpath}: key 'federation.min_sites': {train.federation.min_sites} exceeds the "
            f"{len(with_data)} sites holding shards of {dataset!r}; lower it to at most {len(with_data)}"
        )
    return Conf(
        sites=sites,
        datasets=datasets,
        training=default_aggregator(train, len(with_data)),
        dataset_name=dataset,
        paths={"sites": str(d / "sites.yaml"), "datasets": str(dpath), "training": str(tpath)},
    )
