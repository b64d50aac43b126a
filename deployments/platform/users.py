"""OS accounts for the local platform: each site (and the coordinator) runs as its own user when we are root.

This is the local stand-in for "each region is its own cloud account": a site's processes run as
``insitu-<site>``, own their secrets (mode 0600 in a 0700 home), and cannot read another site's files
or, not being the same user, another site's process environment (``/proc/<pid>/environ``). Without root
every process runs as the caller, and only file modes and separate environments separate the sites.
"""

from __future__ import annotations

import errno
import grp
import logging
import os
import pwd
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Account:
    """An OS user the platform runs an actor's processes as."""

    name: str
    uid: int
    gid: int

    @property
    def is_current(self) -> bool:
        return self.uid == os.geteuid()


def current_account() -> Account:
    uid, gid = os.geteuid(), os.getegid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return Account(name, uid, gid)


def can_isolate() -> bool:
    """Separate OS users need root (to create them and to start processes as them)."""
    return os.geteuid() == 0


def ensure_account(name: str) -> Account:
    """The system user ``name`` (and its group), created without a login shell or home if missing."""
    try:
        pw = pwd.getpwnam(name)
        return Account(name, pw.pw_uid, pw.pw_gid)
    except KeyError:
        pass
    r = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                        "--shell", "/usr/sbin/nologin", name], capture_output=True, text=True, timeout=60)
    if r.returncode != 0 and "already exists" not in r.stderr:
        raise RuntimeError(f"could not create OS user {name}: {r.stderr.strip()}")
    pw = pwd.getpwnam(name)
    log.info("created OS user %s (uid %d)", name, pw.pw_uid)
    return Account(name, pw.pw_uid, grp.getgrgid(pw.pw_gid).gr_gid)


def own(path: Path, account: Account, mode: int) -> None:
    """Give ``path`` to ``account`` with ``mode`` (owner-only modes keep secrets to the account)."""
    if os.geteuid() == 0:
        os.chown(path, account.uid, account.gid)
    os.chmod(path, mode)


def make_private_dir(path: Path, account: Account, mode: int = 0o700) -> Path:
    """``path`` as a directory owned by ``account`` with ``mode``; a symlink in its place is refused (as root,
    following one would hand whatever it points at to the account)."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise PermissionError(f"{path} is a symlink, not a directory: refused (remove it; the platform makes "
                                  f"its directories itself)") from e
        raise
    try:
        if os.geteuid() == 0:
            os.fchown(fd, account.uid, account.gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return path


def ensure_traversable(path: Path) -> list[Path]:
    """Let other users *enter* (not list) every directory above ``path`` (root only); returns what changed.

    An actor's home lives under the platform's state directory, which may sit under a private
    temporary directory (pytest's, CI's ``mktemp -d``): its users need ``x`` on each ancestor to reach
    their own home, and read access to the code they run.
    """
    changed: list[Path] = []
    if os.geteuid() != 0:
        return changed
    for d in [path, *path.parents]:
        mode = stat.S_IMODE(d.stat().st_mode)
        if not mode & stat.S_IXOTH:
            os.chmod(d, mode | stat.S_IXOTH)
            changed.append(d)
    if changed:
        log.info("made traversable (o+x, not listable) for the platform's site users: %s", changed)
    return changed


def ensure_code_runnable_by_others(repo: Path) -> list[Path]:
    """Let other local users run this interpreter and this checkout (root only): the site users run the same
    Python, whose real home may be under root's own private home (pyenv), and the same code."""
    import sys

    changed: list[Path] = []
    for path in (Path(sys.executable).parent, Path(sys.base_prefix).resolve(), repo):
        changed += ensure_traversable(path)
    return changed
