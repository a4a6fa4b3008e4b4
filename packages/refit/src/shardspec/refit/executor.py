"""The executor: one refit on every rank of a group that spans both sides (training ranks,
serving ranks, ranks that are both or neither), through ``reshard_state_dict``.

1. Plan for this rank (cached by the recipe and the layouts' fingerprints) and check this
   rank's own tensors. Nothing raises yet.
2. One exchange (two ``all_gather``s of JSON bytes, never unpickled) of the digests of the
   recipe and layouts, this rank's verdict and the dtypes of the tensors it holds: every rank
   then reaches the same verdict from the same facts, so a problem anywhere is the same
   :class:`RefitError` everywhere, before any data moves, with the destination tensors
   untouched (REFIT-12).
3. Every part of every destination moves as one reshard job, all of them sharing each round's
   ``all_to_all_single`` (whose own agreement comes first). A destination with no value step
   is received straight into the caller's tensors (views of them), so it is written in place;
   padding regions are zeroed after the move.
4. A destination with value steps is received into scratch in the source dtype, box by box;
   each box (whole quantization blocks, REFIT-10) is cast and quantized on the rank that holds
   it and copied into the caller's tensors.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from shardspec.metadata import Box, Layout
from shardspec.reshard import ReshardError, reshard_state_dict

from .errors import RefitError
from .fp8 import quantize_blocks
from .planner import Job, RefitPlan, plan_refit
from .recipe import Cast, Recipe

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

__all__ = ["PLAN_CACHE_SIZE", "plan_cache_info", "refit"]

PLAN_CACHE_SIZE = 32
_PLANS: OrderedDict[tuple[Any, ...], RefitPlan] = OrderedDict()
_STATS = {"hits": 0, "misses": 0}


def plan_cache_info() -> dict[str, int]:
    """Hits and misses of this process's plan cache (for the tests)."""
    return dict(_STATS)


def _fingerprints(layouts: Mapping[str, Layout]) -> tuple[tuple[str, bytes], ...]:
    return tuple(
        sorted((n, v.fingerprint() if isinstance(v, Layout) else b"") for n, v in layouts.items())
    )


def _plan(
    recipe: Recipe, src: Mapping[str, Layout], dst: Mapping[str, Layout], rank: int
) -> RefitPlan:
    key = (recipe, _fingerprints(src), _fingerprints(dst), rank)
    hit = _PLANS.get(key)
    if hit is not None:
        _STATS["hits"] += 1
        _PLANS.move_to_end(key)
        return hit
    _STATS["misses"] += 1
    p = plan_refit(recipe, src, dst, rank)
    _PLANS[key] = p
    if len(_PLANS) > PLAN_CACHE_SIZE:
        _PLANS.popitem(last=False)
    return p


def _digests(
    recipe: Recipe, src: Mapping[str, Layout], dst: Mapping[str, Layout], budget: int | None
) -> dict[str, str]:
    out = {"the recipe": hashlib.sha256(repr(recipe).encode()).hexdigest()[:16]}
    out["max_buffer_bytes"] = repr(budget)
    for side, layouts in (("source", src), ("destination", dst)):
        for n, fp in _fingerprints(layouts):
            out[f"the {side} layout of {n!r}"] = fp.hex()
    return out


def _dtype(name: str) -> torch.dtype:
    import torch

    d = getattr(torch, name, None)
    if not isinstance(d, torch.dtype):
        raise RefitError(f"{name!r} is not a torch dtype")
    return d


