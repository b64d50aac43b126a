"""``insitu approve``, ``policy show|check|apply``, ``audit verify|timeline|show`` and ``iam-policies``: who may
run what, what each site admits, and the record of what happened."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from deployments.cli import signing
from deployments.cli.common import (
    DEFAULT_CONF,
    DEFAULT_PURPOSE,
    DEFAULT_STATE,
    As,
    ConfDir,
    Purpose,
    StateDir,
    console,
    is_up,
    open_platform,
)
from deployments.platform import COORDINATOR, REPO, Platform
from insitu.conf import ConfigError


def approve(
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
    training: Annotated[str, typer.Option(help="a training config: a name in conf/training/")] = "fraud",
    dataset: Annotated[str, typer.Option(help="a dataset of conf/datasets.yaml")] = "fraud",
    as_: As = None,
    purpose: Purpose = DEFAULT_PURPOSE,
    max_rounds: Annotated[int, typer.Option(help="most rounds a UI or scheduled run may ask for")] = 20,
    days: Annotated[float, typer.Option(help="how long the approval is valid")] = 30.0,
) -> None:
    """Approve a training config (signed as --as) for runs started from the Prefect UI or a schedule."""
    signing.approve(open_platform(state_dir, conf), as_, training, dataset, purpose, max_rounds, days)


def policy_show(site: str, state_dir: StateDir = DEFAULT_STATE, conf: ConfDir = DEFAULT_CONF) -> None:
    """Show a site's policy: version, signer, principals and roles, limits and Cedar rules."""
    signing.show(open_platform(state_dir, conf), site)


def policy_check(
    site: str,
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
    action: Annotated[str, typer.Option(help="prepare | train | evaluate")] = "train",
    request: Annotated[Path | None, typer.Option(help="a signed request (JSON) to check")] = None,
    as_: As = None,
    training: str = "fraud",
    dataset: str = "fraud",
    purpose: Purpose = DEFAULT_PURPOSE,
    rounds: Annotated[int | None, typer.Option(help="override the training config's rounds")] = None,
) -> None:
    """What the site's policy would decide for a request (a file, or one signed now with --as); exit 1 if denied."""
    p = open_platform(state_dir, conf)
    if not signing.check(p, site, action, request, as_, training, dataset, purpose, "policy-check",
                         {"rounds": rounds} if rounds else {}):
        raise typer.Exit(1)


def policy_apply(
    site: str,
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
    as_: As = None,
    cedar: Annotated[Path | None, typer.Option(help="new Cedar rules (default: keep the current ones)")] = None,
    principals: Annotated[Path | None, typer.Option(help="JSON {name: {public_key, roles}} (default: keep)")] = None,
    min_rows: Annotated[int | None, typer.Option(help="minimum rows per published aggregate")] = None,
    limit: Annotated[list[str] | None, typer.Option(help="a shard limit NAME=VALUE, e.g. max_line_bytes=65536 "
                                                   "(repeat; default: keep; see docs/configuration.md)")] = None,
) -> None:
    """Sign a new version of the site's policy as one of its site admins and install it at the site."""
    try:
        limits = {k.strip(): int(v) for k, v in (item.split("=", 1) for item in limit or [])}
    except ValueError:
        raise typer.BadParameter(f"--limit takes NAME=INTEGER, got {limit}") from None
    signing.apply(open_platform(state_dir, conf), site, as_, cedar, principals, min_rows, limits)


def iam_policies(
    conf: ConfDir = DEFAULT_CONF,
    out: Annotated[Path, typer.Option(help="directory to write the policy documents into")] = REPO / "docs" / "iam",
) -> None:
    """Write the IAM policies that make S3 enforce residency (the same ones the local platform enforces)."""
    from insitu.conf import load_sites
    from insitu.governance.iam import policy_documents, render

    try:
        sites = load_sites(conf / "sites.yaml")
    except ConfigError as e:
        console.print(f"[red]configuration error[/red]\n{e}")
        raise typer.Exit(2) from None
    docs = policy_documents(bucket_of(sites.exchange.storage), {s.name: bucket_of(s.storage) for s in sites.sites})
    out.mkdir(parents=True, exist_ok=True)
    for name, policy in docs.items():
        (out / name).write_text(render(policy))
    console.print(f"wrote {len(docs)} policies to {out}: {', '.join(sorted(docs))}")


