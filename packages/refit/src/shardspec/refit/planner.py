"""The plan of one rank: from the recipe and every tensor's source and destination layout,
which reshard jobs carry which source boxes to this rank's destination boxes, which regions of
them are padding, and what every layout problem is, refused before data moves (REFIT-4..6,
REFIT-10). Plain integers, no torch, and no collective: every rank plans alone from the same
arguments, and only for itself.

A job is one part of one destination tensor (a source box placed somewhere in it): its source
layout is the source's own (restricted to the box when the part reads a slice), its destination
layout is, over the same box, the pieces every destination box holds of the part. The reshard
executor then moves each job as any other tensor, every job in one ``all_to_all_single`` a round.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial

from shardspec.metadata import Box, Layout, LayoutError, Shard
from shardspec.reshard.derived import derived, validated
from shardspec.reshard.distinct import distinct

from .errors import RefitError
from .geometry import Part, geometry, value_steps
from .layouts import scale_layout
from .recipe import Cast, QuantizeFP8, Recipe, Target

__all__ = ["Job", "RefitPlan", "TargetPlan", "plan_refit"]


@dataclass(frozen=True)
class Job:
    key: str
    target: str
    part: Part
    sub: Box  # the box of the source the part reads
    src: Layout  # over sub.sizes
    dst: Layout  # over sub.sizes
    # this rank's source inputs: (local index of the source shard, box within it)
    src_mine: tuple[tuple[int, Box], ...]
    # this rank's job outputs, in the job's local order: (local index of the destination box,
    # region in destination coordinates)
    dst_mine: tuple[tuple[int, Box], ...]


@dataclass(frozen=True)
class TargetPlan:
    target: Target
    shape: tuple[int, ...]
    dst: Layout
    steps: tuple[Cast | QuantizeFP8, ...]
    sources: tuple[str, ...]
    boxes: tuple[Box, ...]  # this rank's destination boxes, local order
    zeros: tuple[tuple[int, Box], ...]  # padding regions of them (destination coordinates)
    scale: Layout | None = None


@dataclass(frozen=True)
class RefitPlan:
    rank: int
    targets: tuple[TargetPlan, ...]
    jobs: tuple[Job, ...]


def _layout(layouts: Mapping[str, Layout], name: str, side: str) -> Layout:
    layout = layouts[name]
    if not isinstance(layout, Layout):
        raise RefitError(f"{side} {name!r}: expected a Layout, got {type(layout).__name__}")
    try:
        validated(layout)
    except LayoutError as e:
        raise RefitError(f"{side} {name!r}: {e}") from None
    return layout


def _names(recipe: Recipe, src: Mapping[str, Layout], dst: Mapping[str, Layout]) -> None:
    wanted = recipe.sources()
    missing = [n for n in wanted if n not in src]
    extra = sorted(set(src) - set(wanted))
    if missing:
        raise RefitError(f"source {missing[0]!r} is missing (the recipe reads {missing})")
    if extra:
        raise RefitError(f"source {extra[0]!r} is not read by the recipe (extra: {extra})")
    outputs = recipe.outputs()
    scales = {t.scale_name for t in recipe.targets if t.scale_name is not None}
    # A scale's layout follows its weight's; the caller may give it, and need not.
    missing = [n for n in outputs if n not in dst and n not in scales]
    extra = sorted(set(dst) - set(outputs))
    if missing:
        raise RefitError(f"destination {missing[0]!r} has no layout (missing: {missing})")
    if extra:
        raise RefitError(f"destination {extra[0]!r} is not made by the recipe (extra: {extra})")


def _check_blocks(name: str, dst: Layout, block: tuple[int, int]) -> None:
    if dst.ndim < 2:
        raise RefitError(f"destination {name!r}: FP8 block quantization needs 2 dims or more")
    for s in dst.shards:
        b = s.box
        for d, bs in ((-2, block[0]), (-1, block[1])):
            lo, hi, n = b.offsets[d], b.stops[d], dst.shape[d]
            if b.sizes[d] and (lo % bs or (hi % bs and hi != n)):
                raise RefitError(
                    f"destination {name!r}: the box {b} of rank {s.rank} cuts through a "
                    f"{block[0]}x{block[1]} quantization block (dim {d % dst.ndim}: "
                    f"[{lo}, {hi}) of {n}); every block must lie on one rank"
                )


def plan_refit(
    recipe: Recipe,
    src_layouts: Mapping[str, Layout],
    dst_layouts: Mapping[str, Layout],
    rank: int,
) -> RefitPlan:
    """This rank's plan; raises :class:`RefitError` naming the tensor on any problem."""
    if not isinstance(recipe, Recipe):
        raise RefitError(f"expected a Recipe, got {type(recipe).__name__}")
    _names(recipe, src_layouts, dst_layouts)
    src = {n: _layout(src_layouts, n, "source") for n in recipe.sources()}
    shapes = {n: layout.shape for n, layout in src.items()}
    targets: list[TargetPlan] = []
    jobs: list[Job] = []
    for t in recipe.targets:
        core, steps = value_steps(t.expr)
        g = geometry(core, shapes, t.name)
        dst = _layout(dst_layouts, t.name, "destination")
        if dst.shape != g.shape:
            raise RefitError(
                f"destination {t.name!r}: its layout has shape {dst.shape}, the recipe makes "
                f"{g.shape}"
            )
        scale = None
        q = t.quantize
        if q is not None:
            # both walk every box: kept with the layout (a failed check raises every time)
            derived(dst, f"whole {q.block} blocks", partial(_check_blocks, t.name, block=q.block))
            scale = derived(
                dst, f"scales of {q.block} blocks", partial(scale_layout, block=q.block)
            )
            name = t.scale_name
            assert name is not None
            given = dst_layouts.get(name, scale)
            if given is not scale and not _same_local_boxes(given, scale):
                raise RefitError(
                    f"destination {name!r}: its layout {given!r} is not the blocks of "
                    f"{t.name!r}'s boxes in their local order, {scale!r}"
                )
        mine = dst.boxes_of(rank)
        zeros: list[tuple[int, Box]] = []
        for i, part in enumerate(g.parts):
            if part.source is None:
                for j, b in enumerate(mine):
                    cut = b.intersect(part.region)
                    if cut is not None:
                        zeros.append((j, cut))
                continue
            job = _job(f"{t.name}\x00{i}", t.name, part, src[part.source], dst, rank)
            if job is not None:
                jobs.append(job)
        targets.append(
            TargetPlan(t, g.shape, dst, tuple(steps), t.sources(), mine, tuple(zeros), scale)
        )
    return RefitPlan(rank, tuple(targets), tuple(jobs))


