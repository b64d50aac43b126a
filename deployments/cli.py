"""``insitu``: the operator's command line (local platform, seeding, deploying, running, audit).

It sits with the deployments, outside the core: it composes the core (`insitu/`) with the Prefect layer.
Prefect is imported inside the commands that talk to it, so `insitu up` / `down` start quickly.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from deployments import cli_data as data
from deployments import cli_governance as governance
from deployments.platform import COORDINATOR, REPO, Platform, PlatformError
from insitu.conf import ConfigError, ScheduleConfig, load_conf, load_datasets, trusted_training
from insitu.job import ModelDoesNotFit, load_job

app = typer.Typer(help="insitu: train models where the data lives.", no_args_is_help=True, add_completion=False)
audit_app = typer.Typer(help="Audit logs: verify the tamper-evident chains.", no_args_is_help=True)
app.add_typer(audit_app, name="audit")
app.add_typer(governance.policy_app, name="policy")
app.add_typer(data.data_app, name="data")
# Wide enough for the summary table when output is not a terminal (CI logs, `make demo | tee`).
console = Console(width=None if sys.stdout.isatty() else 160)

StateDir = Annotated[Path, typer.Option("--state-dir", envvar="INSITU_HOME", help="platform state directory")]
ConfDir = Annotated[Path, typer.Option("--conf", envvar="INSITU_CONF", help="configuration directory")]
DEFAULT_STATE = REPO / ".insitu"
DEFAULT_CONF = REPO / "conf"


def _quiet_logs() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for name in ("httpx", "prefect", "distributed", "botocore", "s3fs", "aiobotocore"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _platform(state_dir: Path, conf: Path) -> Platform:
    try:
        p = Platform(state_dir, conf)
        # Before anything imports Prefect: its settings are read from this environment.
        p.apply_env()
        return p
    except ConfigError as e:
        console.print(f"[red]configuration error[/red]\n{e}")
        raise typer.Exit(2) from None


def _require_up(p: Platform) -> None:
    if not p.state.get("pids"):
        console.print(f"[red]the platform is not running[/red] (state: {p.dir}); start it with `insitu up`")
        raise typer.Exit(1)
    p.apply_env()


@app.command()
def up(
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
    free_ports: Annotated[bool, typer.Option(help="pick free ports instead of the defaults")] = False,
    port: Annotated[list[str], typer.Option(help="override a port: NAME=PORT (e.g. prefect=4300)")] = [],  # noqa: B006
) -> None:
    """Start (or reuse) the local multi-site platform and wait until every part is healthy."""
    _quiet_logs()
    ports = {k: int(v) for k, v in (x.split("=", 1) for x in port)}
    try:
        p = Platform(state_dir, conf, ports=ports, free_ports=free_ports)
        p.apply_env()
        with console.status("starting the local platform (Prefect, MLflow, S3 per site, Dask per site, workers)…"):
            res = p.up()
        p.apply_env()  # the S3 keys exist only once the endpoints' IAM issued them
    except (PlatformError, ConfigError) as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(1) from None
    console.print(f"platform up in [bold]{res['seconds']:.1f}s[/bold] "
                  f"({'started ' + ', '.join(res['started']) if res['started'] else 'everything was already running'})")
    _print_urls(p)


def _print_urls(p: Platform) -> None:
    console.print(f"Prefect UI: [link]{p.prefect_ui_url}[/link]   MLflow UI: [link]{p.mlflow_url}[/link]   "
                  f"state: {p.dir}   (both ask for a login: `insitu credentials`)")


@app.command()
def credentials(state_dir: StateDir = DEFAULT_STATE, conf: ConfDir = DEFAULT_CONF) -> None:
    """Show the operator's logins for the two UIs (read from the platform's owner-only state file)."""
    p = _platform(state_dir, conf)
    t = Table("UI", "url", "login")
    t.add_row("Prefect", p.prefect_ui_url, f"auth string: {p.prefect_auth}")
    t.add_row("MLflow", p.mlflow_url, f"user operator, password {p.mlflow_password('operator')} (read-only)")
    console.print(t)
    console.print("The coordinator's MLflow account (the only one that writes the registry) is held by its worker "
                  "alone and is not shown.")
    roles = p.principal_roles()
    console.print(f"Principals' keys (sign with --as NAME): {p.principals_dir}: "
                  + ", ".join(f"{n} ({', '.join(r)})" for n, r in roles.items()))


@app.command()
def down(state_dir: StateDir = DEFAULT_STATE, conf: ConfDir = DEFAULT_CONF) -> None:
    """Stop every process `insitu up` started (by PID)."""
    _quiet_logs()
    p = _platform(state_dir, conf)
    stopped = p.down()
    console.print(f"stopped {len(stopped)} component(s)" + (f": {', '.join(stopped)}" if stopped else ""))


@app.command()
def status(state_dir: StateDir = DEFAULT_STATE, conf: ConfDir = DEFAULT_CONF) -> None:
    """Show each component of the local platform: PID, running, healthy."""
    _quiet_logs()
    p = _platform(state_dir, conf)
    t = Table("component", "pid", "running", "healthy")
    for name, s in p.status().items():
        t.add_row(name, str(s["pid"] or "-"), "yes" if s["running"] else "no",
                  "[green]yes[/green]" if s["healthy"] else "[red]no[/red]")
    console.print(t)
    stores = Table("store", "URL", "endpoint", "work pool")
    for s in p.sites.sites:
        stores.add_row(s.name, s.storage, p.s3_endpoint(s.name) if s.storage.startswith("s3://") else "-", s.work_pool)
    stores.add_row("exchange", p.sites.exchange.storage, p.s3_endpoint("exchange"), p.sites.coordinator.work_pool)
    console.print(stores)
    console.print("Put a site's own file into its store: `insitu data put FILE --site eu [--key raw/…]`; "
                  "list it: `insitu data ls --site eu`.")
    _print_urls(p)


@app.command()
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
) -> None:
    """Write an example dataset into each site's own store: `fraud` (synthetic, non-IID card transactions, with
    malformed rows and an unreadable shard on purpose), `digits` (handwritten digits, each site holding mostly
    its own digits) or `card_sequences` (each card's last 8 transactions per row, for a sequence model). For your
    own data use `insitu data put`."""
    _quiet_logs()
    from insitu.data.seed import seed as do_seed
    from insitu.data.seed import seeder_for

    # Before the platform is asked for: a dataset with no example data fails at once, pointing at `data put`.
    seeder_for(dataset)
    p = _platform(state_dir, conf)
    _require_up(p)
    # The pair must load together, so that what is seeded can be trained on as configured.
    c = load_conf(training or dataset, dataset, directory=conf)
    out = do_seed(c, rows, random_seed, None if corrupt_shard == "none" else corrupt_shard)
    t = Table("shard", "site", "rows", "malformed rows", "unreadable")
    for sid, v in out.items():
        t.add_row(sid, v["site"], str(v["rows"]), str(v["malformed"]), "yes" if v["unreadable"] else "")
    console.print(t)


@app.command()
def deploy(state_dir: StateDir = DEFAULT_STATE, conf: ConfDir = DEFAULT_CONF) -> None:
    """Register retrain on the coordinator pool (with the schedules of datasets.yaml) and the site flows on every
    site's pool."""
    _quiet_logs()
    p = _platform(state_dir, conf)
    _require_up(p)
    from deployments.deploy import deploy_all

    datasets = load_datasets(p.conf_dir / "datasets.yaml")
    with console.status("registering deployments…"):
        names = deploy_all(p.sites, datasets)
    console.print(f"deployed {len(names)}: {', '.join(names)}")
    for name, ds in datasets.datasets.items():
        for s in ds.schedules:
            state = "" if s.active else " (paused)"
            # A scheduled run has nobody to sign it: without a standing approval of the pair it fails at once.
            console.print(f"schedule: training {s.training} on dataset {name}, '{s.cron}' {s.timezone}{state}; "
                          f"runs under `insitu approve --training {s.training} --dataset {name}`")


@app.command()
def run(
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
    training: Annotated[str, typer.Option(help="a training config: a name in conf/training/")] = "fraud",
    dataset: Annotated[str, typer.Option(help="a dataset of conf/datasets.yaml")] = "fraud",
    rounds: Annotated[int | None, typer.Option(help="override the training config's rounds")] = None,
    job_id: Annotated[str | None, typer.Option(help="job id (reuse one to resume)")] = None,
    as_: governance.As = None,
    purpose: governance.Purpose = "fraud-detection",
) -> None:
    """Sign a job request as a principal, trigger `retrain` through the Prefect API, follow it, print the summary.

    Without --as (and without $INSITU_PRINCIPAL_KEY) the job runs under the training's standing approval.
    """
    _quiet_logs()
    p = _platform(state_dir, conf)
    _require_up(p)
    summary = _run_and_follow(p, training, dataset, rounds, job_id, as_, purpose)
    _print_summary(summary)
    _print_urls(p)


@app.command("approve")
def approve_cmd(
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
    training: Annotated[str, typer.Option(help="a training config: a name in conf/training/")] = "fraud",
    dataset: Annotated[str, typer.Option(help="a dataset of conf/datasets.yaml")] = "fraud",
    as_: governance.As = None,
    purpose: governance.Purpose = "fraud-detection",
    max_rounds: Annotated[int, typer.Option(help="most rounds a UI or scheduled run may ask for")] = 20,
    days: Annotated[float, typer.Option(help="how long the approval is valid")] = 30.0,
) -> None:
    """Approve a training config (signed as --as) for runs started from the Prefect UI or a schedule."""
    p = _platform(state_dir, conf)
    governance.approve(p, as_, training, dataset, purpose, max_rounds, days)


@governance.policy_app.command("show")
def policy_show(site: str, state_dir: StateDir = DEFAULT_STATE, conf: ConfDir = DEFAULT_CONF) -> None:
    """Show a site's policy: version, signer, principals and roles, limits and Cedar rules."""
    governance.show(_platform(state_dir, conf), site)


@governance.policy_app.command("check")
def policy_check(
    site: str,
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
    action: Annotated[str, typer.Option(help="prepare | train | evaluate")] = "train",
    request: Annotated[Path | None, typer.Option(help="a signed request (JSON) to check")] = None,
    as_: governance.As = None,
    training: str = "fraud",
    dataset: str = "fraud",
    purpose: governance.Purpose = "fraud-detection",
    rounds: Annotated[int | None, typer.Option(help="override the training config's rounds")] = None,
) -> None:
    """What the site's policy would decide for a request (a file, or one signed now with --as); exit 1 if denied."""
    p = _platform(state_dir, conf)
    if not governance.check(p, site, action, request, as_, training, dataset, purpose, "policy-check",
                            {"rounds": rounds} if rounds else {}):
        raise typer.Exit(1)


@governance.policy_app.command("apply")
def policy_apply(
    site: str,
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
    as_: governance.As = None,
    cedar: Annotated[Path | None, typer.Option(help="new Cedar rules (default: keep the current ones)")] = None,
    principals: Annotated[Path | None, typer.Option(help="JSON {name: {public_key, roles}} (default: keep)")] = None,
    min_rows: Annotated[int | None, typer.Option(help="minimum rows per published aggregate")] = None,
) -> None:
    """Sign a new version of the site's policy as one of its site admins and install it at the site."""
    governance.apply(_platform(state_dir, conf), site, as_, cedar, principals, min_rows)


def _run_and_follow(p: Platform, training: str, dataset: str, rounds: int | None, job_id: str | None,
                    as_: str | None, purpose: str) -> dict[str, Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.deployments import run_deployment

    from insitu.federated.exchange import Exchange
    from insitu.federated.kinds import COORDINATOR
    from insitu.federated.paths import MANIFEST_SUFFIX, SUMMARY, Kind
    from insitu.governance.principals import ENV_PRINCIPAL_KEY
    from insitu.storage import store_from_env

    c = load_job(training, dataset, directory=p.conf_dir, overrides={"rounds": rounds} if rounds else None)
    c.check_model()  # a misspelt model path fails here, naming file and key, before anything is signed
    job_id = job_id or f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
    params: dict[str, Any] = {"training": training, "dataset": dataset, "job_id": job_id}
    if rounds:
        params["rounds"] = rounds
    if as_ or os.environ.get(ENV_PRINCIPAL_KEY):
        signed = governance.sign_job(p, as_, training, dataset, purpose, job_id=job_id,
                                     overrides={"rounds": rounds} if rounds else None)
        params["request"] = signed.model_dump(mode="json")
        console.print(f"signed the job request as {signed.request.principal} (purpose {purpose!r})")
    fr = run_deployment("retrain/coordinator", parameters={"params": params}, timeout=0)
    console.print(f"triggered retrain as flow run {fr.id} (job {job_id}): "
                  f"{p.prefect_ui_url}/runs/flow-run/{fr.id}")
    ex = Exchange(store_from_env(c.sites.exchange, "exchange"), job_id, writer="operator")
    n_sites = len({s.site for s in c.dataset.shards})
    total = 2 * n_sites + c.training.rounds + 1
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
                  "{task.total}"), TimeElapsedColumn(), console=console) as prog:
        task = prog.add_task("retrain: starting", total=total)
        with get_client(sync_client=True) as client:
            while True:
                run = client.read_flow_run(fr.id)
                kids = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=job_id)))
                done_prep = sum(1 for k in kids if k.name.startswith("site-prepare") and k.state_name == "Completed")
                done_eval = sum(1 for k in kids if k.name.startswith("site-evaluate") and k.state_name == "Completed")
                rounds_done = max(0, len([x for x in ex.list(Kind.WEIGHTS, COORDINATOR) if x.endswith(MANIFEST_SUFFIX)])
                                  - 1)
                registered = ex.exists(SUMMARY, writer=COORDINATOR)
                phase = ("register" if done_eval == n_sites else "evaluate" if rounds_done >= c.training.rounds
                         else f"round {rounds_done + 1}/{c.training.rounds}" if done_prep == n_sites else "prepare")
                prog.update(task, completed=done_prep + rounds_done + done_eval + int(registered),
                            description=f"retrain [{run.state_name}]: {phase}")
                if run.state and run.state.is_final():
                    break
                time.sleep(2)
    if not (run.state and run.state.is_completed()):
        console.print(f"[red]retrain {run.state_name}[/red]: {run.state.message if run.state else ''}")
        console.print(f"logs: {p.prefect_ui_url}/runs/flow-run/{fr.id}")
        raise typer.Exit(1)
    return ex.get_json(SUMMARY, writer=COORDINATOR)


