"""``insitu seed`` and ``insitu data put|ls``: data into each site's own store, and what is there."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from deployments.cli import site_store
from deployments.cli.common import (
    DEFAULT_CONF,
    DEFAULT_STATE,
    ConfDir,
    StateDir,
    console,
    inside_site,
    open_platform,
    quiet_logs,
    require_up,
)
from deployments.platform.site_side import run_in_site
from insitu.job import load_job


def seed(
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
    rows: Annotated[int, typer.Option(help="rows per site (fraud, card_sequences; digits has a fixed size)")] = 20000,
    random_seed: Annotated[int, typer.Option("--seed", help="random seed (same seed, same files)")] = 42,
    corrupt_shard: Annotated[str, typer.Option(
        help="shard id to write unreadable; 'last' or 'none' (fraud only)")] = "last",
    dataset: Annotated[str, typer.Option(
        help="the example dataset to write: fraud, digits or card_sequences")] = "fraud",
    training: Annotated[str | None, typer.Option(
        help="a training config the dataset must load with (default: the one named like the dataset); "
             "only checked, seeding trains nothing")] = None,
    site: Annotated[list[str], typer.Option(help="only this site's store (repeat for more; default: every site)")]
    = [],  # noqa: B006
) -> None:
    """Write an example dataset into each site's own store: `fraud` (synthetic, non-IID card transactions, with
    malformed rows and an unreadable shard on purpose), `digits` (handwritten digits, each site holding mostly
    its own digits) or `card_sequences` (each card's last 8 transactions per row, for a sequence model). For your
    own data use `insitu data put`."""
    quiet_logs()
    from insitu.data.seed import seed as do_seed
    from insitu.data.seed import seeder_for

    # Before the platform is asked for: a dataset with no example data fails at once, pointing at `data put`.
    seeder_for(dataset)
    p = open_platform(state_dir, conf)
    require_up(p)
    # The pair must load together, so that what is seeded can be trained on as configured.
    c = load_job(training or dataset, dataset, directory=conf).conf
    bad = next((s for s in site if s not in c.sites.names), None)
    if bad is not None:
        raise typer.BadParameter(f"unknown site {bad[:40]!r}: conf/sites.yaml defines {c.sites.names}",
                                 param_hint="--site")
    if p.network is not None and len(site) != 1:  # isolated: each store from inside its own site
        code = 0
        again = [sys.executable, "-m", "deployments.cli", "seed", "--state-dir", str(p.dir), "--conf",
                 str(p.conf_dir), "--rows", str(rows), "--seed", str(random_seed), "--corrupt-shard", corrupt_shard,
                 "--dataset", dataset, *(["--training", training] if training else [])]
        for s in site or c.sites.names:
            code = max(code, run_in_site(p, s, [*again, "--site", s]).returncode)
        raise typer.Exit(code)
    if site and inside_site(p, site[0]):
        return
    out = do_seed(c, rows, random_seed, None if corrupt_shard == "none" else corrupt_shard, sites=site or None)
    t = Table("shard", "site", "rows", "malformed rows", "unreadable")
    for sid, v in out.items():
        t.add_row(sid, v["site"], str(v["rows"]), str(v["malformed"]), "yes" if v["unreadable"] else "")
    console.print(t)


def data_put(
    file: Path,
    site: Annotated[str, typer.Option(help="the site whose store receives the file")],
    key: Annotated[str | None, typer.Option(help="where in the store (default raw/<file name>)")] = None,
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
) -> None:
    """Put a file into a site's own store (with that site's keys); it never leaves the site."""
    p = open_platform(state_dir, conf)
    site_store.check_site(p, site)
    site_store.check_key(key or f"raw/{file.name}")
    require_up(p)
    if inside_site(p, site):
        return
    console.print(f"{file} → {site_store.put(p, site, file, key)}")


def data_ls(
    site: Annotated[str, typer.Option(help="the site whose store to list")],
    prefix: Annotated[str, typer.Option(help="only keys under this prefix")] = "",
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
) -> None:
    """List a site's store: keys and sizes."""
    p = open_platform(state_dir, conf)
    site_store.check_site(p, site)
    require_up(p)
    if inside_site(p, site):
        return
    t = Table("key", "bytes", title=f"site {site}'s store")
    for name, size in site_store.ls(p, site, prefix):
        t.add_row(name, f"{size:,}")
    console.print(t)
