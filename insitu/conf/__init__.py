"""The ground floor: ``conf/*.yaml`` parsed into typed, frozen pydantic models, with errors that name the file,
the key and the fix. It imports nothing else of insitu and no torch (a test proves it in a fresh interpreter),
so anything may import it: the CLI, the flows, a torchrun rank, a unit test.

Which component names exist (learning tasks, models, aggregators, in-site strategies, async algorithms) and
what options each takes is decided one floor up, by :func:`insitu.job.load_job`.
"""

from insitu.conf.alerts import ALERT_KINDS, AlertsConfig, WebhookConfig
from insitu.conf.datasets import (
    ColumnSpec,
    DatasetConfig,
    DatasetsConfig,
    ScheduleConfig,
    SchemaConfig,
    ShardConfig,
)
from insitu.conf.errors import ConfigError, did_you_mean, explain, format_loc, short
from insitu.conf.load import (
    Conf,
    conf_dir,
    load_alerts,
    load_conf,
    load_datasets,
    load_sites,
    load_training,
    trusted_training,
)
from insitu.conf.names import CONF_NAME, ENV_NAME, IMPORT_PATH, JOB_ID_PATTERN, SITE_NAME, check_job_id
from insitu.conf.sites import CoordinatorConfig, DaskRef, SiteConfig, SitesConfig, StorageRef, WanProfile
from insitu.conf.training import (
    AggregatorConfig,
    AsyncConfig,
    CheckpointConfig,
    CompressionConfig,
    FederationConfig,
    GateConfig,
    ModelConfig,
    OptimizerConfig,
    RegistryConfig,
    SplitConfig,
    StalenessConfig,
    TaskConfig,
    TrainingConfig,
    ValidationConfig,
)
from insitu.conf.urls import STORE_SCHEMES, normalise_store_url, stores_overlap
from insitu.conf.yaml_loader import ConfLoader, DuplicateKeyError, read_yaml

__all__ = [
    "ALERT_KINDS", "AlertsConfig", "WebhookConfig", "load_alerts",
    "CONF_NAME", "ConfLoader", "DuplicateKeyError",
    "ENV_NAME", "IMPORT_PATH", "JOB_ID_PATTERN", "SITE_NAME", "STORE_SCHEMES",
    "AggregatorConfig", "AsyncConfig", "CheckpointConfig", "ColumnSpec", "CompressionConfig", "Conf",
    "ConfigError", "CoordinatorConfig",
    "DaskRef", "DatasetConfig", "DatasetsConfig", "FederationConfig", "GateConfig", "ModelConfig",
    "OptimizerConfig", "RegistryConfig", "ScheduleConfig", "SchemaConfig",
    "ShardConfig", "SiteConfig", "SitesConfig", "SplitConfig", "StalenessConfig", "StorageRef", "TaskConfig",
    "WanProfile",
    "TrainingConfig", "ValidationConfig", "check_job_id", "conf_dir", "did_you_mean", "explain", "format_loc",
    "load_conf", "load_datasets", "load_sites", "load_training", "normalise_store_url", "read_yaml", "short",
    "stores_overlap", "trusted_training",
]
