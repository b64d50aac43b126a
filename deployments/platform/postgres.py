"""The control plane's database: a PostgreSQL server the platform starts, with one role and database per server.

Prefect's own documentation calls SQLite a development setup (one writer at a time): with every site's worker,
every flow run and the coordinator writing at once, the API answered ``503 database is locked``. Here the
Prefect server and MLflow's backend store (and its auth app) each get their own database, owned by their own
role with its own password; ``PUBLIC`` may connect to none of them. The cluster's superuser is the platform's
(its password is in the operator's state file only). The data directory is owner-only (``initdb`` makes it
0700) and belongs to ``insitu-postgres`` when the platform runs as root: PostgreSQL refuses to run as root, and
no actor's user can read its files. The server listens on 127.0.0.1 only, with no Unix socket, and every
connection authenticates with SCRAM-SHA-256 (``initdb --auth``), local ones included.

Passwords never go on a command line (any local user can read ``/proc/<pid>/cmdline``): ``initdb`` reads the
superuser's from a file, the servers get theirs in their environment.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import subprocess
from pathlib import Path
from urllib.parse import quote

from deployments.platform.errors import PlatformError
from deployments.platform.users import Account, own

log = logging.getLogger(__name__)

SUPERUSER = "insitu"
# role → the databases it owns (MLflow's auth app keeps its users in a database of its own)
DATABASES = {"prefect": ["prefect"], "mlflow": ["mlflow", "mlflow_auth"]}


def bindir() -> Path | None:
    """The directory holding ``postgres`` and ``initdb`` (Debian keeps them off PATH, in a versioned directory)."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        r = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=30)
        if r.returncode == 0:
            candidates.append(Path(r.stdout.strip()))
    versions = glob.glob("/usr/lib/postgresql/*/bin")
    candidates += [Path(p) for p in sorted(versions, key=lambda p: int(Path(p).parent.name)
                                           if Path(p).parent.name.isdigit() else 0, reverse=True)]
    found = shutil.which("postgres")
    if found:
        candidates.append(Path(found).resolve().parent)
    for d in candidates:
        if (d / "postgres").is_file() and (d / "initdb").is_file():
            return d
    return None


def available() -> bool:
    """Can this machine run the platform's PostgreSQL (``apt-get install postgresql`` where it cannot)?"""
    return bindir() is not None


def _binary(name: str) -> str:
    d = bindir()
    if d is None:
        raise PlatformError("PostgreSQL's server is not installed (no `postgres`/`initdb`). Fix: install it "
                            "(`apt-get install postgresql`), or keep the control plane on SQLite: "
                            "`insitu up --database sqlite`")
    return str(d / name)


def init_cluster(root: Path, account: Account, superuser_password: str) -> Path:
    """Create the cluster in ``root/data`` as ``account`` unless it exists; returns the data directory."""
    data = root / "data"
    root.mkdir(parents=True, exist_ok=True)
    own(root, account, 0o700)
    if (data / "PG_VERSION").is_file():
        return data
    if data.exists() and any(data.iterdir()):
        raise PlatformError(f"{data} holds files but no PostgreSQL cluster (no PG_VERSION). Fix: move it away, "
                            "or wipe the platform's data (`insitu down --wipe`)")
    pwfile = root / "superuser.pw"
    pwfile.unlink(missing_ok=True)  # never follow what another user may have put in its place
    fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(superuser_password + "\n")
    own(pwfile, account, 0o600)
    as_user = {} if account.is_current else {"user": account.uid, "group": account.gid, "extra_groups": []}
    try:
        r = subprocess.run([_binary("initdb"), "-D", str(data), "-U", SUPERUSER, "--pwfile", str(pwfile),
                            "--auth=scram-sha-256", "--encoding=UTF8", "--no-locale", "--no-instructions"],
                           capture_output=True, text=True, timeout=300, cwd="/", **as_user,
                           env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C"})
    finally:
        pwfile.unlink(missing_ok=True)
    if r.returncode != 0:
        raise PlatformError(f"initdb of the control plane's database in {data} failed: {r.stderr.strip()[-2000:]}")
    log.info("created the control plane's PostgreSQL cluster in %s (owner %s)", data, account.name)
    return data


def server_command(data: Path, port: int) -> list[str]:
    """The postmaster, on 127.0.0.1 only and without a Unix socket (every client authenticates over TCP)."""
    return [_binary("postgres"), "-D", str(data), "-p", str(port), "-c", "listen_addresses=127.0.0.1",
            "-c", "unix_socket_directories=", "-c", "password_encryption=scram-sha-256",
            # What a statement that failed held (a password) must not reach the log.
            "-c", "log_min_error_statement=panic"]


def connect(port: int, user: str, password: str, dbname: str = "postgres", timeout: int = 3) -> object:
    import psycopg2

    return psycopg2.connect(host="127.0.0.1", port=port, user=user, password=password, dbname=dbname,
                            connect_timeout=timeout)


def healthy(port: int, superuser_password: str) -> bool:
    """Does the server accept the superuser and answer a query?"""
    try:
        conn = connect(port, SUPERUSER, superuser_password)
    except Exception:
        return False
    try:
        with conn.cursor() as cur:  # type: ignore[attr-defined]
            cur.execute("SELECT 1")
            return bool(cur.fetchone() == (1,))
    except Exception:
        return False
    finally:
        conn.close()  # type: ignore[attr-defined]


def provision(port: int, superuser_password: str, passwords: dict[str, str]) -> None:
    """Each server's role (with its password from the state file) and its own databases. Idempotent: an existing
    role gets the state file's password again, an existing database keeps its data."""
    from psycopg2 import sql

    conn = connect(port, SUPERUSER, superuser_password)
    conn.autocommit = True  # type: ignore[attr-defined]  # CREATE DATABASE runs outside a transaction
    try:
        with conn.cursor() as cur:  # type: ignore[attr-defined]
            for role, databases in DATABASES.items():
                cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
                verb = "ALTER" if cur.fetchone() else "CREATE"
                cur.execute(sql.SQL(verb + " ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD %s")
                            .format(sql.Identifier(role)), (passwords[role],))
                for db in databases:
                    cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,))
                    if not cur.fetchone():
                        cur.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(db),
                                                                                 sql.Identifier(role)))
                    cur.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(db)))
    finally:
        conn.close()  # type: ignore[attr-defined]


def url(driver: str, role: str, port: int, database: str, password: str | None = None) -> str:
    """An SQLAlchemy URL for ``role`` on the platform's server (the password left out when ``None``)."""
    who = quote(role, safe="") + (f":{quote(password, safe='')}" if password is not None else "")
    return f"{driver}://{who}@127.0.0.1:{port}/{database}"
