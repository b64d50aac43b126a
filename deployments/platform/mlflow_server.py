"""MLflow's authentication for the local platform: who may write the registry.

The tracking server runs its ``basic-auth`` app with workspaces on (``--enable-workspaces``): every
authenticated user may read (``default_permission = READ``), nobody may create experiments or
registered models except through a role with ``USE`` on the workspace, which only the coordinator's
service account holds. Without workspaces any user could create a new model name and own it (MANAGE:
move its aliases). Unauthenticated requests get 401; other users' writes to the coordinator's runs
and models get 403. The admin account is only the platform's (the operator's state file).
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

WORKSPACE = "default"
WRITER_ROLE = "insitu-registry-writers"


def write_auth_config(ini: Path, database_uri: str, admin_password: str) -> None:
    """The auth app's configuration (owner-only: it holds the admin password used on first start)."""
    ini.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join([
        "[mlflow]",
        "default_permission = READ",
        f"database_uri = {database_uri}",
        "admin_username = admin",
        f"admin_password = {admin_password}",
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth",
        "grant_default_workspace_access = true",
        # Password checks are scrypt/PBKDF2 (~0.35 s each on 2 cores, on every request): cache a verified
        # credential for 5 minutes (one server worker, whose own changes invalidate it at once).
        "auth_cache_ttl_seconds = 300",
        "",
    ])
    ini.write_text(text)
    ini.chmod(0o600)


def provision_users(url: str, admin_password: str, users: dict[str, str], writer: str) -> None:
    """Create ``users`` (name → password) if missing, and give ``writer`` the workspace role that creates.

    Idempotent: a restarted server keeps its users (they live in the auth database).
    """
    import httpx

    auth = ("admin", admin_password)
    with httpx.Client(base_url=url, auth=auth, timeout=30) as c:
        for name, password in users.items():
            r = c.get("/api/2.0/mlflow/users/get", params={"username": name})
            if r.status_code == 200:
                continue
            r = c.post("/api/2.0/mlflow/users/create", json={"username": name, "password": password})
            r.raise_for_status()
            log.info("created MLflow user %s", name)
        roles = c.get("/api/3.0/mlflow/roles/list", params={"workspace": WORKSPACE})
        roles.raise_for_status()
        found = [r for r in roles.json().get("roles", []) if r.get("name") == WRITER_ROLE]
        if found:
            role_id = found[0]["id"]
        else:
            r = c.post("/api/3.0/mlflow/roles/create", json={"workspace": WORKSPACE, "name": WRITER_ROLE})
            r.raise_for_status()
            role_id = r.json()["role"]["id"]
            r = c.post("/api/3.0/mlflow/roles/permissions/add", json={
                "role_id": role_id, "resource_type": "workspace", "resource_pattern": "*", "permission": "USE"})
            r.raise_for_status()
        mine = c.get("/api/3.0/mlflow/users/roles/list", params={"username": writer})
        if mine.status_code == 200 and any(r.get("id") == role_id for r in mine.json().get("roles", [])):
            return
        r = c.post("/api/3.0/mlflow/roles/assign", json={"username": writer, "role_id": role_id})
        if r.status_code >= 400 and "already" not in r.text.lower():
            r.raise_for_status()
