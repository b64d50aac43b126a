"""Write the synthetic demo dataset into each site's own store (``insitu seed``)."""

from __future__ import annotations

import logging
from typing import Any

from insitu.config import Conf
from insitu.data.synthetic import check_matches_schema, generate, inject_malformed
from insitu.storage import store_from_env

log = logging.getLogger(__name__)


def seed(conf: Conf, rows_per_site: int = 6000, seed: int = 42, corrupt_shard: str | None = "last",
         malformed_fraction: float = 0.005) -> dict[str, Any]:
    """Write every shard of ``conf.dataset`` as Parquet into its site's store.

    Rows are split evenly over a site's readable shards. ``corrupt_shard`` (a shard id, ``"last"`` for
    the dataset's last shard, or None) is written as unreadable bytes so that prepare reports it.
    Identical inputs write identical files.
    """
    ds = conf.dataset
    check_matches_schema(ds.schema_)
    bad_id = ds.shards[-1].id if corrupt_shard == "last" else corrupt_shard
    out: dict[str, Any] = {}
    for site in conf.sites.names:
        shards = ds.shards_of(site)
        if not shards:
            continue
        store = store_from_env(conf.sites.site(site), site)
        readable = [s for s in shards if s.id != bad_id]
        per = rows_per_site // max(len(readable), 1)
        for i, shard in enumerate(shards):
            url = store.full_url(shard.path)
            if shard.id == bad_id:
                with store.fs.open(store.path(shard.path), "wb") as f:
                    f.write(b"PAR1 this is not a parquet file: the demo's unreadable shard\n" * 8)
                out[shard.id] = {"site": site, "rows": 0, "malformed": 0, "unreadable": True}
                continue
            df = generate(site, per, seed, shard=i)
            n_bad = 0
            if i == 0:
                df, n_bad = inject_malformed(df, malformed_fraction, seed + i)
            if shard.path.endswith(".csv"):
                df.to_csv(url, storage_options=store.options or None, index=False)
            else:
                df.to_parquet(url, storage_options=store.options or None, index=False)
            out[shard.id] = {"site": site, "rows": len(df), "malformed": n_bad, "unreadable": False,
                             "fraud_rate": float(df["is_fraud"].mean())}
            log.info("seeded %s (%d rows, %d malformed) at %s", shard.id, len(df), n_bad, url)
    return out
