"""Pool operations of the refit area (spec/10-refit.md), registered in
``shardspec.testing.ops``'s table when a pool imports this module (listed in
:data:`conformance.OPS`).

The recipe travels as its data form (``shardspec.refit.recipe_to_data``) and the layouts as
JSON, never as pickles. Each rank receives its boxes of every source (``args["sources"]``
order), round after round, and returns its boxes of every destination (``args["outs"]``
order), round after round; the driver compares them with ``shardspec.refit.reference``.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.codec import layout_from_json
from conformance.ops.shared import group_rank, subgroup
from shardspec.metadata import Layout
from shardspec.testing.ops import Context, operation

__all__: list[str] = []


def _layouts(args: dict[str, Any], side: str) -> dict[str, Layout]:
    return {n: layout_from_json(v) for n, v in args[side].items()}


def _out_layouts(recipe: Any, dst: dict[str, Layout]) -> dict[str, Layout]:
    from shardspec.refit import scale_layout

    layouts = dict(dst)
    for t in recipe.targets:
        q, name = t.quantize, t.scale_name
        if q is not None and name is not None and name not in layouts:
            layouts[name] = scale_layout(dst[t.name], q.block)
    return layouts


def _rounds(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> list[dict[str, list]]:
    """This rank's source boxes of each round, by name."""
    src = _layouts(args, "src")
    me = group_rank(ctx, args)
    out, pos = [], 0
    for _ in range(args["rounds"]):
        state = {}
        for n in args["sources"]:
            k = len(src[n].boxes_of(me)) if me is not None else 0
            if k:
                state[n] = ts[pos : pos + k]
            pos += k
        out.append(state)
    return out


def _check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    src, me = _layouts(args, "src"), group_rank(ctx, args)
    need = 0
    if me is not None:
        need = args["rounds"] * sum(len(src[n].boxes_of(me)) for n in args["sources"])
    if len(ts) != need:
        raise ValueError(f"rank {ctx.rank} got {len(ts)} tensors for {need} source boxes")


def _flat(ctx: Context, outs: list[list[Any]], got: dict[str, list[torch.Tensor]]) -> list:
    return [t for n, _ in outs for t in got.get(n, [])]


@operation("refit.shardspec", collective=True, check=_check)
def _refit_shardspec(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """``shardspec.refit.refit`` once per round into the same out tensors, the source
    tensors changed in place between rounds (as a training step changes them); with
    ``members``, on the group of those ranks (the others take no part)."""
    if args.get("members") is None:
        return _refit_on(ctx, args, ts, ctx.group)
    with subgroup(ctx, args["members"]) as group:
        return _refit_on(ctx, args, ts, group)


def _refit_on(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor], group: Any
) -> tuple[Any, list[torch.Tensor]]:
    from shardspec.refit import recipe_from_data, refit

    me = group_rank(ctx, args)
    if me is None:
        return None, []
    recipe = recipe_from_data(args["recipe"])
    src, dst = _layouts(args, "src"), _layouts(args, "dst")
    layouts = _out_layouts(recipe, dst)
    out = {
        n: [torch.zeros(b.sizes, dtype=getattr(torch, d), device=ctx.device)
            for b in layouts[n].boxes_of(me)]
        for n, d in args["outs"]
    }  # fmt: skip
    out = {n: v for n, v in out.items() if v}
    rounds = _rounds(ctx, args, ts)
    state = {n: [t.clone() for t in v] for n, v in rounds[0].items()}
    where = {n: [t.data_ptr() for t in v] for n, v in out.items()}
    got: list[torch.Tensor] = []
    for i, given in enumerate(rounds):
        if i:
            for n, v in state.items():
                for a, b in zip(v, given[n]):
                    a.copy_(b)
        res = refit(recipe, state, src, dst, group, out=out)
        for n, ptrs in where.items():
            # REFIT-14: into the caller's tensors themselves (engines capture their storage
            # in CUDA graphs), never a copy handed back
            if [t.data_ptr() for t in res.get(n, [])] != ptrs or [
                t.data_ptr() for t in out[n]
            ] != ptrs:
                raise AssertionError(
                    f"REFIT-14: rank {ctx.rank}, round {i}: {n!r} was not written in place "
                    "(the returned tensors are not the out= tensors)"
                )
        got += [t.clone() for t in _flat(ctx, args["outs"], res)]
    return None, got


