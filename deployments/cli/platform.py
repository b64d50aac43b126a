"""``insitu up|down|status|credentials``: the local platform's life and its logins."""

from __future__ import annotations

import shlex
import sys
from typing import Annotated, Any

import typer
from rich.table import Table

from deployments.cli.common import (
    DEFAULT_CONF,
    DEFAULT_STATE,
    ConfDir,
    StateDir,
    console,
    err_console,
    is_up,
    open_platform,
    print_urls,
    quiet_logs,
)
from deployments.platform import Platform, PlatformError
from insitu.conf import ConfigError

# What the MLflow and Prefect Python clients read: the operator's read-only MLflow login, and the Prefect
# API with the basic-auth string its server requires.
CLIENT_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
              "PREFECT_API_URL", "PREFECT_API_AUTH_STRING")


def up(
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
    free_ports: Annotated[bool, typer.Option(help="pick free ports instead of the defaults")] = False,
    port: Annotated[list[str], typer.Option(help="override a port: NAME=PORT (e.g. prefect=4300)")] = [],  # noqa: B006
    database: Annotated[str | None, typer.Option(
        help="where Prefect and MLflow keep their state, chosen when the platform is new: postgres (the default "
             "where PostgreSQL is installed) or sqlite")] = None,
    wan: Annotated[list[str], typer.Option(
        help="a site's WAN profile, over its sites.yaml entry: SITE:rtt_ms=80,mbit=50,loss=0.001 (SITE: alone: a "
             "relay at no cost); kept for later `up`s, changed with `insitu wan set`")] = [],  # noqa: B006
    isolated: Annotated[bool | None, typer.Option(
        "--isolated/--one-network",
        help="root only: the control plane and each site on a network of its own (Linux network namespaces, one "
             "link per site's border; docs/operations.md); kept for later `up`s")] = None,
) -> None:
    """Start (or reuse) the local multi-site platform and wait until every part is healthy."""
    from deployments.platform.border import parse_profile

    quiet_logs()
    ports = {k: int(v) for k, v in (x.split("=", 1) for x in port)}
    try:
        profiles = dict(parse_profile(w) for w in wan)
        p = Platform(state_dir, conf, ports=ports, free_ports=free_ports, database=database, wan=profiles,
                     isolated=isolated)
        p.apply_env()
        with console.status("starting the local platform (Prefect, MLflow, S3 per site, Dask per site, workers)…"):
            res = p.up()
        p.apply_env()  # the S3 keys exist only once the endpoints' IAM issued them
    except (PlatformError, ConfigError) as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(1) from None
    console.print(f"platform up in [bold]{res['seconds']:.1f}s[/bold] "
                  f"({'started ' + ', '.join(res['started']) if res['started'] else 'everything was already running'})")
    print_store_checks(p)
    print_urls(p)


def print_store_checks(p: Platform) -> None:
    """One line per store: is what the audit logs refer to still there (``platform.consistency``)."""
    from rich.markup import escape

    from deployments.platform.site_side import check_stores

    for c in check_stores(p):
        colour = "green" if c.ok else "red"
        console.print(f"[{colour}]{escape(c.line())}[/{colour}]", soft_wrap=True)


def down(
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
    wipe: Annotated[bool, typer.Option(help="then delete the platform's data: every store's objects, Prefect's and "
                                           "MLflow's databases, the audit logs and the keys (asks first)")] = False,
    yes: Annotated[bool, typer.Option("--yes", help="with --wipe: do not ask")] = False,
) -> None:
    """Stop every process `insitu up` started (by PID). The data stays for the next `insitu up` unless --wipe."""
    quiet_logs()
    p = open_platform(state_dir, conf)
    if wipe and not p.state_file.is_file():  # checked before `down` writes its (empty) record
        err_console.print(f"[red]{p.dir} holds no platform (no {p.state_file.name}): nothing wiped[/red]")
        raise typer.Exit(1)
    stopped = p.down()
    console.print(f"stopped {len(stopped)} component(s)" + (f": {', '.join(stopped)}" if stopped else ""))
    if not wipe:
        console.print(f"the data stays in {p.dir} for the next `insitu up` (delete it: `insitu down --wipe`)")
        return
    if not yes and not typer.confirm(f"delete {p.dir} with every store's objects, the Prefect and MLflow databases, "
                                     "the audit logs and the keys? This cannot be undone", default=False):
        console.print("nothing deleted")
        raise typer.Exit(1)
    try:
        p.wipe()
    except PlatformError as e:
        err_console.print(f"[red]{e}[/red]")
        raise typer.Exit(1) from None
    console.print(f"deleted {p.dir}; the next `insitu up` starts an empty platform")


