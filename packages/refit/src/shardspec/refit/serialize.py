"""A recipe as plain JSON-able data (lists, strings, ints, bools), and back, refusing anything
else: how a recipe travels to ranks or into a file without pickle (REFIT-1)."""

from __future__ import annotations

import dataclasses
from typing import Any

from .errors import RefitError
from .recipe import (
    Cast,
    Concat,
    Expr,
    Pad,
    QuantizeFP8,
    Recipe,
    Select,
    Source,
    Stack,
    Target,
    Transpose,
    recipe,
)

__all__ = ["recipe_from_data", "recipe_to_data"]

_KINDS: dict[str, type[Any]] = {
    c.__name__: c for c in (Source, Concat, Stack, Select, Pad, Transpose, Cast, QuantizeFP8)
}


def _expr_to_data(e: Expr) -> list[Any]:
    out: list[Any] = [type(e).__name__]
    for f in dataclasses.fields(e):
        v = getattr(e, f.name)
        if f.name == "parts":
            v = [_expr_to_data(p) for p in v]
        elif f.name == "part":
            v = _expr_to_data(v)
        elif isinstance(v, tuple):
            v = list(v)
        out.append(v)
    return out


def recipe_to_data(r: Recipe) -> list[Any]:
    return [[t.name, _expr_to_data(t.expr)] for t in r.targets]


def _expr_from_data(obj: Any) -> Expr:
    if not isinstance(obj, list) or not obj or obj[0] not in _KINDS:
        raise RefitError(f"not a recipe step: {obj!r:.80}")
    cls = _KINDS[obj[0]]
    fields = dataclasses.fields(cls)
    if len(obj) - 1 != len(fields):
        raise RefitError(f"{obj[0]} takes {len(fields)} fields, got {len(obj) - 1}")
    args: list[Any] = []
    for f, v in zip(fields, obj[1:]):
        if f.name == "parts":
            if not isinstance(v, list):
                raise RefitError(f"{obj[0]}.parts must be a list")
            v = tuple(_expr_from_data(p) for p in v)
        elif f.name == "part":
            v = _expr_from_data(v)
        elif f.name == "block":
            if not isinstance(v, list) or not all(type(b) is int for b in v):
                raise RefitError(f"{obj[0]}.block must be a list of ints")
            v = tuple(v)
        elif f.name in ("packed", "ue8m0"):
            if type(v) is not bool:
                raise RefitError(f"{obj[0]}.{f.name} must be a bool")
        elif f.name in ("name", "dtype", "scale_name"):
            if not (isinstance(v, str) or (v is None and f.name == "scale_name")):
                raise RefitError(f"{obj[0]}.{f.name} must be a str")
        elif type(v) is not int:
            raise RefitError(f"{obj[0]}.{f.name} must be an int")
        args.append(v)
    e: Expr = cls(*args)
    return e


def recipe_from_data(obj: Any) -> Recipe:
    if not isinstance(obj, list):
        raise RefitError("a recipe's data is a list of [name, step] pairs")
    targets = []
    for item in obj:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            raise RefitError(f"not a [name, step] pair: {item!r:.80}")
        targets.append(Target(item[0], _expr_from_data(item[1])))
    return recipe(targets)
