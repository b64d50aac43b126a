"""One floor above the configuration: a job's every component name resolved once, into a typed :class:`JobSpec`.

:mod:`insitu.conf` parses the YAML and knows no component; here each name is looked up in its seam's list
(learning task, model, aggregator, in-site strategy, async algorithm) and each component's options are validated
by that component's own ``Options``, with the configuration's "file: key: fix" messages::

    job = load_job("fraud", dataset="fraud")
    job.task.gate_metric("pr_auc"); job.aggregator; job.strategy.distributed; job.config_hash

Everything downstream (flows, site tasks, a torchrun rank) takes the resolved job instead of looking names up again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from insitu.conf import Conf, ConfigError, DatasetConfig, DatasetsConfig, SitesConfig, TrainingConfig, load_conf
from insitu.conf.errors import did_you_mean, explain, format_loc
from insitu.data.features import feature_names
from insitu.federated.aggregators import AGGREGATORS, Aggregator, build_aggregator
from insitu.federated.asynchronous import ALGORITHMS, AsyncAlgorithm
from insitu.federated.codecs import CODECS, UpdateEncoding, build_encoding
from insitu.models import MODELS, ModelContractError, ModelFactory, build_model, model_factory
from insitu.parallel.strategies import strategies, strategy
from insitu.parallel.types import Strategy
from insitu.specs import TASKS, TaskSpec, build_task


class ModelDoesNotFit(ConfigError):
    """The model's factory imports, but the model it builds does not take this dataset's features."""


@dataclass(frozen=True)
class JobSpec:
    """A loaded, cross-checked configuration with every component resolved (see :func:`load_job`)."""

    conf: Conf
    task: TaskSpec  # the learning task, built for this dataset's label
    model_factory: ModelFactory
    model_options: dict[str, Any]
    aggregator: type[Aggregator]
    strategy: Strategy  # the in-site strategy (``parallelize``, ``distributed``, its options and mesh)
    async_algorithm: type[AsyncAlgorithm] | None  # set when federation.mode is async
    encoding: UpdateEncoding | None = None  # federation.compression; None: updates cross as full state dicts
    config_hash: str = field(default="")

    @property
    def training(self) -> TrainingConfig:
        return self.conf.training

    @property
    def sites(self) -> SitesConfig:
        return self.conf.sites

    @property
    def datasets(self) -> DatasetsConfig:
        return self.conf.datasets

    @property
    def dataset(self) -> DatasetConfig:
        return self.conf.dataset

    @property
    def dataset_name(self) -> str:
        return self.conf.dataset_name

    @property
    def paths(self) -> dict[str, str]:
        return self.conf.paths

    def check_model(self) -> None:
        """Build the model on a dummy batch, as every site will: a misspelt import path or a factory that does not
        keep the contract fails here, naming the file and key, before anything is signed or started.

        Raises
        ------
        ModelDoesNotFit
            ``<training file>: key 'model.name': …`` with the build error.
        """
        n_features = len(feature_names(self.dataset.schema_))
        try:
            build_model(self.training.model, n_features, self.task.n_outputs)
        except ModelContractError as e:
            raise ModelDoesNotFit(f"{self.paths['training']}: key 'model.name': {e}") from None


def load_job(
    training: str | os.PathLike[str],
    dataset: str = "fraud",
    directory: str | os.PathLike[str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> JobSpec:
    """Load and cross-check the configuration (:func:`insitu.conf.load_conf`, same arguments), then resolve every
    component it names.

    Raises
    ------
    ConfigError
        For anything wrong, naming the file, the key and the fix.
    """
    conf = load_conf(training, dataset, directory, overrides)
    return resolve(conf)


def resolve(conf: Conf) -> JobSpec:
    """The components ``conf`` names, each checked by its own seam (see :func:`load_job`)."""
    tpath = Path(conf.paths["training"])
    t = conf.training
    task = resolve_task(conf, tpath)
    factory, options = resolve_model(t, tpath)
    aggregator = resolve_aggregator(t, tpath)
    in_site = resolve_strategy(t, tpath)
    algorithm = resolve_async_algorithm(t, aggregator, tpath)
    encoding = resolve_encoding(t, tpath)
    return JobSpec(conf=conf, task=task, model_factory=factory, model_options=options, aggregator=aggregator,
                   strategy=in_site, async_algorithm=algorithm, encoding=encoding, config_hash=conf.config_hash())


def resolve_task(conf: Conf, tpath: Path) -> TaskSpec:
    """The learning task fits the dataset's label, and the gate and validation name metrics of that task."""
    t = conf.training
    if t.task.name not in TASKS:
        raise ConfigError(f"{tpath}: key 'task.name': unknown learning task {t.task.name!r}"
                          f"{did_you_mean(t.task.name, TASKS)}; known: {sorted(TASKS)}")
    try:
        task = build_task(t.task, conf.dataset.schema_)
    except ValueError as e:
        # A task that does not fit the label type gets the map of which fits; any other refusal says its own fix.
        hint = ("; choose the task that fits the label (bool: binary, category: multiclass, float/int: regression)"
                if "needs a label column" in str(e) else "")
        raise ConfigError(f"{tpath}: key 'task': {e} in dataset {conf.dataset_name!r}{hint}") from None
    named = (("gate.primary_metric", t.gate.primary_metric), ("validation.metric", t.validation.metric))
    for key, name in named:
        try:
            task.gate_metric(name)
        except ValueError as e:
            raise ConfigError(f"{tpath}: key '{key}': {e}; name one of them or leave it empty") from None
    return task


