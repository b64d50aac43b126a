"""What every command group of ``insitu`` shares: the console, the common options, opening the platform."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from deployments.platform import REPO, Platform
from insitu.conf import ConfigError

# Wide enough for the summary table when output is not a terminal (CI logs, `make demo | tee`).
console = Console(width=None if sys.stdout.isatty() else 160)
# For what must not mix with a command's standard output (e.g. `credentials --env`, read by a shell's eval).
err_console = Console(stderr=True)

StateDir = Annotated[Path, typer.Option("--state-dir", envvar="INSITU_HOME", help="platform state directory")]
ConfDir = Annotated[Path, typer.Option("--conf", envvar="INSITU_CONF", help="configuration directory")]
DEFAULT_STATE = REPO / ".insitu"
DEFAULT_CONF = REPO / "conf"

As = Annotated[str | None, typer.Option("--as", help="principal to sign as (its key: <state>/principals/NAME.key, "
                                                    "or $INSITU_PRINCIPALS_DIR/NAME.key); default "
                                                    "$INSITU_PRINCIPAL_KEY")]
Purpose = Annotated[str, typer.Option(help="why the data is used; each site's policy admits named purposes")]
DEFAULT_PURPOSE = "fraud-detection"


def fail(msg: str, code: int = 1) -> typer.Exit:
    """Print ``msg`` in red and return the exit to raise (``raise fail(...)``)."""
    console.print(f"[red]{msg}[/red]")
    return typer.Exit(code)


def quiet_logs() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for name in ("httpx", "prefect", "distributed", "botocore", "s3fs", "aiobotocore"):
        logging.getLogger(name).setLevel(logging.WARNING)


def open_platform(state_dir: Path, conf: Path) -> Platform:
    """The platform rooted at ``state_dir``, its operator environment put into this process."""
    try:
        p = Platform(state_dir, conf)
        # Before anything imports Prefect: its settings are read from this environment.
        p.apply_env()
        return p
    except ConfigError as e:
        console.print(f"[red]configuration error[/red]\n{e}")
        raise typer.Exit(2) from None


def is_up(p: Platform) -> bool:
    """Whether ``insitu up`` started the platform and no ``insitu down`` stopped it since."""
    return bool(p.state.get("pids"))


def require_up(p: Platform) -> None:
    if not is_up(p):
        console.print(f"[red]the platform is not running[/red] (state: {p.dir}); start it with `insitu up`")
        raise typer.Exit(1)
    p.apply_env()


def inside_site(p: Platform, site: str) -> bool:
    """On an isolated platform a site's store is on the site's own network: run this very command again inside the
    site's namespace (as its admin would on the site's host) and exit with its status. Returns False where the
    command can go on here (one network, or already inside)."""
    import subprocess

    from deployments.platform.netns import inside

    if p.network is None or inside(p.network.ns(site)):
        return False
    with p.within(site):
        # From the caller's directory, so that its relative paths (a FILE to put) mean what they meant here.
        code = subprocess.call([sys.executable, "-m", "deployments.cli", *sys.argv[1:]],
                               env={**p.operator_env(), "INSITU_HOME": str(p.dir), "INSITU_CONF": str(p.conf_dir),
                                    "PYTHONPATH": str(REPO)})
    raise typer.Exit(code)


def print_urls(p: Platform) -> None:
    console.print(f"Prefect UI: [link]{p.prefect_ui_url}[/link]   MLflow UI: [link]{p.mlflow_url}[/link]   "
                  f"state: {p.dir}   control plane on {p.database}   (both ask for a login: `insitu credentials`)")
