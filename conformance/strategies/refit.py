"""Refit cases (spec/10-refit.md): small Llama-like dense and Mixtral-like MoE models under
the built-in recipes (``shardspec.refit.models``), drawn training layouts (FSDP chunks, FSDP x
TP, uneven cuts) and serving layouts (TP of packed parts, EP of stacked experts), on colocated,
disjoint or overlapping sides with idle ranks, in float32, bfloat16 or FP8 blocks, refit once
or twice with new values in between. And a user's own recipes (one case in four): a
concatenation of 1-3 sources (packed or plain), maybe stacked with a second one, padded,
transposed or sliced (an unstack), maybe cast or put in FP8 blocks, between any valid layouts
of the two sides.

Sizes are drawn so that TP rarely divides them: hidden sizes, head counts, vocabularies (the
padded vocabulary is a drawn multiple, not TP's), intermediate sizes and expert counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st

from shardspec.metadata import Box, Layout, chunk_bounds, chunk_layout
from shardspec.metadata.strategies import valid_layouts
from shardspec.refit import (
    Cast,
    QuantizeFP8,
    Source,
    Target,
    packed_layout,
    recipe,
    scale_layout,
)
from shardspec.refit.geometry import geometry
from shardspec.refit.models import dense_to_vllm, moe_to_vllm, padded_vocab
from shardspec.refit.strategies import geometric_exprs
from shardspec.testing.tensors import random_tensor

__all__ = [
    "FAULTS",
    "Model",
    "refit_case",
    "refit_cases",
    "refit_subgroup_cases",
    "refusal_cases",
    "tp_layout",
    "tp_reshard_cases",
    "turned",
]

PLACEMENTS = ("colocated", "disjoint", "overlapping")
TRAINING = ("fsdp", "fsdp_tp", "uneven", "fsdp_pp")


@dataclass(frozen=True)
class Model:
    """A model's sizes. FP8 cases keep every row count that a serving rank's box ends on a
    multiple of the block's rows (``block[0]``): REFIT-10 refuses a box cutting a block."""

    layers: int = 1
    hidden: int = 3
    head_dim: int = 2
    kv_heads: int = 1
    gqa: int = 2  # query heads per kv head
    inter: int = 3
    vocab: int = 5
    pad_multiple: int = 4
    tied: bool = False
    experts: int = 0  # 0: dense
    dtype: str = "float32"
    block: tuple[int, int] | None = None  # FP8 blocks, or None

    def recipe(self) -> Any:
        padded = padded_vocab(self.vocab, self.pad_multiple)
        fp8 = {"fp8": self.block is not None, "block": self.block or (128, 128)}
        if self.experts:
            return moe_to_vllm(self.layers, self.vocab, self.experts, padded, tied=self.tied,
                               **fp8)  # fmt: skip
        return dense_to_vllm(self.layers, self.vocab, padded, tied=self.tied, **fp8)

    def source_shape(self, name: str) -> tuple[int, ...]:
        h, q, kv = self.hidden, self.gqa * self.kv_heads * self.head_dim, self.kv_heads
        if name.endswith("q_proj.weight"):
            return (q, h)
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            return (kv * self.head_dim, h)
        if name.endswith("o_proj.weight"):
            return (h, q)
        if name.endswith("block_sparse_moe.gate.weight"):
            return (self.experts, h)
        if name.endswith(("gate_proj.weight", "up_proj.weight", ".w1.weight", ".w3.weight")):
            return (self.inter, h)
        if name.endswith(("down_proj.weight", ".w2.weight")):
            return (h, self.inter)
        if name.endswith(("embed_tokens.weight", "lm_head.weight")):
            return (self.vocab, h)
        return (h,)  # the norms

    def describe(self) -> str:
        kind = f"moe experts={self.experts}" if self.experts else "dense"
        return (
            f"{kind} layers={self.layers} hidden={self.hidden} heads={self.gqa * self.kv_heads}"
            f"/{self.kv_heads}x{self.head_dim} inter={self.inter} vocab={self.vocab}->"
            f"{padded_vocab(self.vocab, self.pad_multiple)} tied={self.tied} dtype={self.dtype}"
            f" fp8_block={self.block}"
        )


