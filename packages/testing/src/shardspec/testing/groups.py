"""The process groups a pooled rank builds, and releasing those nothing uses any more.

A pooled rank lives for a whole test session, and every ``new_group`` (a ``DeviceMesh`` builds
one per mesh dim, plus one per flattened dim) starts gloo threads that stay until the group is
destroyed. Tests and examples build meshes per call, so without a release a rank ends a session
with hundreds of groups and threads (754 threads a rank were seen), which slowed every
collective of the machine several times over.

:func:`release_groups` destroys the groups nothing holds: not the rank's
:class:`~shardspec.testing.ops.Context`, not a live ``DeviceMesh`` (which holds its groups by
name), and no Python reference outside torch's own registries (a library's module-level cache
of groups, such as TorchRec's intra- and cross-node groups). Finding the meshes walks the heap,
so it runs only once more than :data:`RELEASE_ABOVE` groups beyond those in use have piled up.

Releasing happens when the next frame arrives, not when a call ends: the driver sends a frame
only after every rank answered the last one, so no rank is still inside a collective of a group
another rank destroys. Every rank destroys the same groups: they ran the same calls.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch.distributed as dist

__all__ = ["RELEASE_ABOVE", "groups_in", "live_groups", "release_groups"]

# Groups beyond those in use that may pile up before a release walks the heap (a few gloo
# threads each); a walk costs a collection of the rank's heap.
RELEASE_ABOVE = 32

_in_use_last = 0  # groups found in use by the last release: a library's cache stays


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


def release_groups(keep: Callable[[], Iterable[Any]]) -> int:
    """Destroy every group of this process that nothing holds (the module), newest first,
    once more than :data:`RELEASE_ABOVE` of them may have piled up; returns how many.
    ``keep`` gives the groups the caller holds, asked only then (it runs on every frame)."""
    global _in_use_last
    live = live_groups()
    if len(live) <= _in_use_last + RELEASE_ABOVE:
        return 0
    kept = set(keep())
    unheld = [pg for pg in live if pg not in kept]
    del live  # its references would count as someone else's in _held_by_references
    if len(unheld) <= _in_use_last + RELEASE_ABOVE:
        return 0
    in_use = _held_by_meshes(unheld) | _held_by_references(unheld)
    _in_use_last = len(in_use)
    doomed = [pg for pg in unheld if pg not in in_use]
    del unheld
    for pg in reversed(doomed):
        dist.destroy_process_group(pg)
    return len(doomed)


def _held_by_meshes(groups: list[Any]) -> set[Any]:
    """Those of ``groups`` a live DeviceMesh uses (it holds them by name, which no reference
    count shows); cyclic garbage (a mesh and its flattened submesh) is collected first."""
    from torch.distributed.device_mesh import DeviceMesh

    gc.collect()
    wanted = set(groups)
    held: set[Any] = set()
    for obj in gc.get_objects():
        if issubclass(type(obj), DeviceMesh):  # type(), not isinstance: no proxy is asked
            try:
                held |= wanted.intersection(obj.get_all_groups())
            except (KeyError, RuntimeError, ValueError):
                continue  # a mesh whose groups a release destroyed already: it holds none
    return held


def _held_by_references(groups: list[Any]) -> set[Any]:
    """Those of ``groups`` referenced from Python outside torch's registries of groups (its
    module's dicts and lists, and the lists and dicts in them): a dict holding only groups is
    invisible to the garbage collector, but not to the reference count."""
    c10d = dist.distributed_c10d
    ids = {id(pg): 0 for pg in groups}
    seen: set[int] = set()

    def count(container: Any, depth: int) -> None:
        if id(container) in seen or depth > 2:
            return
        seen.add(id(container))
        items = (
            [y for kv in container.items() for y in kv]
            if issubclass(type(container), dict)
            else container
        )
        for item in items:
            if id(item) in ids:
                ids[id(item)] += 1
            elif issubclass(type(item), dict | list):
                count(item, depth + 1)

    for holder in (vars(c10d), vars(c10d._world)):
        for name, value in holder.items():
            if not name.startswith("__") and issubclass(type(value), dict | list):
                count(value, 0)
    # the references of this frame: ``groups``, the loop's ``pg`` and getrefcount's argument
    return {pg for pg in groups if sys.getrefcount(pg) > ids[id(pg)] + 3}
