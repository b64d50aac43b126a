"""Write a shipped example dataset into each site's own store (``insitu seed``).

Three datasets can be seeded, one generator each (:data:`SEEDERS`): ``fraud``, synthetic non-IID card
transactions with malformed rows and an unreadable shard on purpose, ``digits``, scikit-learn's
handwritten digits split over the sites with label skew, and ``card_sequences``, synthetic non-IID card
histories as one row per transaction holding the card's last 8 (:mod:`insitu.data.sequences`), clean. Any
other dataset is one's own: its files go into each site's store with ``insitu data put``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from insitu.conf import Conf
from insitu.data import sequences
from insitu.data.digits import digits_frames
from insitu.data.synthetic import check_matches_schema, generate, inject_malformed
from insitu.storage import Store, store_from_env

log = logging.getLogger(__name__)

# ``seeder(conf, rows_per_site, seed, corrupt_shard, malformed_fraction) -> {shard id: what was written}``
Seeder = Callable[[Conf, int, int, str | None, float], dict[str, Any]]


def seed(conf: Conf, rows_per_site: int = 6000, seed: int = 42, corrupt_shard: str | None = "last",
         malformed_fraction: float = 0.005, sites: list[str] | None = None) -> dict[str, Any]:
    """Write every shard of ``conf.dataset`` into its site's store, with the generator of that dataset.

    ``rows_per_site`` applies to ``fraud`` and ``card_sequences``; ``corrupt_shard`` (a shard id, ``"last"`` for
    the dataset's last shard, or None) and ``malformed_fraction`` to ``fraud`` only: ``digits`` is a fixed,
    clean dataset, ``card_sequences`` a clean one. ``sites`` (default: all) limits it to those sites' stores.
    Identical inputs write identical files.

    Returns
    -------
    dict
        Per shard id: ``site``, ``rows``, ``malformed``, ``unreadable`` (and a dataset's own extras).

    Raises
    ------
    ValueError
        For a dataset no seeder knows (before any store is touched).
    """
    return seeder_for(conf.dataset_name)(_only(conf, sites), rows_per_site, seed, corrupt_shard, malformed_fraction)


def _only(conf: Conf, sites: list[str] | None) -> Conf:
    """``conf`` with only ``sites`` (each site's files depend on the site and the seed alone, so seeding a subset
    writes the same files as seeding all)."""
    if sites is None:
        return conf
    kept = conf.sites.model_copy(update={"sites": [s for s in conf.sites.sites if s.name in sites]})
    return conf.model_copy(update={"sites": kept})


def seeder_for(dataset: str) -> Seeder:
    """The seeder of ``dataset``.

    Raises
    ------
    ValueError
        For a dataset without example data: the message names the seedable ones and ``insitu data put``.
    """
    seeder = SEEDERS.get(dataset)
    if seeder is None:
        shown = dataset if len(dataset) <= 40 else dataset[:39] + "…"  # a caller's value, never a caller's essay
        raise ValueError(f"no example data for dataset {shown!r}: `insitu seed` writes only {sorted(SEEDERS)}; "
                         "put your own files into each site's store with `insitu data put FILE --site SITE --key "
                         "PATH` (PATH: the shard's path in datasets.yaml)")
    return seeder


def _write(store: Store, path: str, df: pd.DataFrame) -> str:
    """Write ``df`` as the file ``path`` says (.csv or .parquet); returns its URL."""
    url = store.full_url(path)
    if store.url.startswith("file://"):  # object stores have no folders; a local one needs its parents
        store.fs.makedirs(store.path(path).rsplit("/", 1)[0], exist_ok=True)
    # Through the store's own filesystem: pandas would hand a file:// URL to urllib, which cannot write.
    with store.fs.open(store.path(path), "wb") as f:
        if path.endswith(".csv"):
            f.write(df.to_csv(index=False).encode())
        else:
            df.to_parquet(f, index=False)
    return url


def seed_fraud(conf: Conf, rows_per_site: int, seed: int, corrupt_shard: str | None,
               malformed_fraction: float) -> dict[str, Any]:
    """Synthetic fraud rows, split evenly over a site's readable shards; the first shard of each site carries
    malformed rows and ``corrupt_shard`` is written as unreadable bytes, so that prepare reports both."""
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
            if shard.id == bad_id:
                store.write_bytes(shard.path, b"PAR1 this is not a parquet file: the demo's unreadable shard\n" * 8)
                out[shard.id] = {"site": site, "rows": 0, "malformed": 0, "unreadable": True}
                continue
            df = generate(site, per, seed, shard=i)
            n_bad = 0
            if i == 0:
                df, n_bad = inject_malformed(df, malformed_fraction, seed + i)
            url = _write(store, shard.path, df)
            out[shard.id] = {"site": site, "rows": len(df), "malformed": n_bad, "unreadable": False,
                             "fraud_rate": float(df["is_fraud"].mean())}
            log.info("seeded %s (%d rows, %d malformed) at %s", shard.id, len(df), n_bad, url)
    return out


def seed_digits(conf: Conf, rows_per_site: int, seed: int, corrupt_shard: str | None,
                malformed_fraction: float) -> dict[str, Any]:
    """Each site's share of the digits (:func:`insitu.data.digits.digits_frames`), split evenly over its shards.

    The dataset has a fixed size and is clean: ``rows_per_site``, ``corrupt_shard`` and ``malformed_fraction``
    are not used.
    """
    ds = conf.dataset
    frames = digits_frames(seed)
    out: dict[str, Any] = {}
    for site in conf.sites.names:
        shards = ds.shards_of(site)
        if not shards:
            continue
        if site not in frames:
            raise ValueError(f"dataset {conf.dataset_name!r} pins shards to site {site!r}, but the digits example "
                             f"has data for {sorted(frames)} only; pin its shards to those sites")
        store = store_from_env(conf.sites.site(site), site)
        frame = frames[site]
        for shard, rows in zip(shards, np.array_split(np.arange(len(frame)), len(shards)), strict=True):
            df = frame.iloc[rows].reset_index(drop=True)
            url = _write(store, shard.path, df)
            counts = df["digit"].value_counts()
            # The skew at a glance: the digits this shard holds more of than an even share.
            mostly = sorted(str(d) for d in counts.index[counts > len(df) / 10])
            out[shard.id] = {"site": site, "rows": len(df), "malformed": 0, "unreadable": False, "mostly": mostly}
            log.info("seeded %s (%d rows, mostly digits %s) at %s", shard.id, len(df), ", ".join(mostly), url)
    return out


def seed_card_sequences(conf: Conf, rows_per_site: int, seed: int, corrupt_shard: str | None,
                        malformed_fraction: float) -> dict[str, Any]:
    """Synthetic card-transaction sequences (:func:`insitu.data.sequences.generate`), ``rows_per_site`` rows per
    site split evenly over its shards, each shard its own cards. Clean: ``corrupt_shard`` and
    ``malformed_fraction`` are not used.
    """
    ds = conf.dataset
    sequences.check_matches_schema(ds.schema_)
    out: dict[str, Any] = {}
    for site in conf.sites.names:
        shards = ds.shards_of(site)
        if not shards:
            continue
        store = store_from_env(conf.sites.site(site), site)
        per = [len(a) for a in np.array_split(np.arange(rows_per_site), len(shards))]
        for i, (shard, rows) in enumerate(zip(shards, per, strict=True)):
            df = sequences.generate(site, rows, seed, shard=i)
            url = _write(store, shard.path, df)
            rate = float(df[sequences.LABEL_COLUMN].mean()) if len(df) else 0.0
            out[shard.id] = {"site": site, "rows": len(df), "malformed": 0, "unreadable": False, "fraud_rate": rate}
            log.info("seeded %s (%d rows, fraud rate %.3f) at %s", shard.id, len(df), rate, url)
    return out


# The datasets `insitu seed` can write, by their key in datasets.yaml.
SEEDERS: dict[str, Seeder] = {"fraud": seed_fraud, "digits": seed_digits, "card_sequences": seed_card_sequences}
