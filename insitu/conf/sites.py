"""``sites.yaml``: the exchange, the coordinator's pool and each site's store, pool and Dask cluster."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from insitu.conf.errors import ConfigError, Refusal, format_loc
from insitu.conf.names import ENV_NAME, SITE_NAME
from insitu.conf.strict import Strict
from insitu.conf.urls import normalise_store_url, stores_overlap

DEFAULT_OUTAGE_S = 120.0


class StorageRef(Strict):
    """Where a store lives and which environment variables hold its endpoint and keys."""

    storage: str = Field(description="fsspec URL of the store root, e.g. s3://bucket/ or file:///path")
    endpoint_env: Annotated[str, Field(pattern=ENV_NAME)] | None = None
    """environment variable holding the store's endpoint URL (empty: the scheme's default)"""
    key_env: Annotated[str, Field(pattern=ENV_NAME)] | None = None
    """environment variable holding the access key id (the value never goes in a file)"""
    secret_env: Annotated[str, Field(pattern=ENV_NAME)] | None = None
    """environment variable holding the secret key"""
    outage_s: Annotated[float, Field(ge=0, le=86_400)] = DEFAULT_OUTAGE_S
    """how long a call to this store rides out its being unreachable (tried again after 1, 2, 4, 8, 16, 16, … s)
    before the run fails naming it; 0: fail at the first unreachable answer"""

    @field_validator("storage")
    @classmethod
    def _url(cls, v: str) -> str:
        # One spelling per store, so that the overlap checks of SitesConfig compare like with like.
        return normalise_store_url(v)


class DaskRef(Strict):
    scheduler_env: Annotated[str, Field(pattern=ENV_NAME)] = Field(
        description="environment variable that holds this site's Dask scheduler address"
    )
    local_workers: Annotated[int, Field(ge=1, le=64)] = 2
    """Dask workers the local platform starts for this site (one rank each)"""


class WanProfile(Strict):
    """The site's wide-area link to the control plane, as the local platform plays it (a relay at its border)."""

    rtt_ms: Annotated[float, Field(ge=0, le=10_000)] = 0.0
    """round-trip latency added to every exchange between the site and the control plane (ms)"""
    mbit: Annotated[float, Field(gt=0, le=100_000)] | None = None
    """bandwidth of the link each way (Mbit/s); empty: not limited"""
    loss: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """probability that a TCP segment is lost (each loss costs its chunk a retransmission timeout)"""

    @property
    def zero(self) -> bool:
        return self.rtt_ms == 0 and self.mbit is None and self.loss == 0


class SiteConfig(StorageRef):
    name: Annotated[str, Field(pattern=SITE_NAME)]
    """the site's name: lower-case letters, digits and '-'"""
    work_pool: str
    """the site's Prefect work pool (insitu-<site> on the local platform)"""
    dask: DaskRef
    """the site's Dask cluster"""
    devices: Literal["cpu", "cuda"] = "cpu"
    """what the site's ranks train on (cuda: one GPU per Dask worker, nccl)"""
    wan: WanProfile | None = None
    """the local platform's WAN profile for this site's border, e.g. {rtt_ms: 80, mbit: 50, loss: 0.001}
    (`insitu up --wan SITE:rtt_ms=80,mbit=50` overrides it); empty: no relay"""


class CoordinatorConfig(Strict):
    work_pool: str = "insitu-coordinator"
    """Prefect work pool that runs retrain"""


class SitesConfig(Strict):
    exchange: StorageRef
    """the one store both sides may use (weights, updates, aggregates)"""
    coordinator: CoordinatorConfig = CoordinatorConfig()
    """the control plane's own work pool"""
    sites: Annotated[list[SiteConfig], Field(min_length=1)]
    """one entry per region (site)"""

    @model_validator(mode="after")
    def _own(self) -> SitesConfig:
        # A site owns its name, pool, store and the variables that hold its keys: anything shared would let
        # one site's worker (or the exchange's users) reach another's rows.
        for attr in ("name", "work_pool"):
            first: dict[str, int] = {}
            for i, s in enumerate(self.sites):
                v = getattr(s, attr)
                if v in first:
                    raise Refusal(f"two sites share {attr} {v!r} (sites[{first[v]}].{attr}); give each site "
                                   f"its own {attr}", at=("sites", i, attr))
                first[v] = i
        self._own_stores()
        self._own_variables()
        return self

    def _own_stores(self) -> None:
        stores: list[tuple[tuple[str | int, ...], str]] = [(("exchange", "storage"), self.exchange.storage)]
        stores += [(("sites", i, "storage"), s.storage) for i, s in enumerate(self.sites)]
        for j, (key, url) in enumerate(stores):
            for key0, url0 in stores[:j]:
                if not stores_overlap(url0, url):
                    continue
                why = ("the exchange needs a store of its own (rows could otherwise leak into it)"
                       if key0[0] == "exchange" else "give each site a store of its own (a site could "
                       "otherwise read or overwrite another's rows)")
                raise Refusal(f"store {url} overlaps {format_loc(key0)} {url0}; {why}: use another bucket, or "
                               "prefixes neither of which contains the other", at=key)

    def _own_variables(self) -> None:
        owners: list[tuple[tuple[str | int, ...], StorageRef]] = [(("exchange",), self.exchange)]
        owners += [(("sites", i), s) for i, s in enumerate(self.sites)]
        first: dict[str, tuple[str | int, ...]] = {}
        for at, ref in owners:
            slots: list[tuple[tuple[str, ...], str | None]] = [
                ((f,), getattr(ref, f)) for f in ("endpoint_env", "key_env", "secret_env")
            ]
            if isinstance(ref, SiteConfig):
                slots.append((("dask", "scheduler_env"), ref.dask.scheduler_env))
            for slot, var in slots:
                if var is None:
                    continue
                key = (*at, *slot)
                if var in first:
                    raise Refusal(f"variable {var} is also named by {format_loc(first[var])}; each site and "
                                   "the exchange name variables of their own (whoever holds one would otherwise "
                                   "hold the other's endpoint or keys): rename one of them", at=key)
                first[var] = key

    def site(self, name: str) -> SiteConfig:
        for s in self.sites:
            if s.name == name:
                return s
        raise ConfigError(f"unknown site {name!r}; sites.yaml defines {[s.name for s in self.sites]}")

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sites]