def _job(key: str, target: str, part: Part, src: Layout, dst: Layout, rank: int) -> Job | None:
    assert part.source is not None
    sub = part.src_box()
    if sub.numel == 0:
        return None
    if sub == Box.full(src.shape):
        job_src = src
        src_mine = tuple((i, Box.full(b.sizes)) for i, b in enumerate(src.boxes_of(rank)))
    else:
        shards: list[Shard] = []
        mine_src: list[tuple[int, Box]] = []
        # one index serves every job cut from a layout (the experts of one stacked tensor)
        held = distinct(src)
        within: dict[Box, Box] = {}  # replicas share their cut: place it once
        for i, cut in held.meeting(sub):
            r = held.ranks[i]
            box = within.get(cut)
            if box is None:
                box = within[cut] = cut.relative_to(sub)
            shards.append(Shard._trusted(box, r))  # a valid layout's rank, a cut box
            if r == rank:
                mine_src.append((held.local[i], cut.relative_to(src.shards[i].box)))
        job_src = Layout(sub.sizes, shards)
        src_mine = tuple(mine_src)
    if job_src is src and _identity(part, src.shape, dst.shape):
        # The whole destination is the whole source, element for element (a rename, a cast):
        # the job moves between the tensors' own layouts, whose derived index and checks are
        # kept with them, where a new copy of the destination's W shards cost O(W) a plan.
        mine = tuple((j, b) for j, b in enumerate(dst.boxes_of(rank)))
        return Job(key, target, part, sub, src, dst, src_mine, mine)
    out: list[Shard] = []
    dst_mine: list[tuple[int, Box]] = []
    wanted = distinct(dst)
    placed: dict[Box, Box] = {}
    for j, cut in wanted.meeting(part.region):
        r = wanted.ranks[j]
        box = placed.get(cut)
        if box is None:
            box = placed[cut] = part.to_source(cut).relative_to(sub)
        out.append(Shard._trusted(box, r))
        if r == rank:
            dst_mine.append((wanted.local[j], cut))
    return Job(key, target, part, sub, job_src, Layout(sub.sizes, out), src_mine, tuple(dst_mine))


def _same_local_boxes(given: object, scale: Layout) -> bool:
    """Whether every rank holds the same boxes in the same local order in both (the j-th
    scale tensor of a rank holds its j-th weight box's scales; the ranks' interleaving in the
    shard list does not matter). Equal fingerprints (kept with each layout) settle it in one
    compare a plan, where == built and compared multisets of W shards."""
    if not isinstance(given, Layout):
        return False
    if given.fingerprint() == scale.fingerprint():
        return True
    return (
        given.shape == scale.shape
        and given.ranks == scale.ranks
        and all(given.boxes_of(r) == scale.boxes_of(r) for r in scale.ranks)
    )


def _identity(part: Part, src_shape: tuple[int, ...], dst_shape: tuple[int, ...]) -> bool:
    nd = len(dst_shape)
    return (
        src_shape == dst_shape
        and part.dims == tuple(range(nd))
        and not any(part.src_offsets)
        and part.region == Box.full(dst_shape)
    )