def _print_summary(s: dict[str, Any]) -> None:
    from insitu.summary import identity_lines, summary_columns, summary_rows, withheld_line

    t = Table(title=f"insitu job {s['job_id']} — {s['rounds']} federated rounds", show_lines=False)
    for col in summary_columns(s):
        t.add_column(col, justify="left" if col in ("site", "unreadable shards") else "right")
    for row in summary_rows(s):
        t.add_row(*row)
    console.print(t)
    m = s["model"]
    console.print(f"registered [bold]{m['model_name']}[/bold] version [bold]{m['version']}[/bold] "
                  f"with alias [bold]{m['alias']}[/bold] (MLflow run {m['run_id']})")
    if "selected_round" in s:
        early = " (stopped early)" if s.get("stopped_early") else ""
        console.print(f"it is global model {s['selected_round']} of {s['rounds']}{early}: {s.get('selection', '')}")
    gate = m.get("gate", {})
    if gate:
        console.print(f"gate {'[green]passed[/green]' if gate['passed'] else '[yellow]failed[/yellow]'}: "
                      f"{gate['reason']} (champion: v{gate['champion']})")
    for line in identity_lines(s):
        console.print(f"ran as — {line}")
    if (line := withheld_line(s)) is not None:
        console.print(line)
    console.print(f"bytes that crossed a border: {s['bytes_crossed']:,} (model weights, updates, aggregate "
                  f"statistics, metrics); raw data that stayed in its region: {s['raw_bytes']:,} bytes; rows moved: 0")


