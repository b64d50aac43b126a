"""The private rendezvous's pure parts: the folder must be the user's own and closed to others; torchrun's ranks
agree on one store path; ranks on several nodes need a shared folder (no TCP fallback)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from insitu.parallel.rendezvous import (
    RENDEZVOUS_DIR_ENV,
    RendezvousError,
    check_private,
    init_method,
    make_rendezvous,
    private_folder,
    remove_rendezvous,
    sees_rendezvous,
    torchrun_store,
)


def test_a_fresh_rendezvous_is_private_and_seen_with_its_token(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(RENDEZVOUS_DIR_ENV, str(tmp_path))
    directory, token = make_rendezvous()
    assert Path(directory).parent == tmp_path and (os.stat(directory).st_mode & 0o777) == 0o700
    assert sees_rendezvous(directory, token)
    assert not sees_rendezvous(directory, "0" * 32)  # another launch's folder
    assert not sees_rendezvous(str(tmp_path / "elsewhere"), token)  # another host without a shared filesystem
    assert init_method(directory) == f"file://{directory}/store"
    remove_rendezvous(directory)
    assert not Path(directory).exists()


def test_a_folder_others_can_enter_is_refused_with_the_fix(tmp_path: Path) -> None:
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o755)
    with pytest.raises(RendezvousError, match="mode 755.*chmod 700"):
        check_private(d)
    assert not sees_rendezvous(str(d), "x")


def test_a_symlink_is_refused(tmp_path: Path) -> None:
    real = private_folder(tmp_path / "real")
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(RendezvousError, match="not a directory"):
        check_private(tmp_path / "link")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_a_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    d = private_folder(tmp_path / "theirs")
    os.chown(d, 65534, 65534)
    with pytest.raises(RendezvousError, match="belongs to uid 65534"):
        check_private(d)


def test_remove_only_touches_rendezvous_folders(tmp_path: Path) -> None:
    keep = tmp_path / "data"
    keep.mkdir()
    remove_rendezvous(str(keep))
    assert keep.exists()


TORCHRUN = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "0", "TORCHELASTIC_RUN_ID": "abc-1",
            "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "0"}


def test_torchrun_ranks_of_one_node_share_a_private_per_user_store(tmp_path: Path) -> None:
    env = {**TORCHRUN, RENDEZVOUS_DIR_ENV: str(tmp_path)}
    path = torchrun_store(env)
    assert path == torchrun_store({**env, "RANK": "1"})  # every rank computes the same file
    assert path.parent == tmp_path / f"insitu-rdzv-uid{os.geteuid()}"
    assert path.name == f"abc-1-29500-0-{os.getppid()}.store"
    assert torchrun_store({**env, "TORCHELASTIC_RESTART_COUNT": "1"}) != path  # a restart never reuses a file


def test_torchrun_on_several_nodes_needs_a_shared_folder(tmp_path: Path) -> None:
    several = {**TORCHRUN, "WORLD_SIZE": "4"}
    with pytest.raises(RendezvousError, match="several nodes.*no unauthenticated TCP store.*--rendezvous-dir"):
        torchrun_store(several)
    path = torchrun_store(several, str(tmp_path))
    assert path == tmp_path / "abc-1-29500-0.store"  # no agent pid: it differs between nodes


def test_torchrun_values_must_be_plain_names(tmp_path: Path) -> None:
    with pytest.raises(RendezvousError, match="not a plain name"):
        torchrun_store({**TORCHRUN, "TORCHELASTIC_RUN_ID": "../../etc"}, str(tmp_path))