def pipeline_stage(name: str, layers: int, stages: int) -> int:
    """The pipeline stage holding source ``name``: layer ``i`` on stage ``i * stages //
    layers`` (consecutive layers a stage), the embedding on the first, the final norm and
    ``lm_head`` on the last."""
    if ".layers." in name:
        return int(name.split(".layers.")[1].split(".")[0]) * stages // layers
    return 0 if "embed_tokens" in name else stages - 1


def _training_layout(
    shape: tuple[int, ...], kind: str, ranks: list[int], cuts: Any, name: str = "", layers: int = 1
) -> Layout:
    """FSDP's dim-0 chunks; FSDP x TP (TP's chunks of dim 1 inside FSDP's of dim 0, on a
    mesh of the training ranks); uneven cuts of dim 0 (one range a rank, some empty); or
    FSDP x PP (two stages of the training ranks, the second the larger when they are odd;
    each tensor in FSDP's chunks over its stage's ranks only: :func:`pipeline_stage`)."""
    if kind == "fsdp_pp" and len(ranks) > 1:
        half = len(ranks) // 2
        stage = pipeline_stage(name, layers, 2)
        return chunk_layout(shape, 0, ranks[:half] if stage == 0 else ranks[half:])
    if kind == "fsdp_tp" and len(shape) == 2 and len(ranks) > 1:
        tp = 2 if len(ranks) % 2 == 0 else len(ranks)
        fsdp = len(ranks) // tp
        boxes = []
        for i, (lo, hi) in enumerate(chunk_bounds(shape[0], fsdp)):
            for j, (clo, chi) in enumerate(chunk_bounds(shape[1], tp)):
                boxes.append((Box((lo, clo), (hi - lo, chi - clo)), ranks[i * tp + j]))
        return Layout.from_boxes(shape, boxes)
    if kind == "uneven":
        n = shape[0]
        stops = sorted(min(c, n) for c in cuts[: len(ranks) - 1]) + [n]
        boxes, lo = [], 0
        for r, hi in zip(ranks, stops):
            offs = (lo,) + (0,) * (len(shape) - 1)
            boxes.append((Box(offs, (hi - lo,) + tuple(shape[1:])), r))
            lo = hi
        return Layout.from_boxes(shape, boxes)
    return chunk_layout(shape, 0, ranks)


def _serving_layout(name: str, shape: tuple[int, ...], m: Model, ranks: list[int]) -> Layout:
    """vLLM's: column-parallel packed parts (whole heads), row-parallel o/down projections
    (rows instead under FP8, so no box cuts a block), the padded vocabulary split by rows,
    experts split by EP, norms and the router replicated."""
    unit = m.block[0] if m.block else 1
    q, kv = m.gqa * m.kv_heads * m.head_dim, m.kv_heads * m.head_dim
    if name.endswith("qkv_proj.weight"):
        # vLLM replicates KV heads over a TP degree above them that they divide (and refuses
        # one they do not divide: that one keeps the chunk rule's empty chunks, REFIT-3)
        n = len(ranks)
        rep = (1, 2) if m.kv_heads < n and n % m.kv_heads == 0 else ()
        return packed_layout(shape, 0, [q, kv, kv], ranks, m.head_dim, replicate=rep)
    if name.endswith("gate_up_proj.weight"):
        return packed_layout(shape, 0, [m.inter, m.inter], ranks, unit)
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        if m.block:
            return packed_layout(shape, 0, [shape[0]], ranks, unit)
        return chunk_layout(shape, 1, ranks)
    if name.endswith(("w13_weight", "w2_weight", "embed_tokens.weight", "lm_head.weight")):
        return chunk_layout(shape, 0, ranks)
    return Layout.replicated(shape, ranks)