def bucket_of(storage: str) -> str:
    if not storage.startswith("s3://"):
        raise typer.BadParameter(f"{storage} is not an s3:// URL; IAM policies apply to S3 buckets")
    return storage.split("://", 1)[1].split("/", 1)[0]


def audit_verify(
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
    actor: Annotated[list[str], typer.Option(help="site name or 'coordinator'; default: all")] = [],  # noqa: B006
    skip_anchors: Annotated[bool, typer.Option(help="verify without the exchange's anchors (it is not running); "
                                                    "only the coordinator's countersignatures are checked")] = False,
) -> None:
    """Verify every deployed actor's log (hash chain, HMACs, head) against the anchors recorded outside it.

    Fails when a log is missing, altered, cut short, rolled back with its head, or re-signed.
    """
    from rich.markup import escape

    from insitu.governance.anchors import Found, list_anchors
    from insitu.governance.trail import verify_trail
    from insitu.storage import store_from_env

    p = open_platform(state_dir, conf)
    actors = actor or p.actors
    if COORDINATOR not in actors:  # its countersignatures vouch for the sites' anchors
        actors = [COORDINATOR, *actors]
    if skip_anchors:
        stored = Found()
        console.print("[yellow]the exchange's anchors are NOT checked (--skip-anchors)[/yellow]")
    elif not is_up(p):
        console.print("[red]the platform is not running, so the anchors on the exchange cannot be read[/red]: "
                      "start it (`insitu up`), or pass --skip-anchors to check without them")
        raise typer.Exit(1)
    else:
        stored = list_anchors(store_from_env(p.sites.exchange, "exchange"), p.audit_service_keys())
    results = verify_trail({a: (p.audit_log(a), p.audit_key(a)) for a in actors}, stored)
    t = Table("actor", "log", "lines", "anchors", "result")
    for r in results:
        t.add_row(r.actor, str(r.path), str(r.lines), str(r.anchors),
                  "[green]ok[/green] " + r.reason if r.ok else f"[red]BROKEN[/red] {r.reason}")
    console.print(t)
    for r in results:
        for n in r.noise:  # objects nobody's audit service signed: they prove nothing either way
            console.print(f"[yellow]noise[/yellow] {r.actor}: {escape(str(n))}", soft_wrap=True)
    if not all(r.ok for r in results):
        _alert_broken(p, [r for r in results if not r.ok])
        raise typer.Exit(1)


def _alert_broken(p: Platform, broken: list[Any]) -> None:
    """Tell whoever ``conf/alerts.yaml`` names (``insitu.alert.audit-verification-failed``, one per actor)."""
    if not is_up(p):
        return
    from deployments.alerts import emit_alert

    try:
        for r in broken:
            emit_alert("audit-verification-failed", "audit", r.actor, "audit",
                       f"{r.actor}'s audit log {r.path} does not verify: {r.reason}")
    except Exception as e:  # the verdict stands (exit 1); the alert is best effort
        console.print(f"[yellow]could not emit the alert: {e}[/yellow]")


def audit_timeline(
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
    job: Annotated[str | None, typer.Option(help="only this job's records")] = None,
    dataset: Annotated[str | None, typer.Option(help="only this dataset's records")] = None,
    principal: Annotated[str | None, typer.Option(help="only records of this principal")] = None,
    fmt: Annotated[str, typer.Option("--format", help="jsonl | csv")] = "jsonl",
    out: Annotated[Path | None, typer.Option(help="write here instead of standard output")] = None,
) -> None:
    """Every actor's audit records merged into one time-ordered view (verify first: this reads, it does not check)."""
    from insitu.governance.trail import timeline, to_csv, to_jsonl

    if fmt not in ("jsonl", "csv"):
        raise typer.BadParameter("--format must be jsonl or csv")
    p = open_platform(state_dir, conf)
    rows = timeline({a: p.audit_log(a) for a in p.actors}, job=job, dataset=dataset, principal=principal)
    text = to_jsonl(rows) if fmt == "jsonl" else to_csv(rows)
    if out:
        out.write_text(text)
        console.print(f"{len(rows)} records written to {out}")
    else:
        sys.stdout.write(text)


def audit_show(
    actor: str, state_dir: StateDir = DEFAULT_STATE, conf: ConfDir = DEFAULT_CONF, last: int = 20
) -> None:
    """Print the last entries of one audit log as JSON lines."""
    from insitu.governance.audit import read_events

    p = open_platform(state_dir, conf)
    for e in read_events(p.audit_log(actor))[-last:]:
        console.print_json(json.dumps(e))
