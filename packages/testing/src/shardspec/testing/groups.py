"""The process groups a pooled rank builds, and releasing them between calls.

A pooled rank lives for a whole test session, and every ``new_group`` (a ``DeviceMesh`` builds
one per mesh dim, plus one per flattened dim) starts gloo threads that stay until the group is
destroyed. Tests and examples build meshes per call, so without a release a rank ends a session
with hundreds of groups and threads (754 threads a rank were seen), which slowed every
collective of the machine several times over. :func:`release_groups` destroys what the last
call left, except what the rank's :class:`~shardspec.testing.ops.Context` keeps on purpose.

Releasing happens when the next frame arrives, not when a call ends: the driver sends a frame
only after every rank answered the last one, so no rank is still inside a collective of a group
another rank destroys.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch.distributed as dist

__all__ = ["groups_in", "live_groups", "release_groups"]


def live_groups() -> list[Any]:
    """This process's groups other than the default one, oldest first."""
    world = dist.distributed_c10d._world
    default = dist.distributed_c10d.GroupMember.WORLD  # None before init_process_group
    names = world.pg_names
    return sorted((pg for pg in world.pg_map if pg is not default), key=lambda pg: names[pg])


def groups_in(obj: Any) -> set[Any]:
    """The process groups ``obj`` holds: a group, a DeviceMesh's dim groups, or those of the
    values of a list, tuple, set or dict (nested); none for anything else (None, say)."""
    from torch.distributed.device_mesh import DeviceMesh

    if isinstance(obj, dist.ProcessGroup):
        return {obj}
    if isinstance(obj, DeviceMesh):
        return set(obj.get_all_groups())
    found: set[Any] = set()
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, list | tuple | set | frozenset):
        for item in obj:
            found |= groups_in(item)
    return found


def release_groups(keep: Iterable[Any]) -> int:
    """Destroy every group of this process but the default one and ``keep``, newest first
    (the order every rank agrees on); returns how many."""
    kept = set(keep)
    doomed = [pg for pg in live_groups() if pg not in kept]
    for pg in reversed(doomed):
        dist.destroy_process_group(pg)
    return len(doomed)
