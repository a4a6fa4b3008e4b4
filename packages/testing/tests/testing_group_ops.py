"""Named operations and rank functions for test_groups.py: what a pooled rank keeps of the
process groups its calls build."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from shardspec.testing.groups import live_groups
from shardspec.testing.ops import Context, operation


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def build_meshes(rank: int, world: int, count: int) -> list[int]:
    """[groups alive when the call began, threads then]; then builds ``count`` meshes and
    keeps none."""
    from torch.distributed.device_mesh import init_device_mesh

    at_entry = [len(live_groups()), _threads()]
    for _ in range(count):
        init_device_mesh("cpu", (1, world), mesh_dim_names=("a", "b"))._flatten()
        init_device_mesh("cpu", (world, 1))
    return at_entry


def _dim_sums(mesh: Any, rank: int) -> list[float]:
    sums = []
    for dim in range(mesh.ndim):
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t, group=mesh.get_group(dim))
        sums.append(t.item())
    return sums


@operation("test.groups.mesh", collective=True)
def mesh_op(ctx: Context, args: dict[str, Any], tensors: list[torch.Tensor]) -> tuple[Any, list]:
    at_entry = len(live_groups())
    mesh = ctx.mesh(tuple(args["shape"]), args["order"], flatten=args["flatten"])
    built = sum(1 for key in ctx.meshes if key in ctx.mesh_groups)
    coordinate = mesh.get_coordinate()
    return {
        "groups_at_entry": at_entry,
        "meshes_built": built,
        "mesh_id": id(mesh),
        "coordinate": coordinate,
        "sums": _dim_sums(mesh, ctx.rank),
    }, []


@operation("test.groups.cached", collective=True)
def cached_op(ctx: Context, args: dict[str, Any], tensors: list[torch.Tensor]) -> tuple[Any, list]:
    if "pair" not in ctx.cache:
        ctx.cache["pair"] = [dist.new_group(list(range(ctx.world)))]
    group = ctx.cache["pair"][0]
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t, group=group)
    return {"group_id": id(group), "sum": t.item()}, []


_CACHED: dict[str, Any] = {}


def cached_in_module(rank: int, world: int) -> list[float]:
    """A group and a DeviceMesh a library keeps in a module global across calls (TorchRec
    keeps its intra- and cross-node groups so): both still work on every later call."""
    from torch.distributed.device_mesh import init_device_mesh

    if not _CACHED:
        _CACHED["group"] = dist.new_group(list(range(world)))
        _CACHED["mesh"] = init_device_mesh("cpu", (1, world), mesh_dim_names=("a", "b"))
        _CACHED["mesh"]._flatten()
    sums = []
    # get_rank asks torch's registry, as TorchRec's collectives do: a destroyed group is not
    # in it (a collective on one may still go through)
    for group in (_CACHED["group"], _CACHED["mesh"].get_group("a"), _CACHED["mesh"]["a_b"]):
        group = group.get_group() if hasattr(group, "get_group") else group
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t, group=group)
        sums.append(t.item() + 10 * dist.get_rank(group))
    return sums
