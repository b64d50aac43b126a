"""``insitu``: the operator's command line (local platform, seeding, deploying, running, audit).

It sits with the deployments, outside the core: it composes the core (`insitu/`) with the Prefect layer.
Prefect is imported inside the commands that talk to it, so `insitu up` / `down` start quickly.

One module per command group, this one assembles them into ``app``:

- ``platform``: up, down, status, credentials
- ``data``: seed, data put|ls (the stores themselves: ``site_store``)
- ``jobs``: deploy, run, demo, validate (their work: ``job_run`` with ``progress``, ``summary``, ``conf_check``)
- ``governance``: approve, policy show|check|apply, audit verify|timeline|show, iam-policies (signing: ``signing``)
- ``common``: the console, the shared options, opening the platform
"""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console

from deployments.cli import data, governance, jobs, platform, site, wan
from deployments.cli.common import console
from deployments.cli.conf_check import check_schedule
from deployments.cli.governance import audit_timeline, audit_verify
from deployments.cli.jobs import validate

app = typer.Typer(help="insitu: train models where the data lives.", no_args_is_help=True, add_completion=False)
for command in (platform.up, platform.credentials, platform.down, platform.status, data.seed, jobs.deploy, jobs.run):
    app.command()(command)
app.command("approve")(governance.approve)

policy_app = typer.Typer(help="A site's own policy: show it, check a request against it, apply a new one.",
                         no_args_is_help=True)
policy_app.command("show")(governance.policy_show)
policy_app.command("check")(governance.policy_check)
policy_app.command("apply")(governance.policy_apply)

app.command()(jobs.demo)
app.command("iam-policies")(governance.iam_policies)

audit_app = typer.Typer(help="Audit logs: verify the tamper-evident chains.", no_args_is_help=True)
audit_app.command("verify")(governance.audit_verify)
audit_app.command("timeline")(governance.audit_timeline)
audit_app.command("show")(governance.audit_show)

data_app = typer.Typer(help="A site's own store: put a file into it, list what it holds.", no_args_is_help=True)
data_app.command("put")(data.data_put)
data_app.command("ls")(data.data_ls)

wan_app = typer.Typer(help="Each site's WAN border on the local platform: show, set, cut, restore.",
                      no_args_is_help=True)
wan_app.command("show")(wan.wan_show)
wan_app.command("set")(wan.wan_set)
wan_app.command("cut")(wan.wan_cut)
wan_app.command("restore")(wan.wan_restore)

app.command()(jobs.validate)
app.add_typer(audit_app, name="audit")
app.add_typer(policy_app, name="policy")
app.add_typer(data_app, name="data")
app.add_typer(wan_app, name="wan")
site_app = typer.Typer(help="One region, started by its own admin from its own files: up, down, status.",
                       no_args_is_help=True)
site_app.command("up")(site.site_up)
site_app.command("down")(site.site_down)
site_app.command("status")(site.site_status)
app.add_typer(site_app, name="site")


def main() -> None:  # pragma: no cover (run as a process by the tests)
    """The ``insitu`` command: errors arrive as one clear line; ``--debug`` (anywhere) shows the traceback."""
    import click

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    debug = "--debug" in sys.argv[1:] or os.environ.get("INSITU_DEBUG") == "1"
    if "--debug" in sys.argv[1:]:
        sys.argv.remove("--debug")
    try:
        # Not standalone: click hands back a command's typer.Exit code (as the return value) and raises the rest.
        rc = app(standalone_mode=False)
        sys.exit(rc if isinstance(rc, int) else 0)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except Exception as e:
        if debug:
            raise
        Console(stderr=True).print(f"[red]error:[/red] {type(e).__name__}: {e}  [dim](--debug for the trace)[/dim]",
                                   soft_wrap=True)
        sys.exit(1)


__all__ = ["app", "audit_timeline", "audit_verify", "check_schedule", "console", "main", "validate"]
