"""``insitu wan show|set|cut|restore``: each site's wide-area border on the local platform (``platform.border``)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from deployments.cli.common import DEFAULT_CONF, DEFAULT_STATE, ConfDir, StateDir, console, err_console, open_platform
from deployments.platform import PlatformError

Site = Annotated[str, typer.Argument(help="the site whose border it is")]


def _fail(e: Exception) -> None:
    err_console.print(f"[red]{e}[/red]")
    raise typer.Exit(1) from None


def wan_show(state_dir: StateDir = DEFAULT_STATE, conf: ConfDir = DEFAULT_CONF) -> None:
    """Each site's WAN profile and its relay's ports (a site without a profile reaches the control plane directly)."""
    p = open_platform(state_dir, conf)
    t = Table("site", "rtt ms", "Mbit/s", "loss", "relay")
    for site in p.sites.names:
        w = p.borders.profile(site)
        if w is None:
            t.add_row(site, "-", "-", "-", "none (direct)")
            continue
        relay = "running" if p.status().get(f"wan-{site}", {}).get("running") else "down"
        t.add_row(site, f"{w.rtt_ms:g}", f"{w.mbit:g}" if w.mbit else "unlimited", f"{w.loss:g}", relay)
    console.print(t)


def wan_set(
    site: Site,
    rtt_ms: Annotated[float, typer.Option(help="round-trip latency (ms)")] = 0.0,
    mbit: Annotated[float | None, typer.Option(help="bandwidth each way (Mbit/s); omit: unlimited")] = None,
    loss: Annotated[float, typer.Option(help="TCP segment loss probability")] = 0.0,
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
) -> None:
    """Change a running border's profile now (its relay re-reads it); kept for the next `insitu up`."""
    from pydantic import ValidationError

    p = open_platform(state_dir, conf)
    profile = {"rtt_ms": rtt_ms, "loss": loss, **({"mbit": mbit} if mbit else {})}
    try:
        now = p.borders.set(site, profile)
    except (PlatformError, ValidationError) as e:
        _fail(e)
    console.print(f"{site}'s border now: {now}")


def _signal(site: str, state_dir: StateDir, conf: ConfDir, cut: bool) -> None:
    borders = open_platform(state_dir, conf).borders
    try:
        borders.cut(site) if cut else borders.restore(site)
    except PlatformError as e:
        _fail(e)


def wan_cut(site: Site, state_dir: StateDir = DEFAULT_STATE, conf: ConfDir = DEFAULT_CONF) -> None:
    """Cut the site off the control plane: every byte both ways is held (no reset) until `insitu wan restore`."""
    _signal(site, state_dir, conf, cut=True)
    console.print(f"{site}'s border is cut; `insitu wan restore {site}` puts it back")


def wan_restore(site: Site, state_dir: StateDir = DEFAULT_STATE, conf: ConfDir = DEFAULT_CONF) -> None:
    """Restore a cut border: what was held is delivered, late."""
    _signal(site, state_dir, conf, cut=False)
    console.print(f"{site}'s border is restored")
