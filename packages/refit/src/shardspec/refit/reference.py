"""The single-process reference (REFIT-11): materialise every full source tensor, apply each
recipe expression with plain torch operations, slice each destination rank's boxes. No plan,
no geometry module, no vectorised quantizer (its own loop over blocks instead of
:func:`shardspec.refit.fp8.quantize_blocks`, so that a defect there cannot hide in both): the
simplest code that is obviously right, to judge the rest against."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from shardspec.metadata import Layout
from shardspec.reshard import reference as reshard_reference

from .errors import RefitError
from .fp8 import FP8_MAX, scale_shape
from .recipe import Cast, Concat, Expr, Pad, QuantizeFP8, Recipe, Select, Source, Stack, Transpose

if TYPE_CHECKING:
    import torch

__all__ = ["full_outputs", "materialize", "quantize", "refit", "slice_outputs"]


def materialize(
    shards: Mapping[str, Mapping[int, Sequence[torch.Tensor]]], layouts: Mapping[str, Layout]
) -> dict[str, torch.Tensor]:
    """Every full source tensor from ``shards[name][rank]`` (local order)."""
    return {n: reshard_reference.materialize(shards[n], layouts[n]) for n in layouts}


def full_outputs(recipe: Recipe, full: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every full destination tensor (FP8 scales included) from the full sources."""
    out: dict[str, torch.Tensor] = {}
    for t in recipe.targets:
        e = t.expr
        if isinstance(e, QuantizeFP8):
            q, scale = quantize(_apply(e.part, full), e.block, ue8m0=e.ue8m0)
            out[t.name] = q
            assert t.scale_name is not None
            out[t.scale_name] = scale
        else:
            out[t.name] = _apply(e, full)
    return out


def quantize(
    x: torch.Tensor, block: tuple[int, int], *, ue8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """REFIT-7..9 block by block: each block of the last two dims (anchored at element 0,
    edge blocks partial) in float32, its scale ``max|x| / 448`` (1 for an all-zero block;
    with ``ue8m0`` the least power of two at or above it, when finite), then ``x / scale``
    clamped to +-448 and cast to float8_e4m3fn; a NaN, in either, the positive quiet one."""
    import math

    import torch

    if x.dim() < 2:
        raise RefitError(f"FP8 block quantization needs at least 2 dims, got shape {x.shape}")
    xf = x.to(torch.float32)
    *lead, n, k = xf.shape
    bn, bk = block
    q = torch.empty(xf.shape, dtype=torch.float8_e4m3fn)
    scales = torch.empty(scale_shape(tuple(xf.shape), block), dtype=torch.float32)
    for idx in itertools.product(*(range(d) for d in lead)):
        for i in range(0, n, bn):
            for j in range(0, k, bk):
                part = xf[idx][i : i + bn, j : j + bk]
                amax = part.abs().max()
                s = torch.tensor(1.0) if amax.item() == 0 else amax / FP8_MAX
                if ue8m0 and math.isfinite(s.item()):
                    m, e = math.frexp(s.item())
                    s = torch.tensor(s.item() if m == 0.5 else math.ldexp(1.0, e))
                v = (part / s).clamp(-FP8_MAX, FP8_MAX)
                v[v.isnan()] = math.nan  # the positive quiet NaN, whatever the hardware made
                scales[idx][i // bn, j // bk] = math.nan if s.isnan() else s
                q[idx][i : i + bn, j : j + bk] = v.to(q.dtype)
    return q, scales


def _apply(e: Expr, full: Mapping[str, torch.Tensor]) -> torch.Tensor:
    import torch

    if isinstance(e, Source):
        if e.name not in full:
            raise RefitError(f"source {e.name!r} is missing")
        return full[e.name]
    if isinstance(e, Concat):
        return torch.cat([_apply(p, full) for p in e.parts], dim=e.dim)
    if isinstance(e, Stack):
        return torch.stack([_apply(p, full) for p in e.parts], dim=e.dim)
    if isinstance(e, Select):
        return _apply(e.part, full).select(e.dim, e.index)
    if isinstance(e, Pad):
        x = _apply(e.part, full)
        shape = list(x.shape)
        shape[e.dim] = e.size - x.shape[e.dim]
        return torch.cat([x, torch.zeros(shape, dtype=x.dtype)], dim=e.dim)
    if isinstance(e, Transpose):
        return _apply(e.part, full).transpose(e.dim0, e.dim1)
    if isinstance(e, Cast):
        return _apply(e.part, full).to(getattr(torch, e.dtype))
    raise RefitError(f"{type(e).__name__} must be the outermost step")


def slice_outputs(
    full: Mapping[str, torch.Tensor], layouts: Mapping[str, Layout]
) -> dict[str, dict[int, list[torch.Tensor]]]:
    """``[name][rank]``: each rank's boxes of each full destination tensor, in local order."""
    return {
        n: {r: [full[n][b.slices()].clone() for b in layout.boxes_of(r)] for r in layout.ranks}
        for n, layout in layouts.items()
    }


def refit(
    recipe: Recipe,
    shards: Mapping[str, Mapping[int, Sequence[torch.Tensor]]],
    src_layouts: Mapping[str, Layout],
    dst_layouts: Mapping[str, Layout],
) -> dict[str, dict[int, list[torch.Tensor]]]:
    """What every destination rank must hold, ``[name][rank]``; FP8 scales take the layout in
    ``dst_layouts`` or, absent there, their weight's blocks (:func:`scale_layout`)."""
    from .layouts import scale_layout

    layouts = dict(dst_layouts)
    for t in recipe.targets:
        q, name = t.quantize, t.scale_name
        if q is not None and name is not None and name not in layouts:
            layouts[name] = scale_layout(dst_layouts[t.name], q.block)
    full = full_outputs(recipe, materialize(shards, src_layouts))
    return slice_outputs(full, layouts)