def refit_case(
    m: Model,
    world: int,
    train: list[int],
    serve: list[int],
    training: str = "fsdp",
    cuts: tuple[int, ...] = (),
    seeds: tuple[int, ...] = (0,),
    placement: str = "",
) -> dict[str, Any]:
    """The case the refit test runs: ``world``, ``recipe``, ``rounds`` (full sources, one dict
    a refit), ``src`` and ``dst`` layouts and a description ``ex`` for failure messages."""
    recipe = m.recipe()
    shapes = {n: m.source_shape(n) for n in recipe.sources()}
    dtype = getattr(torch, m.dtype)
    rounds = [
        {n: random_tensor(s, dtype, seed * 1000 + i) for i, (n, s) in enumerate(shapes.items())}
        for seed in seeds
    ]
    src = {n: _training_layout(s, training, train, cuts, n, m.layers) for n, s in shapes.items()}
    dst = {}
    for t in recipe.targets:
        e = t.quantize.part if t.quantize is not None else t.expr  # geometry takes no value step
        dst[t.name] = _serving_layout(t.name, geometry(e, dict(shapes), t.name).shape, m, serve)
    ex = (
        f"refit({m.describe()}, world={world}, {placement + ' ' if placement else ''}"
        f"train={training}{train}, serve={serve}, rounds={len(seeds)})"
    )
    return {"world": world, "recipe": recipe, "rounds": rounds, "src": src, "dst": dst, "ex": ex}