@app.command()
def demo(
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
    rows: Annotated[int, typer.Option(help="rows per site")] = 20000,
    rounds: Annotated[int | None, typer.Option(help="override the training config's rounds")] = None,
) -> None:
    """The main job on the local platform: up, seed, deploy, retrain, summary. Leaves the platform up."""
    t0 = time.monotonic()
    up(state_dir, conf)
    seed(state_dir, conf, rows=rows)
    deploy(state_dir, conf)
    # The demo's data scientist approves the nightly schedule and UI runs, then signs this job herself.
    governance.approve(_platform(state_dir, conf), "alice", "fraud", "fraud", "fraud-detection", 20, 30.0)
    run(state_dir, conf, rounds=rounds, as_="alice")
    console.print(f"demo finished in {time.monotonic() - t0:.0f}s. The platform is still running so you can "
                  "explore both UIs; stop it with [bold]`.venv/bin/insitu down`[/bold].")


@app.command("iam-policies")
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
    bucket = _bucket_of
    docs = policy_documents(bucket(sites.exchange.storage), {s.name: bucket(s.storage) for s in sites.sites})
    out.mkdir(parents=True, exist_ok=True)
    for name, policy in docs.items():
        (out / name).write_text(render(policy))
    console.print(f"wrote {len(docs)} policies to {out}: {', '.join(sorted(docs))}")


