"""Where a site's ranks meet: a ``torch.distributed.FileStore`` in a directory only the site's OS user can enter.

``torch.distributed``'s TCPStore has no authentication: any local user who finds its port (``/proc/net/tcp`` is
world-readable) can connect, read and write keys, and so inject into or break a site's process group. A
FileStore has no socket at all; its file lies in a fresh directory of mode 0700 owned by the site's runtime
user, so the kernel keeps every other user out. It works with gloo and nccl alike.

The price: every rank must see that directory. All of a site's ranks on one host (the local platform) always
do; ranks on several hosts need ``INSITU_RENDEZVOUS_DIR`` on a filesystem they share (NFS, a shared volume),
readable only by the site's user. The launcher checks that every rank sees the directory before it starts
any rank and refuses clearly otherwise; there is no TCP fallback, because it could not be authenticated.

What is left on TCP: gloo (and nccl) open their own peer-to-peer sockets once the ranks have met. Their
addresses are exchanged through the store, so an outsider does not learn them from it, but they are still
listening sockets on the host (see docs/security.md, "Known limits").
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

RENDEZVOUS_DIR_ENV = "INSITU_RENDEZVOUS_DIR"
STORE_FILE = "store"
TOKEN_FILE = "token"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


class RendezvousError(RuntimeError):
    """The ranks cannot meet privately (the message says why and what to do)."""


def check_private(path: Path) -> None:
    """``path`` must be a real directory (no symlink), owned by this process's user, with no access for others.

    Raises
    ------
    RendezvousError
        With the fix, when it is not.
    """
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise RendezvousError(f"rendezvous directory {path} is not a directory (a symlink or a file)")
    if st.st_uid != os.geteuid():
        raise RendezvousError(f"rendezvous directory {path} belongs to uid {st.st_uid}, not to this site's user "
                              f"(uid {os.geteuid()}): another user could read or write its store")
    if st.st_mode & 0o077:
        raise RendezvousError(f"rendezvous directory {path} has mode {stat.S_IMODE(st.st_mode):o}: other users "
                              f"could reach its store; it must be 0700 (chmod 700 {path})")


def base_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where rendezvous directories are made: ``INSITU_RENDEZVOUS_DIR`` or the system's temporary folder."""
    env = os.environ if env is None else env
    return Path(env.get(RENDEZVOUS_DIR_ENV) or tempfile.gettempdir())


def make_rendezvous() -> tuple[str, str]:
    """A fresh private directory holding a random token: ``(directory, token)``. Runs on rank 0's worker.

    ``mkdtemp`` creates the directory with mode 0700 under a name nobody can guess in advance; it is checked
    anyway (a base directory on a filesystem that ignores modes would be refused here).
    """
    path = Path(tempfile.mkdtemp(prefix="insitu-rdzv-", dir=base_dir()))
    try:
        check_private(path)
        token = secrets.token_hex(16)
        fd = os.open(path / TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return str(path), token


def sees_rendezvous(directory: str, token: str) -> bool:
    """Whether this worker sees the same private directory (same host or a shared filesystem, same user)."""
    try:
        check_private(Path(directory))
        return (Path(directory) / TOKEN_FILE).read_text() == token
    except (OSError, RendezvousError):
        return False


def remove_rendezvous(directory: str) -> None:
    """Remove a rendezvous directory (only one this module made: its name says so)."""
    if Path(directory).name.startswith("insitu-rdzv-"):
        shutil.rmtree(directory, ignore_errors=True)


def init_method(directory: str) -> str:
    """The ``init_process_group`` URL of the store in ``directory``."""
    return f"file://{Path(directory) / STORE_FILE}"


def torchrun_store(env: Mapping[str, str], explicit: str | None = None) -> Path:
    """The FileStore path of a ``torchrun`` job's ranks, from what torchrun put in each rank's environment.

    Every rank of one node computes the same path: a private per-user folder under :func:`base_dir` (or
    ``explicit``), and a file named by torchrun's run id, master port, restart count and, on one node, the
    agent's process id (so a file a crashed run left behind is never reused). Ranks on several nodes need
    ``explicit`` (or ``INSITU_RENDEZVOUS_DIR``) on a shared filesystem and a fresh ``--rdzv-id`` per run.

    Raises
    ------
    RendezvousError
        On several nodes without a shared directory, or when torchrun's values are not plain names.
    """
    world = int(env.get("WORLD_SIZE", "1"))
    local = int(env.get("LOCAL_WORLD_SIZE", str(world)))
    shared = explicit or env.get(RENDEZVOUS_DIR_ENV)
    if local != world and not shared:
        raise RendezvousError(
            f"{world} ranks on several nodes ({local} here) cannot meet in a private local folder and insitu "
            f"keeps no unauthenticated TCP store: pass --rendezvous-dir (or set {RENDEZVOUS_DIR_ENV}) to a "
            "directory on a filesystem every node shares, readable only by the site's user")
    parts = [env.get("TORCHELASTIC_RUN_ID", "none"), env.get("MASTER_PORT", "0"),
             env.get("TORCHELASTIC_RESTART_COUNT", "0")]
    if local == world:
        parts.append(str(os.getppid()))  # the torchrun agent: every rank of this node is its child
    bad = [p for p in parts if not _NAME.match(p)]
    if bad:
        raise RendezvousError(f"torchrun's run id, port or restart count {bad} is not a plain name")
    folder = Path(explicit) if explicit else base_dir(env) / f"insitu-rdzv-uid{os.geteuid()}"
    return folder / ("-".join(parts) + ".store")


def private_folder(path: Path) -> Path:
    """Create ``path`` (mode 0700) if missing, and check it is private (see :func:`check_private`)."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    check_private(path)
    return path