def _check_local(
    plan: RefitPlan,
    src_layouts: Mapping[str, Layout],
    state: Mapping[str, Sequence[torch.Tensor]],
    out: Mapping[str, Sequence[torch.Tensor]] | None,
    rank: int,
) -> tuple[dict[str, str], dict[str, str]]:
    """The dtypes of the sources and outputs this rank holds; raises on a bad tensor."""

    src_dtypes: dict[str, str] = {}
    for name, tensors in state.items():
        if name not in src_layouts:
            raise RefitError(f"source {name!r} is not read by the recipe (it is in state)")
        boxes = src_layouts[name].boxes_of(rank)
        _check_tensors(f"source {name!r}", tensors, boxes, rank)
        kinds = {str(t.dtype).removeprefix("torch.") for t in tensors}
        if len(kinds) > 1:
            raise RefitError(f"source {name!r}: rank {rank}'s shards mix dtypes {sorted(kinds)}")
        if kinds:
            src_dtypes[name] = kinds.pop()
    for name, layout in src_layouts.items():
        if name not in state and layout.boxes_of(rank):
            raise RefitError(f"source {name!r}: rank {rank} holds boxes of it but passed none")
    out_dtypes: dict[str, str] = {}
    if out is not None:
        layouts = {tp.target.name: tp.dst for tp in plan.targets}
        for tp in plan.targets:
            if tp.scale is not None and tp.target.scale_name is not None:
                layouts[tp.target.scale_name] = tp.scale
        for name, tensors in out.items():
            if name not in layouts:
                raise RefitError(f"destination {name!r} is not made by the recipe (in out)")
            _check_tensors(f"destination {name!r}", tensors, layouts[name].boxes_of(rank), rank)
            for t in tensors:
                out_dtypes[name] = str(t.dtype).removeprefix("torch.")
        for name, layout in layouts.items():
            if name not in out and layout.boxes_of(rank):
                raise RefitError(f"destination {name!r}: rank {rank} holds boxes but no out")
    for tp in plan.targets:
        for step in tp.steps:
            if isinstance(step, Cast):
                _dtype(step.dtype)
    return src_dtypes, out_dtypes


def _check_tensors(
    what: str, tensors: Sequence[torch.Tensor], boxes: Sequence[Box], rank: int
) -> None:
    import torch

    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise RefitError(f"{what}: rank {rank} must pass a list of tensors, one per box")
    if len(tensors) != len(boxes):
        raise RefitError(
            f"{what}: rank {rank} passed {len(tensors)} tensors for its {len(boxes)} boxes"
        )
    for i, (t, b) in enumerate(zip(tensors, boxes)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != b.sizes:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise RefitError(
                f"{what}: tensor #{i} on rank {rank} has shape {shape}, its box {b} needs {b.sizes}"
            )


def _gather_json(value: Any, group: dist.ProcessGroup | None) -> list[Any]:
    """Every rank's ``value`` (JSON-able), as JSON bytes: what other ranks send is parsed,
    never unpickled (``all_gather_object`` would)."""
    import torch
    import torch.distributed as dist

    dev = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        dev = torch.device("cuda", torch.cuda.current_device())
    data = json.dumps(value, sort_keys=True).encode()
    world = dist.get_world_size(group)
    sizes = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64, device=dev), group=group)
    longest = max(int(t.item()) for t in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8, device=dev)
    mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
    bufs = [torch.empty(longest, dtype=torch.uint8, device=dev) for _ in range(world)]
    dist.all_gather(bufs, mine, group=group)
    return [
        json.loads(b[: int(n.item())].cpu().numpy().tobytes().decode()) for b, n in zip(bufs, sizes)
    ]


def _compact(dtypes: Mapping[str, str], order: Sequence[str]) -> dict[str, list[int]]:
    """``{dtype: [positions in order]}``: a model of one dtype costs a few bytes a tensor."""
    index = {n: i for i, n in enumerate(order)}
    out: dict[str, list[int]] = {}
    for name, d in dtypes.items():
        out.setdefault(d, []).append(index[name])
    return out


def _expand(compact: Mapping[str, list[int]], order: Sequence[str]) -> dict[str, str]:
    return {order[i]: d for d, positions in compact.items() for i in positions}


def _disagreement(details: list[dict[str, str]]) -> None:
    first = details[0]
    for rank, digests in enumerate(details):
        if digests != first:
            what = sorted(set(first.items()) ^ set(digests.items()))[0][0]
            raise RefitError(
                f"ranks disagree on {what}: rank 0 and rank {rank} passed different ones"
            )
    raise RefitError("ranks disagree on the recipe or the layouts")  # digests of equal JSON