def _bucket_of(storage: str) -> str:
    if not storage.startswith("s3://"):
        raise typer.BadParameter(f"{storage} is not an s3:// URL; IAM policies apply to S3 buckets")
    return storage.split("://", 1)[1].split("/", 1)[0]


@audit_app.command("verify")
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
    from insitu.governance.anchors import list_anchors
    from insitu.governance.trail import verify_trail
    from insitu.storage import store_from_env

    p = _platform(state_dir, conf)
    actors = actor or p.actors
    if COORDINATOR not in actors:  # its countersignatures vouch for the sites' anchors
        actors = [COORDINATOR, *actors]
    if skip_anchors:
        stored = []
        console.print("[yellow]the exchange's anchors are NOT checked (--skip-anchors)[/yellow]")
    elif not p.state.get("pids"):
        console.print("[red]the platform is not running, so the anchors on the exchange cannot be read[/red]: "
                      "start it (`insitu up`), or pass --skip-anchors to check without them")
        raise typer.Exit(1)
    else:
        stored = list_anchors(store_from_env(p.sites.exchange, "exchange"))
    results = verify_trail({a: (p.audit_log(a), p.audit_key(a)) for a in actors}, stored)
    t = Table("actor", "log", "lines", "anchors", "result")
    for r in results:
        t.add_row(r.actor, str(r.path), str(r.lines), str(r.anchors),
                  "[green]ok[/green] " + r.reason if r.ok else f"[red]BROKEN[/red] {r.reason}")
    console.print(t)
    if not all(r.ok for r in results):
        raise typer.Exit(1)


