"""What a rank runs: named operations from a registry, or rank functions ("module:function").

A *named operation* gets the rank's :class:`Context`, the JSON arguments (the same on every
rank) and its input tensors, and returns a JSON value and output tensors. A *collective*
operation splits into ``check`` (local validation, no communication) and ``run``; every rank
runs its check, then all ranks agree on the outcome with one all-reduce, and only if every
check passed does any rank enter ``run``. So a bad input never strands a rank inside a
collective. Register one with ``@operation("area.name", collective=..., check=...)`` in a
module the pool imports (``RankPool(..., ops=("conformance.ops.dtensor",))``); names are what
travels.

A *rank function* ``"module:function"`` is called as ``function(rank, world, *args)`` with
arguments and result carried by :mod:`shardspec.testing.values`; the module is imported on
the rank by name, never unpickled.
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "OPERATIONS",
    "Context",
    "Operation",
    "Outcome",
    "execute",
    "function_name",
    "operation",
    "resolve_function",
    "warm_up",
]


@dataclass
class Context:
    """One rank's view of its world: rank, size, backend and the device its tensors live on
    (``cuda`` also under gloo, when ranks share one GPU)."""

    rank: int
    world: int
    backend: str
    device_type: str = "cpu"
    group: Any = None
    # keyed by (shape, rank order, flattened), the most recently used last; operations may add
    # keys of their own. At most MESHES_KEPT built by ``mesh``: the others' groups are released.
    meshes: dict[Any, Any] = field(default_factory=dict)
    # what operations build once per process group (subgroups, say): gone with the context
    cache: dict[str, Any] = field(default_factory=dict)
    # the groups each mesh of ``meshes`` built (a flattened dim's too, which the mesh does not
    # list among its own)
    mesh_groups: dict[Any, list[Any]] = field(default_factory=dict)

    MESHES_KEPT = 8  # a mesh costs a few gloo threads a group; rebuilding one costs milliseconds

    @property
    def device(self) -> torch.device:
        if self.device_type == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def mesh(
        self,
        shape: tuple[int, ...],
        order: Sequence[int] | None = None,
        *,
        flatten: bool = False,
    ) -> Any:
        """The DeviceMesh of ``shape`` over all ranks, built once (building one is collective,
        and every rank asks for meshes in the same order because it runs the same examples).

        ``order`` lists the ranks in row-major mesh order (default ascending). ``flatten``
        names the dims ``d0, d1, ...`` and registers their flattened submesh, which sends
        DTensor's redistribute down its one-collective paths."""
        ranks = tuple(order) if order is not None else tuple(range(self.world))
        key = (shape, ranks, flatten)
        mesh = self.meshes.pop(key, None)
        if mesh is None:
            from torch.distributed.device_mesh import DeviceMesh

            from .groups import live_groups

            before = set(live_groups())
            ids = torch.tensor(ranks).reshape(shape)
            names = tuple(f"d{i}" for i in range(len(shape))) if flatten else None
            mesh = DeviceMesh(self.device.type, ids, mesh_dim_names=names)
            if flatten and len(shape) > 1:
                mesh._flatten()
            self.mesh_groups[key] = [pg for pg in live_groups() if pg not in before]
            built = [k for k in self.meshes if k in self.mesh_groups]
            # the least recently used of the meshes built here goes (operations' own keys
            # stay); its groups go at the next release_groups
            for oldest in built[: max(0, len(built) + 1 - self.MESHES_KEPT)]:
                del self.meshes[oldest]
                del self.mesh_groups[oldest]
        self.meshes[key] = mesh
        return mesh

    def held_groups(self) -> set[Any]:
        """The groups this context keeps between calls: its meshes' and its cache's."""
        from .groups import groups_in

        return groups_in([self.cache, list(self.meshes.values()), self.mesh_groups, self.group])


@dataclass
class Outcome:
    value: Any = None
    tensors: list[torch.Tensor] = field(default_factory=list)
    error: str | None = None
    aborted: bool = False


Fn = Callable[[Context, dict[str, Any], list[torch.Tensor]], tuple[Any, list[torch.Tensor]]]
Check = Callable[[Context, dict[str, Any], list[torch.Tensor]], None]


@dataclass
class Operation:
    fn: Fn
    collective: bool
    check: Check | None


OPERATIONS: dict[str, Operation] = {}


def operation(name: str, *, collective: bool, check: Check | None = None) -> Callable[[Fn], Fn]:
    if ":" in name:
        raise ValueError(f"operation name {name!r} must not contain ':' (rank functions do)")

    def register(fn: Fn) -> Fn:
        if name in OPERATIONS:
            raise ValueError(f"operation {name!r} registered twice")
        OPERATIONS[name] = Operation(fn, collective, check)
        return fn

    return register


def execute(
    ctx: Context, name: str, args: dict[str, Any], tensors: list[torch.Tensor]
) -> tuple[str, Outcome]:
    """Run one example on this rank; returns (phase reached, outcome)."""
    op = OPERATIONS.get(name)
    error = None
    if op is None:
        error = f"unknown operation {name!r}; known: {sorted(OPERATIONS)}"
    else:
        try:
            if op.check is not None:
                op.check(ctx, args, tensors)
        except Exception:
            error = traceback.format_exc()
    if op is None or op.collective:
        # Everyone reaches this all-reduce, whatever their check said.
        flag = torch.tensor([1 if error else 0], dtype=torch.int32, device=ctx.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=ctx.group)
        if error is not None:
            return "check", Outcome(error=error)
        if int(flag.item()):
            return "check", Outcome(aborted=True)
    elif error is not None:
        return "check", Outcome(error=error)
    assert op is not None
    try:
        value, outs = op.fn(ctx, args, [t.to(ctx.device) for t in tensors])
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        if isinstance(e, KeyboardInterrupt | SystemExit):
            raise
        return ("collective" if op.collective else "run"), Outcome(error=traceback.format_exc())
    return "run", Outcome(value=value, tensors=[t.detach().cpu() for t in outs])


def function_name(fn: Callable[..., Any] | str) -> str:
    """``"module:qualname"`` of a module-level function (what travels to the ranks)."""
    if isinstance(fn, str):
        if fn.count(":") != 1:
            raise ValueError(f"a rank function is named 'module:function', got {fn!r}")
        return fn
    name = f"{fn.__module__}:{fn.__qualname__}"
    if "<" in fn.__qualname__ or "." in fn.__qualname__:
        raise ValueError(f"{name} is not a module-level function; ranks import it by name")
    return name


def resolve_function(name: str) -> Callable[..., Any]:
    module, _, attr = name.partition(":")
    fn = getattr(importlib.import_module(module), attr, None)
    if not callable(fn):
        raise LookupError(f"{name}: module {module!r} has no function {attr!r}")
    return fn  # type: ignore[no-any-return]


def warm_up(ctx: Context) -> None:
    """Pay the imports and the first collective before the first example is timed."""
    import torch.distributed.tensor  # noqa: F401

    dist.barrier(group=ctx.group)