SENTINEL = 0xA5  # a byte no destination starts with: an error must leave it everywhere


@operation("refit.refused", collective=True, check=_check)
def _refit_refused(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """``shardspec.refit.refit`` of the first round into out= tensors filled with
    :data:`SENTINEL`, where rank ``args["fault"]["rank"]`` alone passes something wrong:
    ``shape`` (its first box of source ``name`` one row short, or one row long when empty),
    ``missing`` (source ``name`` left out), ``layout`` (destination ``name`` in ``layout``
    instead) or ``recipe`` (target ``name`` renamed). The value: the RefitError's message
    (None when refit returned) and whether the out= tensors still hold only the sentinel."""
    from shardspec.refit import RefitError, Target, recipe as make_recipe, recipe_from_data, refit

    recipe = recipe_from_data(args["recipe"])
    src, dst = _layouts(args, "src"), _layouts(args, "dst")
    state = {n: list(v) for n, v in _rounds(ctx, args, ts)[0].items()}
    fault = args["fault"]
    name = fault["name"]
    if ctx.rank == fault["rank"]:
        kind = fault["kind"]
        if kind == "shape":
            t = state[name][0]
            if t.shape[0]:
                state[name][0] = t[:-1].clone()
            else:
                state[name][0] = torch.zeros((1, *t.shape[1:]), dtype=t.dtype)
        elif kind == "missing":
            del state[name]
        elif kind == "layout":
            dst = {**dst, name: layout_from_json(fault["layout"])}
        elif kind != "recipe":  # the recipe: below, once the out= tensors (the engine's) exist
            raise ValueError(f"unknown fault {kind!r}")
    layouts = _out_layouts(recipe, dst)
    out = {}
    for n, d in args["outs"]:
        boxes = layouts[n].boxes_of(ctx.rank) if n in layouts else ()
        tensors = [torch.empty(b.sizes, dtype=getattr(torch, d), device=ctx.device) for b in boxes]
        for t in tensors:
            t.view(torch.uint8).fill_(SENTINEL)
        if tensors:
            out[n] = tensors
    if ctx.rank == fault["rank"] and fault["kind"] == "recipe":
        recipe = make_recipe(
            Target(t.name + ".renamed", t.expr) if t.name == name else t for t in recipe.targets
        )
    error = None
    try:
        refit(recipe, state, src, dst, ctx.group, out=out)
    except RefitError as e:
        error = str(e)
    untouched = all(bool(t.view(torch.uint8).eq(SENTINEL).all()) for v in out.values() for t in v)
    return {"error": error, "untouched": untouched}, []


@operation("refit.naive", collective=True, check=_check)
def _refit_naive(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """The baseline as the field writes it: every shard of every full source tensor is
    broadcast from its owner (``full_tensor()`` on the training side), and every rank applies
    the recipe to the full tensors and slices its own boxes. Slow, never wrong."""
    import torch.distributed as dist

    from shardspec.refit import recipe_from_data, reference

    recipe = recipe_from_data(args["recipe"])
    src = _layouts(args, "src")
    layouts = _out_layouts(recipe, _layouts(args, "dst"))
    got: list[torch.Tensor] = []
    for state in _rounds(ctx, args, ts):
        full = {}
        for n in args["sources"]:
            layout, dtype = src[n], getattr(torch, args["source_dtypes"][n])
            t = torch.zeros(layout.shape, dtype=dtype, device=ctx.device)
            mine = iter(state.get(n, []))
            for s in layout.shards:
                piece = (
                    next(mine)
                    if s.rank == ctx.rank
                    else torch.empty(s.box.sizes, dtype=dtype, device=ctx.device)
                )
                if s.box.is_empty:
                    continue
                buf = piece.contiguous()
                # as bytes: gloo's broadcast does not take every dtype (bfloat16 among them)
                dist.broadcast(buf.view(-1).view(torch.uint8), s.rank, group=ctx.group)
                t[s.box.slices()] = buf
            full[n] = t
        outputs = reference.full_outputs(recipe, full)
        for n, _ in args["outs"]:
            got += [outputs[n][b.slices()].clone() for b in layouts[n].boxes_of(ctx.rank)]
    return None, got