@st.composite
def models(draw: st.DrawFn) -> Model:
    kind = draw(st.sampled_from(["float32", "bfloat16", "fp8"]), label="dtype")
    block = None
    dtype = kind
    if kind == "fp8":
        block = (draw(st.integers(1, 2)), draw(st.integers(1, 3)))
        dtype = draw(st.sampled_from(["float32", "bfloat16"]))
    unit = block[0] if block else 1
    return Model(
        layers=draw(st.integers(1, 3)),
        hidden=unit * draw(st.integers(1, 7)),
        head_dim=unit * draw(st.integers(1, 3 // unit)),
        kv_heads=draw(st.integers(1, 3)),
        gqa=draw(st.integers(1, 8)),
        inter=unit * draw(st.integers(1, 5)),
        vocab=draw(st.integers(1, 13)),
        pad_multiple=draw(st.integers(1, 8)),
        tied=draw(st.booleans()),
        experts=draw(st.sampled_from([0, 0, 2, 3, 5, 8])),
        dtype=dtype,
        block=block,
    )


# The largest simulated world a refit case takes (SHARDSPEC_SIM_WORLDS): every rank of a
# simulated world is a thread, and each plans and exchanges digests with every other.
REFIT_SIM_MAX = 64


def _world(draw: st.DrawFn, max_world: int) -> int:
    """1 to ``max_world`` ranks of a pool; with simulated worlds, one of those of at most
    REFIT_SIM_MAX ranks, the largest first (more ranks than the models have rows)."""
    from shardspec.testing.devices import simulated_worlds

    sim = sorted((w for w in simulated_worlds() if w <= REFIT_SIM_MAX), reverse=True)
    if sim:
        return draw(st.sampled_from(sim), label="world")
    return draw(st.integers(1, max_world), label="world")


@st.composite
def refit_cases(draw: st.DrawFn, max_world: int = 4) -> dict[str, Any]:
    m = draw(models())
    world = _world(draw, max_world)
    order = draw(st.permutations(range(world)))
    placement = draw(st.sampled_from(PLACEMENTS if world > 1 else PLACEMENTS[:1]))
    if placement == "colocated":
        n = draw(st.integers(1, world))
        train = serve = order[:n]  # the rest idle
    elif placement == "disjoint":
        nt = draw(st.integers(1, world - 1))
        ns = draw(st.integers(1, world - nt))
        train, serve = order[:nt], order[nt : nt + ns]
    else:
        train = order[: draw(st.integers(1, world))]
        serve = order[draw(st.integers(0, world - 1)) :]
    training = draw(st.sampled_from(TRAINING), label="training")
    cuts = tuple(draw(st.lists(st.integers(0, 16), min_size=world, max_size=world)))
    seeds = tuple(draw(st.lists(st.integers(0, 2**16), min_size=1, max_size=2, unique=True)))
    if draw(st.integers(0, 3), label="own recipe") == 0:
        return draw(own_recipe_case(world, list(train), list(serve), seeds, placement))
    return refit_case(m, world, list(train), list(serve), training, cuts, seeds, placement)


@st.composite
def refit_subgroup_cases(draw: st.DrawFn) -> dict[str, Any]:
    """:func:`refit_cases`' dict, on 1 to 3 ranks, run on the group of ``members``: as many
    ranks of a pool of 2 to 4 (ascending, as new_group orders them; group rank i is
    ``members[i]``, seldom pool rank i), the pool's other ranks left out. Pools of gloo
    ranks only: simulated worlds hold whole worlds."""
    c = draw(refit_cases(max_world=3))
    pool = draw(st.integers(c["world"] + 1, 4), label="pool")
    members = sorted(draw(st.permutations(range(pool)))[: c["world"]])
    return {**c, "pool": pool, "members": members}


@st.composite
def own_recipe_case(
    draw: st.DrawFn,
    world: int,
    train: list[int],
    serve: list[int],
    seeds: tuple[int, ...],
    placement: str,
) -> dict[str, Any]:
    """One destination ``x`` of a user's recipe from sources on ``train`` into ``serve``."""
    expr, shapes = draw(geometric_exprs())
    e: Any = expr
    shape = geometry(e, shapes, "x").shape
    nd = len(shape)
    dtype = draw(st.sampled_from(["float32", "bfloat16"]))
    value = draw(st.sampled_from(["", "cast", "fp8"] if nd >= 2 else ["", "cast"]))
    dst_layout = _on(draw(valid_layouts(st.just(shape), world=len(serve))), serve)
    if value == "cast":
        e = Cast(e, "bfloat16" if dtype == "float32" else "float32")
    elif value == "fp8":
        block = (draw(st.integers(1, 2)), draw(st.integers(1, 3)))
        e = QuantizeFP8(e, block, ue8m0=draw(st.booleans()))
        # REFIT-10: no box may cut a block; every serving rank holds it whole
        dst_layout = Layout.replicated(shape, serve)
    r = recipe([Target("x", e)])
    rounds = [
        {n: random_tensor(s, getattr(torch, dtype), seed * 1000 + i)
         for i, (n, s) in enumerate(shapes.items())}
        for seed in seeds
    ]  # fmt: skip
    src = {n: _on(draw(valid_layouts(st.just(s), world=len(train))), train)
           for n, s in shapes.items()}  # fmt: skip
    ex = (
        f"refit(own recipe x = {e!r}, sources {shapes} {dtype}, world={world}, "
        f"{placement + ' ' if placement else ''}train={train}, serve={serve}, "
        f"rounds={len(seeds)})"
    )
    return {"world": world, "recipe": r, "rounds": rounds, "src": src, "dst": {"x": dst_layout},
            "ex": ex}  # fmt: skip


def _on(layout: Layout, ranks: list[int]) -> Layout:
    """``layout`` (of ranks ``0..len(ranks)-1``) on ``ranks``."""
    return layout.with_ranks(list(ranks))


FAULTS = ("shape", "missing", "layout", "recipe")


@st.composite
def refusal_cases(draw: st.DrawFn, max_world: int = 4) -> dict[str, Any]:
    """A refit case of one round and the one thing one rank gets wrong (``fault``, as
    ``Refit.refit_refused`` takes it): a source box of the wrong shape or left out, another
    destination layout than the other ranks', or a target of the recipe renamed; or, every
    rank alike, an FP8 target's scale layout that is not its weight's blocks in local order."""
    c = draw(refit_cases(max_world))
    c["rounds"] = c["rounds"][:1]
    world = c["world"]
    kind = draw(st.sampled_from(FAULTS if world > 1 else ("shape", "missing", "recipe")))
    fault: dict[str, Any] = {"kind": kind}
    if kind in ("shape", "missing"):
        held = [(n, r) for n, layout in c["src"].items() for r in range(world)
                if layout.boxes_of(r)]  # fmt: skip
        fault["name"], fault["rank"] = draw(st.sampled_from(held))
    else:
        fault["name"] = draw(st.sampled_from([t.name for t in c["recipe"].targets]))
        fault["rank"] = draw(st.integers(0, world - 1))
        if kind == "layout":
            good = c["dst"][fault["name"]]
            target = next(t for t in c["recipe"].targets if t.name == fault["name"])
            if target.quantize is not None and draw(st.booleans(), label="its scales"):
                # REFIT-7: the scales' layout given, and not its weight's blocks in local order
                assert target.scale_name is not None
                fault["name"] = target.scale_name
                good = scale_layout(good, target.quantize.block)
            on = draw(st.integers(0, world - 1))
            alt = Layout.replicated(good.shape, [on])
            if alt == good:  # the same layout: a box held twice is wrong another way
                alt = Layout.replicated(good.shape, [on, on])
            other = turned(good)
            if other is not None and draw(st.booleans(), label="the same boxes, turned"):
                alt = other  # == the good one: only one rank's local order differs
            if fault["name"] not in c["dst"]:
                # the scales' layout is given by every rank alike: REFIT-7's own refusal,
                # not the ranks' disagreement that one rank's other layout also is
                c["dst"] = {**c["dst"], fault["name"]: alt}
            fault["layout"] = alt
    c["fault"] = fault
    c["ex"] += f" fault={kind} {fault['name']!r} on rank {fault['rank']}"
    return c


def turned(layout: Layout) -> Layout | None:
    """``layout`` with the local order of the first rank holding two different boxes
    reversed, or None when no rank does."""
    for r in layout.ranks:
        if len(set(layout.boxes_of(r))) > 1:
            at = [i for i, s in enumerate(layout.shards) if s.rank == r]
            shards = list(layout.shards)
            for i, j in zip(at, reversed(at)):
                shards[i] = layout.shards[j]
            return Layout(layout.shape, shards)
    return None


KINDS = ("column", "row", "packed", "whole")


def tp_layout(
    shape: tuple[int, ...], dim: int, parts: list[int], ranks: list[int], tp: int
) -> Layout:
    """Megatron's layout of a parameter on ``ranks``: TP groups of ``tp`` consecutive ranks
    (TP innermost), each rank its chunk of every part in part order, each group a replica."""
    shards = []
    for j in range(len(ranks) // tp):
        shards += packed_layout(shape, dim, parts, ranks[j * tp : (j + 1) * tp]).shards
    return Layout(shape, shards)


@st.composite
def tp_reshard_cases(draw: st.DrawFn, max_world: int = 4) -> dict[str, Any]:
    """A Megatron-style refit: the same parameters (renamed or not) from TP x DP x PP on the
    training ranks into another TP x DP x PP on the serving ranks (parameter ``i`` is layer
    ``i``, on its pipeline stage's ranks only): column- and row-parallel weights, packed ones
    (parts split independently, as Megatron's ``partition_sizes``) and whole ones (norms),
    every split even, as Megatron's TP requires; refit once or twice."""
    world = _world(draw, max_world)
    order = draw(st.permutations(range(world)))
    placement = draw(st.sampled_from(PLACEMENTS if world > 1 else PLACEMENTS[:1]))
    if placement == "colocated":
        train = serve = order[: draw(st.integers(1, world))]
    elif placement == "disjoint":
        nt = draw(st.integers(1, world - 1))
        train, serve = order[:nt], order[nt : nt + draw(st.integers(1, world - nt))]
    else:
        train = order[: draw(st.integers(1, world))]
        serve = order[draw(st.integers(0, world - 1)) :]
    train, serve = sorted(train), sorted(serve)

    def degree(n: int) -> int:
        return draw(st.sampled_from([t for t in range(1, n + 1) if n % t == 0]))

    # Megatron's rank order: TP innermost, then DP, then PP (a stage: a run of the ranks)
    t_src, t_dst = degree(len(train)), degree(len(serve))
    p_src, p_dst = degree(len(train) // t_src), degree(len(serve) // t_dst)
    unit = math.lcm(t_src, t_dst)
    dtype = draw(st.sampled_from(["float32", "bfloat16"]))
    n = draw(st.integers(1, 3), label="parameters")

    def stage(ranks: list[int], pp: int, layer: int) -> list[int]:
        per, at = len(ranks) // pp, layer * pp // n
        return ranks[at * per : (at + 1) * per]

    targets, shapes, src, dst = [], {}, {}, {}
    for i in range(n):
        kind = draw(st.sampled_from(KINDS))
        name = f"decoder.layers.{i}.{kind}.weight"
        other = draw(st.integers(1, 3))
        on_src, on_dst = stage(train, p_src, i), stage(serve, p_dst, i)
        if kind == "whole":
            shape: tuple[int, ...] = (other,)
            src[name] = Layout.replicated(shape, on_src)
            dst_layout = Layout.replicated(shape, on_dst)
        else:
            n_parts = draw(st.integers(2, 3)) if kind == "packed" else 1
            parts = [unit * draw(st.integers(1, 3)) for _ in range(n_parts)]
            dim = 1 if kind == "row" else 0
            shape = (sum(parts), other) if dim == 0 else (other, sum(parts))
            src[name] = tp_layout(shape, dim, parts, on_src, t_src)
            dst_layout = tp_layout(shape, dim, parts, on_dst, t_dst)
        target = draw(st.sampled_from([name, "serving." + name]))
        targets.append(Target(target, Source(name)))
        shapes[name], dst[target] = shape, dst_layout
    seeds = tuple(draw(st.lists(st.integers(0, 2**16), min_size=1, max_size=2, unique=True)))
    rounds = [
        {n: random_tensor(s, getattr(torch, dtype), seed * 1000 + i)
         for i, (n, s) in enumerate(shapes.items())}
        for seed in seeds
    ]  # fmt: skip
    ex = (
        f"refit(tp reshard {[(t.name, shapes[t.expr.name]) for t in targets]} {dtype}, "
        f"world={world} {placement}, train={train} TP {t_src} PP {p_src}, serve={serve} TP "
        f"{t_dst} PP {p_dst}, rounds={len(seeds)})"
    )
    return {"world": world, "recipe": recipe(targets), "rounds": rounds, "src": src, "dst": dst,
            "ex": ex}  # fmt: skip


@st.composite
def packed_layout_cases(draw: st.DrawFn) -> dict[str, Any]:
    """Arguments of a packed serving layout (REFIT-3): q/k/v of drawn GQA ratios and KV heads
    (replicated where vLLM replicates them: fewer than the ranks, dividing them) or any 1-4
    parts (empty ones too), in units of 1-3 elements, packed along any dim of a 1-3-D tensor
    whose other dims may be 0, over 1-6 ranks named anywhere below 512, in a drawn order."""
    unit = draw(st.integers(1, 3), label="unit")
    n = draw(st.integers(1, 6), label="tp")
    ranks = draw(st.lists(st.integers(0, 511), min_size=n, max_size=n, unique=True))
    if draw(st.booleans(), label="qkv"):
        kv = draw(st.integers(1, 4), label="kv_heads")
        q = kv * draw(st.integers(1, 8), label="gqa")
        parts = [q * unit, kv * unit, kv * unit]
        replicate: tuple[int, ...] = (1, 2) if kv < n and n % kv == 0 else ()
    else:
        parts = [u * unit for u in draw(st.lists(st.integers(0, 8), min_size=1, max_size=4))]
        replicate = tuple(
            p
            for p, size in enumerate(parts)
            if (size // unit >= n or n % max(1, size // unit) == 0) and draw(st.booleans())
        )
    ndim = draw(st.integers(1, 3), label="ndim")
    dim = draw(st.integers(0, ndim - 1), label="dim")
    shape = tuple(sum(parts) if d == dim else draw(st.integers(0, 3)) for d in range(ndim))
    ex = (
        f"packed_layout(shape={shape}, dim={dim}, part_sizes={parts}, ranks={ranks}, "
        f"unit={unit}, replicate={replicate})"
    )
    return {"shape": shape, "dim": dim, "parts": parts, "ranks": ranks, "unit": unit,
            "replicate": replicate, "ex": ex}  # fmt: skip
