"""Recipes as data: each destination tensor is an expression over source tensors, built from a
fixed vocabulary of frozen dataclasses (spec/10-refit.md, REFIT-1).

The geometric steps (:class:`Source`, :class:`Concat`, :class:`Stack`, :class:`Select`,
:class:`Pad`, :class:`Transpose`) only say where each element goes; the value steps
(:class:`Cast`, :class:`QuantizeFP8`) change bytes and may only wrap the whole expression, so
that every element of the destination comes from exactly one source element (or is padding)
before any value is computed. Dtypes are names (``"bfloat16"``), so a recipe needs no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from .errors import RefitError

__all__ = [
    "Cast",
    "Concat",
    "Expr",
    "Pad",
    "QuantizeFP8",
    "Recipe",
    "Select",
    "Source",
    "Stack",
    "Target",
    "Transpose",
    "concat",
    "pad",
    "quantize_fp8",
    "recipe",
    "rename",
    "scale_name_for",
    "stack",
    "unstack",
]


@dataclass(frozen=True)
class Source:
    """The source tensor ``name``, whole."""

    name: str


@dataclass(frozen=True)
class Concat:
    """``parts`` joined along ``dim``. ``packed`` says how a tensor-parallel destination holds
    it (each rank its chunk of each part, in part order: :func:`shardspec.refit.packed_layout`);
    the global tensor is the same either way."""

    parts: tuple[Expr, ...]
    dim: int
    packed: bool = False


@dataclass(frozen=True)
class Stack:
    """``parts`` stacked along a new dim ``dim`` (experts: ``[E, ...]``)."""

    parts: tuple[Expr, ...]
    dim: int = 0


@dataclass(frozen=True)
class Select:
    """Slice ``index`` of ``dim`` of ``part``, that dim removed (one tensor of an unstack)."""

    part: Expr
    dim: int
    index: int


@dataclass(frozen=True)
class Pad:
    """``part`` grown along ``dim`` to ``size`` elements; the new elements are zero."""

    part: Expr
    dim: int
    size: int


@dataclass(frozen=True)
class Transpose:
    part: Expr
    dim0: int
    dim1: int


@dataclass(frozen=True)
class Cast:
    """``part`` converted to ``dtype`` (a torch dtype name) as ``Tensor.to`` converts."""

    part: Expr
    dtype: str


@dataclass(frozen=True)
class QuantizeFP8:
    """``part`` as float8_e4m3fn with one float32 scale per ``block`` of its last two dims
    (REFIT-7..9); the scales are the destination tensor ``scale_name`` (default:
    :func:`scale_name_for`)."""

    part: Expr
    block: tuple[int, int] = (128, 128)
    ue8m0: bool = False
    scale_name: str | None = None


Expr: TypeAlias = Source | Concat | Stack | Select | Pad | Transpose | Cast | QuantizeFP8
GEOMETRIC = (Source, Concat, Stack, Select, Pad, Transpose)


@dataclass(frozen=True)
class Target:
    """Destination tensor ``name`` is ``expr``."""

    name: str
    expr: Expr

    def sources(self) -> tuple[str, ...]:
        """The sources the expression names, in first-use order (a part selected or padded
        away included: the destination's dtype is theirs)."""
        return tuple(dict.fromkeys(_sources(self.expr)))

    @property
    def quantize(self) -> QuantizeFP8 | None:
        return self.expr if isinstance(self.expr, QuantizeFP8) else None

    @property
    def scale_name(self) -> str | None:
        q = self.quantize
        if q is None:
            return None
        return q.scale_name if q.scale_name is not None else scale_name_for(self.name)


@dataclass(frozen=True)
class Recipe:
    """The destination tensors, in order. Build with :func:`recipe`, which checks it."""

    targets: tuple[Target, ...]

    def sources(self) -> list[str]:
        """Every source name the recipe reads, in first-use order."""
        seen: dict[str, None] = {}
        for t in self.targets:
            for name in _sources(t.expr):
                seen.setdefault(name, None)
        return list(seen)

    def outputs(self) -> list[str]:
        """Every destination name: the targets, each FP8 target followed by its scales."""
        names = []
        for t in self.targets:
            names.append(t.name)
            if t.scale_name is not None:
                names.append(t.scale_name)
        return names


def scale_name_for(name: str) -> str:
    """vLLM's name for the scales of ``name``: ``x.weight`` -> ``x.weight_scale_inv``."""
    return name + "_scale_inv"


def _sources(e: Expr) -> Iterable[str]:
    if isinstance(e, Source):
        yield e.name
    elif isinstance(e, (Concat, Stack)):
        for p in e.parts:
            yield from _sources(p)
    else:
        yield from _sources(e.part)


def _check_expr(e: Expr, name: str, top: bool) -> None:
    if isinstance(e, QuantizeFP8):
        if not top:
            raise RefitError(f"destination {name!r}: QuantizeFP8 must be the outermost step")
        ok = isinstance(e.block, tuple) and len(e.block) == 2
        if not ok or any(not isinstance(b, int) or b < 1 for b in e.block):
            raise RefitError(
                f"destination {name!r}: block must be a tuple of two positive ints: {e.block}"
            )
        _check_expr(e.part, name, top=isinstance(e.part, Cast))
    elif isinstance(e, Cast):
        if not top:
            raise RefitError(
                f"destination {name!r}: Cast must wrap the whole expression (or sit just "
                "inside QuantizeFP8): values change only after every element is placed"
            )
        _check_expr(e.part, name, top=False)
    elif isinstance(e, (Concat, Stack)):
        if not e.parts:
            raise RefitError(f"destination {name!r}: {type(e).__name__} of no parts")
        for p in e.parts:
            _check_expr(p, name, top=False)
    elif isinstance(e, Source):
        if not isinstance(e.name, str) or not e.name:
            raise RefitError(f"destination {name!r}: a source name must be a non-empty str")
    elif isinstance(e, (Select, Pad, Transpose)):
        _check_expr(e.part, name, top=False)
    else:
        raise RefitError(f"destination {name!r}: {e!r} is not a recipe step")


def recipe(targets: Iterable[Target]) -> Recipe:
    """A checked :class:`Recipe`: every step from the vocabulary, value steps outermost,
    destination names (scales included) unique."""
    ts = tuple(targets)
    seen: set[str] = set()
    for t in ts:
        if not isinstance(t, Target):
            raise RefitError(f"a recipe holds Targets, got {t!r}")
        _check_expr(t.expr, t.name, top=True)
        for n in (t.name, t.scale_name):
            if n is None:
                continue
            if n in seen:
                raise RefitError(f"destination {n!r} is defined twice in the recipe")
            seen.add(n)
    return Recipe(ts)


# -- builders: the plain functions to write one's own recipe ---------------------------------


def _expr(x: Expr | str) -> Expr:
    return Source(x) if isinstance(x, str) else x


def rename(dst: str, src: str) -> Target:
    return Target(dst, Source(src))


def concat(parts: Sequence[Expr | str], dim: int = 0, *, packed: bool = True) -> Concat:
    return Concat(tuple(map(_expr, parts)), dim, packed)


def stack(parts: Sequence[Expr | str], dim: int = 0) -> Stack:
    return Stack(tuple(map(_expr, parts)), dim)


def pad(part: Expr | str, dim: int, size: int) -> Pad:
    return Pad(_expr(part), dim, size)


def quantize_fp8(
    part: Expr | str, block: tuple[int, int] = (128, 128), *, ue8m0: bool = False
) -> QuantizeFP8:
    return QuantizeFP8(_expr(part), tuple(block), ue8m0)  # type: ignore[arg-type]


def unstack(names: Sequence[str], src: Expr | str, dim: int = 0) -> list[Target]:
    """One target per slice of ``dim`` of ``src``: ``names[i]`` is slice ``i``."""
    e = _expr(src)
    return [Target(n, Select(e, dim, i)) for i, n in enumerate(names)]