def resolve_model(t: TrainingConfig, tpath: Path | str = "training") -> tuple[ModelFactory, dict[str, Any]]:
    name = t.model.name
    if ":" not in name and name not in MODELS:
        raise ConfigError(f"{tpath}: key 'model.name': unknown model {name!r}{did_you_mean(name, MODELS)}; built "
                          f"in: {sorted(MODELS)}, or your own factory as 'package.module:function' (see "
                          "docs/bring-your-own.md)")
    try:
        return model_factory(t.model)
    except ModelContractError as e:
        raise ConfigError(f"{tpath}: key 'model.name': {e}") from None


def resolve_aggregator(t: TrainingConfig, tpath: Path | str = "training") -> type[Aggregator]:
    name = t.aggregator.name
    if name not in AGGREGATORS:
        raise ConfigError(f"{tpath}: key 'aggregator.name': unknown aggregator {name!r}"
                          f"{did_you_mean(name, AGGREGATORS)}; known: {sorted(AGGREGATORS)}")
    try:
        build_aggregator(name, t.aggregator.options)  # its own Options validate the options
    except ValueError as e:
        raise ConfigError(f"{tpath}: key 'aggregator.options': {e}") from None
    return AGGREGATORS[name]


def resolve_encoding(t: TrainingConfig, tpath: Path | str = "training") -> UpdateEncoding | None:
    """The update encoding of ``federation.compression``: its codec known, its options its own."""
    c = t.federation.compression
    if c.encoding != "none" and c.encoding not in CODECS:
        raise ConfigError(f"{tpath}: key 'federation.compression.encoding': unknown encoding {c.encoding!r}"
                          f"{did_you_mean(c.encoding, CODECS)}; known: none, {', '.join(sorted(CODECS))}")
    try:
        return build_encoding(c)
    except ValidationError as e:  # the codec's own Options refused them
        raise ConfigError(f"{tpath}: key 'federation.compression.options': {e}") from None
    except ValueError as e:  # a codec that encodes only a difference, without delta
        raise ConfigError(f"{tpath}: key 'federation.compression.delta': {e}") from None


def resolve_strategy(t: TrainingConfig, tpath: Path | str = "training") -> Strategy:
    """The in-site strategy, its options (its sections of ``parallel:``) and its layout checked by the strategy."""
    try:
        found = strategy(t.strategy)
    except ValueError:
        known = sorted(strategies())
        raise ConfigError(f"{tpath}: key 'strategy': unknown in-site strategy {t.strategy!r}"
                          f"{did_you_mean(t.strategy, known)}; known: {known}") from None
    others = set(t.parallel) - set(found.options.model_fields)
    if others:  # sections this strategy does not read: another strategy's (checked by it), or a mistake
        owners = {s: other for other in strategies().values() for s in other.options.model_fields}
        for key in sorted(others):
            if key not in owners:
                raise ConfigError(f"{tpath}: key 'parallel.{format_loc((key,))}': no in-site strategy has this "
                                  f"section{did_you_mean(key, owners)}; known: {sorted(owners)}")
            try:  # a config may switch strategy and keep the other's section: it must still be right
                owners[key].options.model_validate({key: t.parallel[key]})
            except ValidationError as e:
                raise explain(Path(tpath), e, owners[key].options, at=("parallel",)) from None
    try:
        found.options_of(t)
    except ValidationError as e:
        raise explain(Path(tpath), e, found.options, at=("parallel",)) from None
    if found.check is not None:
        try:
            found.check(t)  # the strategy's layout fits the ranks and the batch: its own check, in its module
        except ValueError as e:
            raise ConfigError(f"{tpath}: key 'strategy': {e}") from None
    return found


def resolve_async_algorithm(t: TrainingConfig, aggregator: type[Aggregator],
                            tpath: Path | str = "training") -> type[AsyncAlgorithm] | None:
    if t.federation.mode != "async":
        return None
    if not aggregator.runs_in_async_mode:
        usable = sorted(n for n, a in AGGREGATORS.items() if a.runs_in_async_mode)
        raise ConfigError(f"{tpath}: key 'aggregator': federation.mode async combines updates with "
                          f"federation.asynchronous.algorithm; aggregator {aggregator.name!r} is a synchronous "
                          f"round's: use one of {usable} (they only decide what sites train with)")
    name = t.federation.asynchronous.algorithm
    if name not in ALGORITHMS:
        raise ConfigError(f"{tpath}: key 'federation.asynchronous.algorithm': unknown {name!r}; known: "
                          f"{sorted(ALGORITHMS)}")
    return ALGORITHMS[name]