@audit_app.command("timeline")
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
    p = _platform(state_dir, conf)
    rows = timeline({a: p.audit_log(a) for a in p.actors}, job=job, dataset=dataset, principal=principal)
    text = to_jsonl(rows) if fmt == "jsonl" else to_csv(rows)
    if out:
        out.write_text(text)
        console.print(f"{len(rows)} records written to {out}")
    else:
        sys.stdout.write(text)


@audit_app.command("show")
def audit_show(
    actor: str, state_dir: StateDir = DEFAULT_STATE, conf: ConfDir = DEFAULT_CONF, last: int = 20
) -> None:
    """Print the last entries of one audit log as JSON lines."""
    from insitu.governance.audit import read_events

    p = _platform(state_dir, conf)
    for e in read_events(p.audit_log(actor))[-last:]:
        console.print_json(json.dumps(e))


@data.data_app.command("put")
def data_put(
    file: Path,
    site: Annotated[str, typer.Option(help="the site whose store receives the file")],
    key: Annotated[str | None, typer.Option(help="where in the store (default raw/<file name>)")] = None,
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
) -> None:
    """Put a file into a site's own store (with that site's keys); it never leaves the site."""
    p = _platform(state_dir, conf)
    data.check_site(p, site)
    data.check_key(key or f"raw/{file.name}")
    _require_up(p)
    console.print(f"{file} → {data.put(p, site, file, key)}")


@data.data_app.command("ls")
def data_ls(
    site: Annotated[str, typer.Option(help="the site whose store to list")],
    prefix: Annotated[str, typer.Option(help="only keys under this prefix")] = "",
    state_dir: StateDir = DEFAULT_STATE,
    conf: ConfDir = DEFAULT_CONF,
) -> None:
    """List a site's store: keys and sizes."""
    p = _platform(state_dir, conf)
    data.check_site(p, site)
    _require_up(p)
    data.print_ls(site, data.ls(p, site, prefix))