def _verdict(plan: RefitPlan | None, gathered: list[Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The same verdict on every rank: the agreed dtype of every source and destination, or
    the same RefitError."""
    errors: dict[str, list[int]] = {}
    for rank, (error, _, _) in enumerate(gathered):
        if error is not None:
            errors.setdefault(error, []).append(rank)
    if errors:
        msg, ranks = min(errors.items(), key=lambda kv: kv[1])
        more = f" (and {len(errors) - 1} other problem(s))" if len(errors) > 1 else ""
        raise RefitError(f"{msg} [on rank(s) {ranks}]{more}")
    assert plan is not None
    src: dict[str, str] = {}
    for rank, (_, held, _) in enumerate(gathered):
        for name, d in sorted(held.items()):
            if src.setdefault(name, d) != d:
                raise RefitError(
                    f"source {name!r}: dtype mismatch, {src[name]} on one rank and {d} on "
                    f"rank {rank}"
                )
    dst: dict[str, str] = {}
    for tp in plan.targets:
        kinds = sorted({src.get(s, "float32") for s in tp.sources})
        if len(kinds) > 1:
            raise RefitError(
                f"destination {tp.target.name!r}: dtype mismatch, its parts are {kinds}"
            )
        made = kinds[0] if kinds else "float32"
        for step in tp.steps:
            made = step.dtype if isinstance(step, Cast) else "float8_e4m3fn"
        dst[tp.target.name] = made
        if tp.scale is not None:
            assert tp.target.scale_name is not None
            dst[tp.target.scale_name] = "float32"
    for rank, (_, _, given) in enumerate(gathered):
        for name, d in sorted(given.items()):
            if dst[name] != d:
                raise RefitError(
                    f"destination {name!r}: dtype mismatch, rank {rank}'s out tensors are {d}, "
                    f"the recipe makes {dst[name]}"
                )
    return src, dst


def refit(
    recipe: Recipe,
    state: Mapping[str, Sequence[torch.Tensor]],
    src_layouts: Mapping[str, Layout],
    dst_layouts: Mapping[str, Layout],
    group: dist.ProcessGroup | None = None,
    *,
    out: Mapping[str, Sequence[torch.Tensor]] | None = None,
    max_buffer_bytes: int | None = None,
) -> dict[str, list[torch.Tensor]]:
    """This rank's destination tensors (every name the recipe makes, FP8 scales included;
    one tensor per box of the rank in local order) from its source tensors.

    Call on every rank of ``group`` with the same recipe, layouts and ``max_buffer_bytes``.
    ``state[name]``: this rank's shards of source ``name`` in local order (a rank that holds
    none may leave the name out). ``out[name]``: tensors to write into, one per box (views of
    an engine's parameter: :func:`shardspec.refit.split_local`); they are written in place
    and returned. FP8 scales take their weight's blocks (:func:`shardspec.refit.scale_layout`).
    Any problem raises the same :class:`RefitError` on every rank before data moves.
    """
    import torch
    import torch.distributed as dist

    rank = dist.get_rank(group)
    plan: RefitPlan | None = None
    error: str | None = None
    held: dict[str, str] = {}
    given: dict[str, str] = {}
    digests: dict[str, str] = {}
    try:
        digests = _digests(recipe, src_layouts, dst_layouts, max_buffer_bytes)
        plan = _plan(recipe, src_layouts, dst_layouts, rank)
        held, given = _check_local(plan, src_layouts, state, out, rank)
    except RefitError as e:
        error = str(e)
    except Exception as e:  # any local failure must reach the others, or they would hang
        error = f"{type(e).__name__}: {e}"
    # One short digest a rank, not one per tensor: the exchange stays small however many
    # tensors and ranks there are; the details travel only when the digests differ.
    digest = hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()[:32]
    src_order = sorted(src_layouts) if isinstance(src_layouts, Mapping) else []
    out_order = sorted(recipe.outputs()) if isinstance(recipe, Recipe) else []
    gathered = _gather_json(
        [digest, error, _compact(held, src_order), _compact(given, out_order)], group
    )
    if any(g[0] != digest for g in gathered):
        _disagreement(_gather_json(digests, group))
    expanded = [(g[1], _expand(g[2], src_order), _expand(g[3], out_order)) for g in gathered]
    src_dtypes, dst_dtypes = _verdict(plan, expanded)
    assert plan is not None

    device = _device(state, out)
    results: dict[str, list[torch.Tensor]] = {}
    scratch: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad():
        for tp in plan.targets:
            name = tp.target.name
            if out is not None and name in out:
                results[name] = list(out[name])
            else:
                kind = _dtype(dst_dtypes[name])
                results[name] = [torch.empty(b.sizes, dtype=kind, device=device) for b in tp.boxes]
            if tp.scale is not None:
                sname = tp.target.scale_name
                assert sname is not None
                if out is not None and sname in out:
                    results[sname] = list(out[sname])
                else:
                    results[sname] = [
                        torch.empty(b.sizes, dtype=torch.float32, device=device)
                        for b in tp.scale.boxes_of(rank)
                    ]
            if tp.steps:
                kind = _dtype(src_dtypes.get(tp.sources[0], "float32") if tp.sources else "float32")
                scratch[name] = [torch.empty(b.sizes, dtype=kind, device=device) for b in tp.boxes]

        moving: dict[str, list[torch.Tensor]] = {}
        srcs: dict[str, Layout] = {}
        dsts: dict[str, Layout] = {}
        outs: dict[str, list[torch.Tensor]] = {}
        dtypes: dict[str, torch.dtype] = {}
        names: dict[str, str] = {}
        by_name = {tp.target.name: tp for tp in plan.targets}
        for job in plan.jobs:
            tp = by_name[job.target]
            base = scratch.get(job.target, results[job.target])
            held_src = state.get(job.part.source or "", [])
            moving[job.key] = [held_src[i][b.slices()] for i, b in job.src_mine]
            srcs[job.key], dsts[job.key] = job.src, job.dst
            outs[job.key] = [
                _as_source(base[j][region.relative_to(tp.boxes[j]).slices()], job)
                for j, region in job.dst_mine
            ]
            dtypes[job.key] = _dtype(src_dtypes.get(job.part.source or "", "float32"))
            names[job.key] = f"destination {job.target!r} (its part from {job.part.source!r})"
        try:
            reshard_state_dict(
                moving,
                srcs,
                dsts,
                group,
                max_buffer_bytes=max_buffer_bytes,
                dtypes=dtypes,
                device=device,
                out=outs,
                names=names,
            )
        except ReshardError as e:
            raise RefitError(str(e)) from e

        # Padding after the move, not before: a refused move leaves the tensors untouched.
        for tp in plan.targets:
            base = scratch.get(tp.target.name, results[tp.target.name])
            for j, region in tp.zeros:
                base[j][region.relative_to(tp.boxes[j]).slices()].zero_()
        for tp in plan.targets:
            if not tp.steps:
                continue
            name = tp.target.name
            for j, x in enumerate(scratch[name]):
                for step in tp.steps:
                    if isinstance(step, Cast):
                        x = x.to(_dtype(step.dtype))
                    else:
                        q, scale = quantize_blocks(x, step.block, ue8m0=step.ue8m0)
                        sname = tp.target.scale_name
                        assert sname is not None
                        results[sname][j].copy_(scale)
                        x = q
                results[name][j].copy_(x)
    return results


def _as_source(view: torch.Tensor, job: Job) -> torch.Tensor:
    """A view of destination region ``view`` with the dims of the job's source box: dims the
    source lacks (stacking) dropped, the source's order restored (a transpose undone), and
    the source's size-1 dims (a selected slice) put back."""
    dims = job.part.dims
    for d in reversed(range(len(dims))):
        if dims[d] is None:
            view = view.select(d, 0)
    mapped = [p for p in dims if p is not None]
    view = view.permute(sorted(range(len(mapped)), key=lambda i: mapped[i]))
    for p in range(len(job.part.src_offsets)):
        if p not in mapped:
            view = view.unsqueeze(p)
    return view


def _device(
    state: Mapping[str, Sequence[torch.Tensor]], out: Mapping[str, Sequence[torch.Tensor]] | None
) -> torch.device:
    import torch

    for tensors in (*state.values(), *(out or {}).values()):
        for t in tensors:
            return t.device
    return torch.device("cpu")
