"""Whether a checkpoint lies on local or shared storage (CKPT-25): what ``reads="auto"`` of
:func:`shardspec.checkpoint.load` needs to know to choose a read mode.

Shared storage (a network or parallel file system: NFS, Lustre, GPFS, CephFS, BeeGFS,
GlusterFS, SMB, a FUSE mount of an object store...) has one bandwidth that the whole job
shares, so a byte read twice costs the job twice; on local storage (a node's own disk, its
page cache) every node reads at its own speed, and moving a byte between ranks costs more than
reading it again.

How it is decided, first answer wins: the ``storage`` argument; the environment variable
:data:`ENV` (``local`` or ``shared``); the type of the file system that holds the path, from
the longest mount point in ``/proc/mounts`` above it (``shared`` for the types in
:data:`SHARED_TYPES` and any ``fuse.*``); ``local`` where that cannot be read (not Linux).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ENV", "SHARED_TYPES", "filesystem_type", "resolve_storage", "storage_kind"]

ENV = "SHARDSPEC_STORAGE"
SHARED_TYPES = frozenset(
    {
        "nfs", "nfs4", "lustre", "gpfs", "ceph", "cephfs", "beegfs", "glusterfs", "cifs",
        "smb3", "smbfs", "9p", "afs", "pvfs2", "orangefs", "wekafs", "panfs", "fuse",
        "fuseblk", "virtiofs", "ocfs2", "gfs2",
    }
)  # fmt: skip
KINDS = ("local", "shared")


def filesystem_type(path: str | os.PathLike[str], mounts: str = "/proc/mounts") -> str | None:
    """The type of the file system holding ``path`` (its deepest mount point in ``mounts``),
    or None when the mount table cannot be read."""
    try:
        table = Path(mounts).read_text()
    except OSError:
        return None
    where = os.path.realpath(os.fspath(path))
    best, kind = -1, None
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        # /proc/mounts writes a space in a mount point as \040
        point = fields[1].replace("\\040", " ")
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, kind = len(point), fields[2]
    return kind


def storage_kind(path: str | os.PathLike[str], mounts: str = "/proc/mounts") -> str:
    """``"shared"`` when ``path`` lies on a network or parallel file system, else ``"local"``."""
    kind = filesystem_type(path, mounts)
    if kind is None:
        return "local"
    return "shared" if kind in SHARED_TYPES or kind.startswith("fuse.") else "local"


def resolve_storage(storage: str | None, path: str | os.PathLike[str]) -> str:
    """The storage kind of a load: ``storage`` when given, else :data:`ENV` when set, else
    :func:`storage_kind` of ``path``. A value that is neither kind raises ``ValueError``."""
    if storage is not None:
        if storage not in KINDS:
            raise ValueError(f"storage must be 'local', 'shared' or None, got {storage!r}")
        return storage
    env = os.environ.get(ENV, "").strip().lower()
    if env:
        if env not in KINDS:
            raise ValueError(f"{ENV} must be 'local' or 'shared', got {env!r}")
        return env
    return storage_kind(path)