def _task_fits(conf: Path, dataset: str, training: Any) -> bool:
    """Whether the training's task fits the dataset's label type (True when the dataset cannot be read: its
    own row says why, and the pair's check then names the problem too)."""
    from insitu.specs import TASKS

    try:
        schema = load_datasets(conf / "datasets.yaml", only=dataset).datasets[dataset].schema_
    except (ConfigError, OSError, KeyError):
        return True
    task = TASKS.get(training.task.name)  # an unknown name: the pair's check names it
    return task is None or schema.columns[schema.label].type in task.label_types


@app.command()
def validate(conf: ConfDir = DEFAULT_CONF) -> None:
    """Check every file of conf/ offline: sites.yaml, datasets.yaml, each training config with each dataset, and
    each schedule (its training exists and loads with its dataset; Prefect accepts its cron)."""
    import yaml

    from insitu.conf import load_sites, load_training

    problems = 0
    t = Table("file", "result")

    def check(name: str, fn: Any) -> Any:
        nonlocal problems
        try:
            out = fn()
            t.add_row(name, "[green]ok[/green]")
            return out
        except ModelDoesNotFit as e:  # a pair no one runs (a sequence model on a flat dataset): not a mistake
            t.add_row(name, f"[dim]not checked: the model does not fit this dataset's features: {e}[/dim]")
            return None
        except (ConfigError, OSError) as e:
            problems += 1
            t.add_row(name, f"[red]{e}[/red]")
            return None

    check("sites.yaml", lambda: load_sites(conf / "sites.yaml"))
    check("datasets.yaml", lambda: load_datasets(conf / "datasets.yaml"))
    try:  # each dataset on its own too: a broken entry blocks only the jobs that name it
        names = sorted((yaml.safe_load((conf / "datasets.yaml").read_text()) or {}).get("datasets") or {})
    except (OSError, yaml.YAMLError, AttributeError):
        names = []
    for path in sorted((conf / "training").glob("*.yaml")):
        training = check(f"training/{path.name}", lambda p=path: load_training(p))
        if training:
            for name in names:
                if not _task_fits(conf, name, training):  # e.g. a multi-class config and a binary label
                    t.add_row(f"training/{path.name} with dataset {name}",
                              f"[dim]not checked: task {training.task.name} does not fit this dataset's label[/dim]")
                    continue
                check(f"training/{path.name} with dataset {name}",
                      lambda p=path, n=name: load_job(p.stem, n, directory=conf).check_model())
    for name in names:
        try:
            schedules = load_datasets(conf / "datasets.yaml", only=name).datasets[name].schedules
        except (ConfigError, OSError, KeyError):
            continue  # its row above already says what is wrong with this dataset
        for i, s in enumerate(schedules):
            check(f"datasets.yaml schedule {name}[{i}]: training {s.training}, '{s.cron}' {s.timezone}",
                  lambda n=name, i=i, s=s: check_schedule(conf, n, i, s))
    console.print(t)
    if problems:
        console.print(f"[red]{problems} problem(s)[/red]")
        raise typer.Exit(1)


def check_schedule(conf: Path, dataset: str, index: int, schedule: ScheduleConfig) -> None:
    """One schedule of ``datasets.yaml``: its training is a config of ``conf/training/`` that loads with
    ``dataset``, and Prefect accepts its cron (what ``insitu deploy`` will ask of it).

    Raises
    ------
    ConfigError
        Naming the file, the schedule's key and the fix.
    """
    where = f"{conf / 'datasets.yaml'}: key 'datasets.{dataset}.schedules[{index}]"
    try:
        trusted_training(schedule.training, conf)
    except ConfigError as e:
        raise ConfigError(f"{where}.training': {e}") from None
    try:
        load_job(schedule.training, dataset, directory=conf)
    except ConfigError as e:
        raise ConfigError(f"{where}.training': training {schedule.training!r} does not load with dataset "
                          f"{dataset!r}; fix that config or name another: {e}") from None
    from deployments.deploy import retrain_schedule  # imports Prefect: only when a schedule is declared

    try:
        retrain_schedule(dataset, schedule)
    except ValueError as e:
        raise ConfigError(f"{where}.cron': Prefect refuses it: {e}; see `man 5 crontab` for the five "
                          "fields") from None


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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
