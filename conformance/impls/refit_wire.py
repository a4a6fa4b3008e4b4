"""What the built-in refit adapters send to their rank operations (``conformance/ops/refit.py``)
and how they read the answer back: the recipe as data, the layouts as JSON, every rank's source
boxes round after round, and each rank's destination boxes regrouped by name."""

from __future__ import annotations

from typing import Any

from shardspec.metadata import Layout


def _dtype_of(expr: Any, sources: dict[str, Any]) -> str:
    """The destination's dtype: a cast's, float8 for FP8 blocks, else its first source's."""
    from shardspec.refit import Cast, QuantizeFP8, Source

    if isinstance(expr, QuantizeFP8):
        return "float8_e4m3fn"
    if isinstance(expr, Cast):
        return expr.dtype
    if isinstance(expr, Source):
        return str(sources[expr.name].dtype).removeprefix("torch.")
    part = expr.parts[0] if hasattr(expr, "parts") else expr.part
    return _dtype_of(part, sources)


def out_layouts(recipe: Any, dst: dict[str, Layout]) -> dict[str, Layout]:
    """``dst`` and the FP8 scales' layouts, their weight's blocks."""
    from shardspec.refit import scale_layout

    layouts = dict(dst)
    for t in recipe.targets:
        q, name = t.quantize, t.scale_name
        if q is not None and name is not None and name not in layouts:
            layouts[name] = scale_layout(dst[t.name], q.block)
    return layouts


def group_rank(rank: int, members: list[int] | None) -> int | None:
    """A pool rank's rank in the group of ``members`` (all the pool when None); None
    outside it."""
    if members is None:
        return rank
    return members.index(rank) if rank in members else None


def wire(
    pool: Any, recipe: Any, rounds: list[dict[str, Any]], src: dict[str, Layout],
    dst: dict[str, Layout], members: list[int] | None = None,
) -> tuple[dict[str, Any], list[list[Any]]]:  # fmt: skip
    """The rank operations' arguments and each rank's source boxes, round after round; with
    ``members``, on the group of those pool ranks (the others get nothing)."""
    from conformance.codec import layout_to_json
    from shardspec.refit import recipe_to_data

    first = rounds[0]
    names = list(src)
    outs = []
    for t in recipe.targets:
        outs.append([t.name, _dtype_of(t.expr, first)])
        if t.scale_name is not None:
            outs.append([t.scale_name, "float32"])
    args = {
        "recipe": recipe_to_data(recipe),
        "src": {n: layout_to_json(v) for n, v in src.items()},
        "dst": {n: layout_to_json(v) for n, v in dst.items()},
        "sources": names,
        "source_dtypes": {n: str(first[n].dtype).removeprefix("torch.") for n in names},
        "outs": outs,
        "rounds": len(rounds),
    }
    if members is not None:
        args["members"] = list(members)
    inputs = []
    for r in range(pool.world_size):
        g = group_rank(r, members)
        inputs.append([] if g is None else [
            full[n][b.slices()].contiguous() for full in rounds for n in names
            for b in src[n].boxes_of(g)
        ])  # fmt: skip
    return args, inputs


def run_refit(
    pool: Any,
    op: str,
    recipe: Any,
    rounds: list[dict[str, Any]],
    src: dict[str, Layout],
    dst: dict[str, Layout],
    example: str,
    members: list[int] | None = None,
) -> list[list[dict[str, list[Any]]]]:
    """Run ``op`` on every rank (on the group of ``members`` when given); per pool rank, per
    round, its destination boxes by name."""
    args, inputs = wire(pool, recipe, rounds, src, dst, members)
    outs = args["outs"]
    layouts = out_layouts(recipe, dst)
    answers = []
    for res in pool.run(op, args, per_rank_tensors=inputs, example=example):
        it = iter(res.tensors)
        per_round = []
        for _ in rounds:
            got = {}
            g = group_rank(res.rank, members)
            for n, _dtype in outs:
                boxes = layouts[n].boxes_of(g) if g is not None else ()
                if boxes:
                    got[n] = [next(it) for _ in boxes]
            per_round.append(got)
        answers.append(per_round)
    return answers
