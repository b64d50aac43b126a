"""``insitu site up|down|status --site X``: one region, started by its own admin from what the region holds.

``--state-dir`` is the site's directory: on a site's own host, a copy of the site's files (its kit
``sites/<site>.json``, ``actors/<site>/``, ``admin/<site>/``, ``audit/<site>/``, ``stores/<site>/``; see
docs/operations.md, "A region on its own host"); nothing of the operator's state file is read.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from deployments.cli.common import DEFAULT_CONF, DEFAULT_STATE, ConfDir, StateDir, console, err_console, quiet_logs
from deployments.platform import PlatformError
from deployments.platform.site_runtime import SiteRuntime

SiteOpt = Annotated[str, typer.Option("--site", help="the site to start (a name in sites.yaml)")]


def _runtime(state_dir: StateDir, conf: ConfDir, site: str) -> SiteRuntime:
    try:
        return SiteRuntime(state_dir, site, conf)
    except PlatformError as e:
        err_console.print(f"[red]{e}[/red]")
        raise typer.Exit(1) from None


def site_up(
    site: SiteOpt,
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
    control_plane: Annotated[str | None, typer.Option(
        help="the control plane's host as this site reaches it (kept in its kit; default: the kit's)")] = None,
) -> None:
    """Start one site (its audit service, its store, its Dask, its worker) from its own files alone."""
    quiet_logs()
    r = _runtime(state_dir, conf, site)
    try:
        if control_plane is not None:
            r.reach_control_plane_at(control_plane)
        moved = r.relocate()
        with console.status(f"starting site {site} from {r.root}…"):
            started = r.up()
    except PlatformError as e:
        err_console.print(f"[red]{e}[/red]")
        raise typer.Exit(1) from None
    if moved:
        console.print(f"{site}'s identity now points at its files in {r.root}")
    console.print(f"site {site} up ({'started ' + ', '.join(started) if started else 'everything was running'}); "
                  f"it reaches the control plane at {r.kit['control_plane']['host']}")


def site_down(site: SiteOpt, state_dir: StateDir = DEFAULT_STATE, conf: ConfDir = DEFAULT_CONF) -> None:
    """Stop what `insitu site up` started for this site (by PID)."""
    quiet_logs()
    stopped = _runtime(state_dir, conf, site).down()
    console.print(f"stopped {len(stopped)} component(s) of {site}" + (f": {', '.join(stopped)}" if stopped else ""))


def site_status(site: SiteOpt, state_dir: StateDir = DEFAULT_STATE, conf: ConfDir = DEFAULT_CONF) -> None:
    """Show each component of the site that `insitu site up` started: PID, running, healthy."""
    quiet_logs()
    t = Table("component", "pid", "running", "healthy", title=f"site {site}")
    for name, s in _runtime(state_dir, conf, site).status().items():
        t.add_row(name, str(s["pid"] or "-"), "yes" if s["running"] else "no",
                  "[green]yes[/green]" if s["healthy"] else "[red]no[/red]")
    console.print(t)