def status(state_dir: StateDir = DEFAULT_STATE, conf: ConfDir = DEFAULT_CONF) -> None:
    """Show each component of the local platform: PID, running, healthy."""
    quiet_logs()
    p = open_platform(state_dir, conf)
    if not is_up(p):  # after `down` there is nothing to show, and no UI answers at those addresses
        console.print(down_line(p))
        return
    components = p.status()
    t = Table("component", "pid", "running", "healthy")
    for name, s in components.items():
        t.add_row(name, str(s["pid"] or "-"), "yes" if s["running"] else "no",
                  "[green]yes[/green]" if s["healthy"] else "[red]no[/red]")
    console.print(t)
    print_site_health(p, components)
    net = p.network
    if net is not None:
        console.print(f"isolated: {net.network}; the control plane at {net.control_address(None)} from here; "
                      + ", ".join(f"{s} at {net.site_address(s)} (namespace {net.ns(s)})" for s in p.sites.names))
    stores = Table("store", "URL", "endpoint", "work pool")
    for s in p.sites.sites:
        where = f"{p.s3_endpoint(s.name)}{' inside ' + s.name if net else ''}"
        stores.add_row(s.name, s.storage, where if s.storage.startswith("s3://") else "-", s.work_pool)
    stores.add_row("exchange", p.sites.exchange.storage, p.s3_endpoint("exchange"), p.sites.coordinator.work_pool)
    console.print(stores)
    console.print("Put a site's own file into its store: `insitu data put FILE --site eu [--key raw/…]`; "
                  "list it: `insitu data ls --site eu`.")
    print_urls(p)


def print_site_health(p: Platform, components: dict[str, dict[str, Any]]) -> None:
    """One row per site: worker heartbeat, late runs, the last job's round times, and why it is degraded."""
    from deployments.platform.health import prefect_headers
    from deployments.platform.site_health import PrefectView, site_health

    t = Table("site", "worker heartbeat", "late runs", "last job: seconds per round", "health")
    prefect = PrefectView(p.prefect_api_url, prefect_headers(p.prefect_auth))
    try:
        for site in p.sites.sites:
            h = site_health(site.name, site.work_pool, prefect, site_probes(components, site.name, site.work_pool),
                            lambda job: read_summary(p, job))
            why = h.problems()
            health = "[green]healthy[/green]" if not why else "[red]degraded[/red]: " + "; ".join(why)
            t.add_row(site.name, h.heartbeat_line(), "?" if h.late_runs is None else str(h.late_runs),
                      h.rounds_line(), health)
    finally:
        prefect.close()
    console.print(t)


def site_probes(components: dict[str, dict[str, Any]], site: str, pool: str) -> dict[str, bool | None]:
    """The platform's probes of ``site``'s parts (None: a part this platform did not start)."""
    def probe(name: str, running_only: bool = False) -> bool | None:
        s = components.get(name)
        if s is None or s["pid"] is None:
            return None
        return bool(s["running"] if running_only else s["healthy"])

    return {"worker": probe(f"worker-{pool}", running_only=True), "store": probe(f"s3-{site}"),
            "dask": probe(f"dask-scheduler-{site}"), "audit": probe(f"audit-{site}")}


def read_summary(p: Platform, job: str) -> dict[str, Any] | None:
    """The summary of ``job`` on the exchange (as the operator reads it), None while it has none."""
    from insitu.federated.exchange import Exchange
    from insitu.federated.kinds import COORDINATOR
    from insitu.federated.paths import SUMMARY
    from insitu.storage import store_from_env

    ex = Exchange(store_from_env(p.sites.exchange, "exchange"), job, writer="operator")
    return ex.get_json(SUMMARY, writer=COORDINATOR) if ex.exists(SUMMARY, writer=COORDINATOR) else None


def down_line(p: Platform) -> str:
    """What ``status`` says of a platform that is not running."""
    return f"the platform is down (state: {p.dir}); start it with `insitu up`"


def credentials(
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
    env: Annotated[bool, typer.Option("--env", help="print shell `export` lines for the MLflow and Prefect Python "
                                                   "clients instead: eval \"$(insitu credentials --env)\"")] = False,
) -> None:
    """Show the operator's logins for the two UIs (read from the platform's owner-only state file)."""
    p = open_platform(state_dir, conf)
    if env:
        if not p.state_file.exists():  # the logins are chosen by the first `up`; before it they would be made up
            err_console.print(f"[red]no platform at {p.dir} yet[/red]: start it with `insitu up`")
            raise typer.Exit(1)
        sys.stdout.write(env_exports(p))
        return
    t = Table("UI", "url", "login")
    t.add_row("Prefect", p.prefect_ui_url, f"auth string: {p.prefect_auth}")
    t.add_row("MLflow", p.mlflow_url, f"user operator, password {p.mlflow_password('operator')} (read-only)")
    console.print(t)
    console.print("The coordinator's MLflow account (the only one that writes the registry) is held by its worker "
                  "alone and is not shown. For the Python clients: eval \"$(insitu credentials --env)\"")
    roles = p.principal_roles()
    console.print(f"Principals' keys (sign with --as NAME): {p.principals_dir}: "
                  + ", ".join(f"{n} ({', '.join(r)})" for n, r in roles.items()))


def env_exports(p: Platform) -> str:
    """``export NAME=value`` lines, shell-quoted, of the operator's client environment (``CLIENT_ENV``)."""
    env = p.operator_env()
    return "".join(f"export {name}={shlex.quote(env[name])}\n" for name in CLIENT_ENV)
