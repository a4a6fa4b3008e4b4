"""Where every element of a destination tensor comes from: the geometric steps of a recipe
folded into a list of parts, each a box of the destination filled either by a box of one
source tensor (its dims permuted, size-1 dims added or dropped) or by zeros (padding).
Plain integers, no torch; the planner and the reference both stand on it (REFIT-2)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shardspec.metadata import Box

from .errors import RefitError
from .recipe import Cast, Concat, Expr, Pad, QuantizeFP8, Select, Source, Stack, Transpose

__all__ = ["Geometry", "Part", "geometry", "value_steps"]


@dataclass(frozen=True)
class Part:
    """``region`` (destination coordinates) holds source ``source`` at ``src_offsets`` on;
    destination dim ``d`` runs along source dim ``dims[d]`` (None: a dim of size 1 that the
    source lacks). Source dims no destination dim names have size 1 in the part. A part with
    ``source`` None is padding: zeros."""

    region: Box
    source: str | None = None
    src_offsets: tuple[int, ...] = ()
    dims: tuple[int | None, ...] = ()

    def src_box(self) -> Box:
        """The box of the source this part reads."""
        sizes = [1] * len(self.src_offsets)
        for d, p in enumerate(self.dims):
            if p is not None:
                sizes[p] = self.region.sizes[d]
        return Box(self.src_offsets, sizes)

    def to_source(self, sub: Box) -> Box:
        """``sub`` (a box of ``region``, destination coordinates) in source coordinates."""
        offs = list(self.src_offsets)
        sizes = [1] * len(offs)
        for d, p in enumerate(self.dims):
            if p is not None:
                offs[p] += sub.offsets[d] - self.region.offsets[d]
                sizes[p] = sub.sizes[d]
        return Box(offs, sizes)


@dataclass(frozen=True)
class Geometry:
    shape: tuple[int, ...]
    parts: tuple[Part, ...]


def value_steps(e: Expr) -> tuple[Expr, list[Cast | QuantizeFP8]]:
    """The geometric core of ``e`` and its value steps, innermost first."""
    steps: list[Cast | QuantizeFP8] = []
    while isinstance(e, (Cast, QuantizeFP8)):
        steps.append(e)
        e = e.part
    return e, steps[::-1]


def _dim(d: int, ndim: int, what: str, name: str) -> int:
    if not isinstance(d, int) or not -ndim <= d < ndim:
        raise RefitError(f"destination {name!r}: {what} dim {d} is out of range for {ndim} dims")
    return d % ndim


def geometry(e: Expr, shapes: Mapping[str, tuple[int, ...]], name: str) -> Geometry:
    """The shape and parts of geometric expression ``e`` given the source ``shapes``."""
    if isinstance(e, Source):
        if e.name not in shapes:
            raise RefitError(f"destination {name!r}: source {e.name!r} is missing")
        shape = tuple(shapes[e.name])
        nd = len(shape)
        return Geometry(shape, (Part(Box((0,) * nd, shape), e.name, (0,) * nd, tuple(range(nd))),))
    if isinstance(e, (Concat, Stack)):
        subs = [geometry(p, shapes, name) for p in e.parts]
        nd = len(subs[0].shape) + (1 if isinstance(e, Stack) else 0)
        d = _dim(e.dim, nd, type(e).__name__, name)
        parts: list[Part] = []
        if isinstance(e, Stack):
            for i, g in enumerate(subs):
                if g.shape != subs[0].shape:
                    raise RefitError(
                        f"destination {name!r}: Stack parts differ in shape: {subs[0].shape} "
                        f"and {g.shape} (part {i})"
                    )
                parts += [_insert(p, d, i) for p in g.parts]
            shape = subs[0].shape[:d] + (len(subs),) + subs[0].shape[d:]
            return Geometry(shape, tuple(parts))
        at = 0
        for i, g in enumerate(subs):
            rest = g.shape[:d] + g.shape[d + 1 :]
            if len(g.shape) != nd or rest != subs[0].shape[:d] + subs[0].shape[d + 1 :]:
                raise RefitError(
                    f"destination {name!r}: Concat along dim {d}: part {i} has shape "
                    f"{g.shape}, part 0 {subs[0].shape}"
                )
            parts += [_shift(p, d, at) for p in g.parts]
            at += g.shape[d]
        shape = subs[0].shape[:d] + (at,) + subs[0].shape[d + 1 :]
        return Geometry(shape, tuple(parts))
    if isinstance(e, Pad):
        g = geometry(e.part, shapes, name)
        d = _dim(e.dim, len(g.shape), "Pad", name)
        if not isinstance(e.size, int) or e.size < g.shape[d]:
            raise RefitError(
                f"destination {name!r}: Pad to {e.size} along dim {d} of shape {g.shape}: "
                "padding never shrinks"
            )
        shape = g.shape[:d] + (e.size,) + g.shape[d + 1 :]
        extra = tuple(
            (g.shape[d] if i == d else 0, e.size - g.shape[d] if i == d else n)
            for i, n in enumerate(shape)
        )
        zeros = Part(Box(tuple(o for o, _ in extra), tuple(s for _, s in extra)))
        return Geometry(shape, g.parts + ((zeros,) if e.size > g.shape[d] else ()))
    if isinstance(e, Transpose):
        g = geometry(e.part, shapes, name)
        a = _dim(e.dim0, len(g.shape), "Transpose", name)
        b = _dim(e.dim1, len(g.shape), "Transpose", name)
        return Geometry(_swap(g.shape, a, b), tuple(_swap_part(p, a, b) for p in g.parts))
    if isinstance(e, Select):
        g = geometry(e.part, shapes, name)
        d = _dim(e.dim, len(g.shape), "Select", name)
        if not isinstance(e.index, int) or not 0 <= e.index < g.shape[d]:
            raise RefitError(
                f"destination {name!r}: Select index {e.index} of dim {d} of shape {g.shape}"
            )
        kept = [_select(p, d, e.index) for p in g.parts]
        return Geometry(g.shape[:d] + g.shape[d + 1 :], tuple(p for p in kept if p is not None))
    raise RefitError(f"destination {name!r}: {type(e).__name__} must be the outermost step")


def _shift(p: Part, d: int, by: int) -> Part:
    offs = list(p.region.offsets)
    offs[d] += by
    return Part(Box(offs, p.region.sizes), p.source, p.src_offsets, p.dims)


def _insert(p: Part, d: int, i: int) -> Part:
    r = p.region
    region = Box(r.offsets[:d] + (i,) + r.offsets[d:], r.sizes[:d] + (1,) + r.sizes[d:])
    dims = p.dims[:d] + (None,) + p.dims[d:] if p.source is not None else ()
    return Part(region, p.source, p.src_offsets, dims)


def _swap(t: tuple[int, ...], a: int, b: int) -> tuple[int, ...]:
    u = list(t)
    u[a], u[b] = u[b], u[a]
    return tuple(u)


def _swap_part(p: Part, a: int, b: int) -> Part:
    region = Box(_swap(p.region.offsets, a, b), _swap(p.region.sizes, a, b))
    if p.source is None:
        return Part(region)
    dims = list(p.dims)
    dims[a], dims[b] = dims[b], dims[a]
    return Part(region, p.source, p.src_offsets, tuple(dims))


def _select(p: Part, d: int, index: int) -> Part | None:
    r = p.region
    if not r.offsets[d] <= index < r.offsets[d] + r.sizes[d]:
        return None
    region = Box(r.offsets[:d] + r.offsets[d + 1 :], r.sizes[:d] + r.sizes[d + 1 :])
    if p.source is None:
        return Part(region)
    offs = list(p.src_offsets)
    q = p.dims[d]
    if q is not None:
        offs[q] += index - r.offsets[d]
    return Part(region, p.source, tuple(offs), p.dims[:d] + p.dims[d + 1 :])
