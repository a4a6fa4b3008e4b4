"""Cases for the refit tests: the driver builds sources, layouts and the reference's answer;
the ranks (functions below, called through the pool) run :func:`shardspec.refit.refit`.
Recipes travel as their data form (the pool carries no pickles)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st

from shardspec.metadata import Layout
from shardspec.metadata.strategies import valid_layouts
from shardspec.refit import (
    Recipe,
    RefitError,
    Target,
    recipe,
    recipe_from_data,
    recipe_to_data,
    reference,
    refit,
    scale_layout,
)
from shardspec.refit.geometry import geometry
from shardspec.refit.strategies import geometric_exprs
from shardspec.reshard.reference import same_bits
from shardspec.testing.tensors import random_tensor

WORLD = 4

# ---------------------------------------------------------------- driver side


@dataclass
class Case:
    name: str
    recipe: Recipe
    full: dict[str, torch.Tensor]
    src: dict[str, Layout]
    dst: dict[str, Layout]
    budget: int | None = None

    def shards(self) -> dict[str, dict[int, list[torch.Tensor]]]:
        return {
            n: {
                r: [t[b.slices()].clone() for b in self.src[n].boxes_of(r)]
                for r in self.src[n].ranks
            }
            for n, t in self.full.items()
        }

    def state(self, rank: int) -> dict[str, list[torch.Tensor]]:
        return {n: by_rank[rank] for n, by_rank in self.shards().items() if rank in by_rank}

    def out_layouts(self) -> dict[str, Layout]:
        layouts = dict(self.dst)
        for t in self.recipe.targets:
            q, name = t.quantize, t.scale_name
            if q is not None and name is not None and name not in layouts:
                layouts[name] = scale_layout(self.dst[t.name], q.block)
        return layouts

    def expected(self) -> dict[str, dict[int, list[torch.Tensor]]]:
        return reference.refit(self.recipe, self.shards(), self.src, self.dst)

    def args(self, rank: int, dtypes: dict[str, torch.dtype] | None = None) -> tuple[Any, ...]:
        """(recipe data, state, src, dst, out tensors filled with a marker, budget)."""
        out = {}
        want = self.expected()
        for n, layout in self.out_layouts().items():
            boxes = layout.boxes_of(rank)
            if boxes:
                kind = (dtypes or {}).get(n) or want[n][rank][0].dtype
                out[n] = [marker(b.sizes, kind) for b in boxes]
        return (recipe_to_data(self.recipe), self.state(rank), self.src, self.dst, out, self.budget)


def marker(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A recognisable filler (7) for out tensors: a refused refit must leave it in place."""
    return torch.full(shape, 7, dtype=torch.float32).to(dtype)


def check(case: Case, answers: list[Any], world: int) -> None:
    """Every rank's outputs equal the reference bit for bit, in place."""
    want = case.expected()
    for r in range(world):
        got = answers[r]
        assert got[0] == "ok", f"[{case.name}] rank {r} raised {got[1]}"
        results, in_place = got[1], got[2]
        assert in_place, f"[{case.name}] rank {r}: an out tensor's storage moved"
        for n, by_rank in want.items():
            exp = by_rank.get(r, [])
            have = results.get(n, [])
            assert len(have) == len(exp), f"[{case.name}] {n} rank {r}: {len(have)} tensors"
            for k, (a, b) in enumerate(zip(have, exp)):
                assert same_bits(a, b), f"[{case.name}] {n!r} rank {r} box #{k}: {a} should be {b}"


@st.composite
def geometric_cases(
    draw: st.DrawFn,
) -> tuple[Recipe, dict[str, torch.Tensor], dict[str, Layout], dict[str, Layout]]:
    """A concat of 1-3 parts (packed or plain), maybe stacked with a second one, padded,
    transposed or sliced; drawn layouts on both sides, several boxes per rank included."""
    e, shapes = draw(geometric_exprs())
    r = recipe([Target("x", e)])
    shape = geometry(e, shapes, "x").shape
    full = {
        n: random_tensor(s, torch.float32, draw(st.integers(0, 2**20))) for n, s in shapes.items()
    }
    src = {n: draw(valid_layouts(st.just(s), world=WORLD)) for n, s in shapes.items()}
    dst = {"x": draw(valid_layouts(st.just(shape), world=WORLD))}
    return r, full, src, dst


