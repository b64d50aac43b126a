"""A site's own store for ``insitu data put|ls``: put a file into it, list what it holds.

Uploading is the site operator's act, with the site's own store keys (the local platform's operator holds
each site's keys for seeding; in production a site admin runs this inside the region). Nothing here
touches the exchange: a file put into ``eu``'s store never leaves ``eu``.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from deployments.platform import Platform
from insitu.storage import Store, store_from_env


class DataCliError(ValueError):
    """A bad site, file or key (the message says which and how to fix it)."""


def check_site(p: Platform, site: str) -> str:
    if site not in p.sites.names:
        raise DataCliError(f"unknown site {site[:40]!r}: conf/sites.yaml defines {p.sites.names}")
    return site


def site_store(p: Platform, site: str) -> Store:
    return store_from_env(p.sites.site(check_site(p, site)), site)


def check_key(key: str) -> str:
    """A relative key inside the store: no absolute path, no '..', no empty segment."""
    norm = posixpath.normpath(key)
    if not key or key.startswith("/") or norm.startswith("..") or norm != key.rstrip("/") or "\\" in key:
        raise DataCliError(f"key {key[:80]!r} must be a relative path inside the site's store, e.g. "
                           "raw/fraud/part-003.parquet (no leading '/', no '..')")
    return norm


def put(p: Platform, site: str, file: Path, key: str | None) -> str:
    """Copy ``file`` to ``key`` (default ``raw/<file name>``) in ``site``'s store; returns its URL."""
    if not file.is_file():
        raise DataCliError(f"{file}: no such file")
    key = check_key(key or f"raw/{file.name}")
    store = site_store(p, site)
    store.fs.put_file(str(file), store.path(key))
    return store.full_url(key)


def ls(p: Platform, site: str, prefix: str) -> list[tuple[str, int]]:
    """``(key, bytes)`` of every object under ``prefix`` in ``site``'s store."""
    store = site_store(p, site)
    root = store.path(check_key(prefix) if prefix else "").rstrip("/")
    store.fs.invalidate_cache()
    try:
        found = store.fs.find(root, detail=True)
    except FileNotFoundError:
        return []
    base = store.path("").rstrip("/") + "/"
    return sorted((path[len(base):], int(info.get("size") or 0)) for path, info in found.items())
