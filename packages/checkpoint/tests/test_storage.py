"""Which storage ``reads="auto"`` chooses by (spec/09-checkpoint.md, CKPT-25): the argument,
then ``SHARDSPEC_STORAGE``, then the file system's type from the mount table."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardspec.checkpoint.storage import ENV, filesystem_type, resolve_storage, storage_kind

MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
tmpfs /tmp tmpfs rw 0 0
server:/export /mnt/ckpt nfs4 rw,vers=4.2 0 0
/dev/vdb /mnt/ckpt/local\\040copy xfs rw 0 0
lustre@tcp:/fs /lustre lustre rw 0 0
s3fs /mnt/bucket fuse.s3fs rw 0 0
10.0.0.1:6789:/ /cephfs ceph rw 0 0
"""


@pytest.fixture
def mounts(tmp_path: Path) -> str:
    p = tmp_path / "mounts"
    p.write_text(MOUNTS)
    return str(p)


@pytest.mark.rule("CKPT-25")
@pytest.mark.parametrize(
    ("path", "fstype", "kind"),
    [
        ("/home/u/ckpt", "ext4", "local"),
        ("/tmp/x", "tmpfs", "local"),
        ("/mnt/ckpt/step100", "nfs4", "shared"),
        ("/mnt/ckpt", "nfs4", "shared"),
        # the deepest mount point wins, and a space in it is \040 in the table
        ("/mnt/ckpt/local copy/step1", "xfs", "local"),
        ("/mnt/ckptx", "ext4", "local"),  # a sibling of a mount point is not inside it
        ("/lustre/proj/ckpt", "lustre", "shared"),
        ("/mnt/bucket/ckpt", "fuse.s3fs", "shared"),
        ("/cephfs/ckpt", "ceph", "shared"),
    ],
)
def test_the_storage_kind_is_the_file_system_type_of_the_deepest_mount(
    mounts: str, path: str, fstype: str, kind: str
) -> None:
    assert filesystem_type(path, mounts) == fstype
    assert storage_kind(path, mounts) == kind


@pytest.mark.rule("CKPT-25")
def test_an_unreadable_mount_table_means_local(tmp_path: Path) -> None:
    assert filesystem_type("/x", str(tmp_path / "none")) is None
    assert storage_kind("/x", str(tmp_path / "none")) == "local"


@pytest.mark.rule("CKPT-25")
def test_the_argument_then_the_environment_then_the_file_system_decide(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    found = storage_kind(tmp_path)
    other = "shared" if found == "local" else "local"
    assert resolve_storage(None, tmp_path) == found
    monkeypatch.setenv(ENV, other.upper())
    assert resolve_storage(None, tmp_path) == other
    assert resolve_storage(found, tmp_path) == found  # the argument wins
    monkeypatch.setenv(ENV, "nfs")
    with pytest.raises(ValueError, match=f"{ENV} must be 'local' or 'shared', got 'nfs'"):
        resolve_storage(None, tmp_path)
    with pytest.raises(ValueError, match="storage must be 'local', 'shared' or None"):
        resolve_storage("remote", tmp_path)


@pytest.mark.rule("CKPT-25")
def test_load_refuses_a_bad_storage_before_anything_collective(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # no process group here: a load that went on to a collective would fail otherwise
    from shardspec.checkpoint import load

    monkeypatch.delenv(ENV, raising=False)
    with pytest.raises(ValueError, match=r"storage must be one of \('local', 'shared'\)"):
        load({}, tmp_path, storage="nfs")
    monkeypatch.setenv(ENV, "lustre")
    with pytest.raises(ValueError, match=f"{ENV} must be 'local' or 'shared', got 'lustre'"):
        load({}, tmp_path)