# ---------------------------------------------------------------- rank side


def run_refit(
    rank: int,
    world: int,
    recipe_data: Any,
    state: dict[str, list[torch.Tensor]],
    src: dict[str, Layout],
    dst: dict[str, Layout],
    out: dict[str, list[torch.Tensor]],
    budget: int | None,
) -> tuple[Any, ...]:
    """("ok", results, in place) or ("err", message, out tensors untouched)."""
    r = recipe_from_data(recipe_data)
    before = {n: [t.clone() for t in ts] for n, ts in out.items()}
    ptrs = {n: [t.data_ptr() for t in ts] for n, ts in out.items()}
    try:
        res = refit(r, state, src, dst, out=out, max_buffer_bytes=budget)
    except RefitError as e:
        untouched = all(same_bits(a, b) for n in out for a, b in zip(out[n], before[n]))
        return ("err", str(e), untouched)
    in_place = all(
        res[n][i].data_ptr() == p and out[n][i].data_ptr() == p
        for n, ps in ptrs.items()
        for i, p in enumerate(ps)
    )
    return ("ok", {n: [t.clone() for t in ts] for n, ts in res.items()}, in_place)


def run_twice(
    rank: int,
    world: int,
    recipe_data: Any,
    first: dict[str, list[torch.Tensor]],
    second: dict[str, list[torch.Tensor]],
    src: dict[str, Layout],
    dst: dict[str, Layout],
    out: dict[str, list[torch.Tensor]],
    budget: int | None,
) -> tuple[Any, ...]:
    """Two refits into the same out tensors, the sources changed in between (in place, as a
    training step changes them): each result, whether storage stayed put, the cache hits."""
    from shardspec.refit.executor import plan_cache_info

    r = recipe_from_data(recipe_data)
    ptrs = [t.data_ptr() for ts in out.values() for t in ts]
    one = refit(r, first, src, dst, out=out)
    snap = {n: [t.clone() for t in ts] for n, ts in one.items()}
    for n, ts in first.items():
        for a, b in zip(ts, second[n]):
            a.copy_(b)  # the training side's tensors change in place between syncs
    hits = plan_cache_info()["hits"]
    two = refit(r, first, src, dst, out=out)
    hit = plan_cache_info()["hits"] - hits
    same = ptrs == [t.data_ptr() for ts in two.values() for t in ts]
    return snap, {n: [t.clone() for t in ts] for n, ts in two.items()}, same, hit


def run_engine(
    rank: int,
    world: int,
    recipe_data: Any,
    state: dict[str, list[torch.Tensor]],
    src: dict[str, Layout],
    dst: dict[str, Layout],
    dim: int,
) -> tuple[Any, ...]:
    """Each serving rank holds one engine tensor per destination (its boxes end to end along
    ``dim``, as vLLM's packed parameters); refit writes through ``split_local`` views. Returns
    the engine tensors and whether their storage stayed put."""
    from shardspec.refit import split_local

    engines = {}
    for n, layout in dst.items():
        boxes = layout.boxes_of(rank)
        if boxes:
            shape = list(boxes[0].sizes)
            shape[dim] = sum(b.sizes[dim] for b in boxes)
            engines[n] = torch.full(shape, 7.0)
    ptrs = {n: t.data_ptr() for n, t in engines.items()}
    out = {n: split_local(t, dst[n], rank, dim) for n, t in engines.items()}
    refit(recipe_from_data(recipe_data), state, src, dst, out=out)
    return engines, all(t.data_ptr() == ptrs[n] for n, t in engines.items())
