"""Hypothesis strategies for refit recipes (needs ``hypothesis``; install the ``testing``
extra): the geometric expressions a user's own recipe is made of."""

from __future__ import annotations

from hypothesis import strategies as st

from .geometry import geometry
from .recipe import Expr, Pad, Select, Transpose, concat, stack

__all__ = ["geometric_exprs"]


@st.composite
def geometric_exprs(draw: st.DrawFn) -> tuple[Expr, dict[str, tuple[int, ...]]]:
    """``(expr, source shapes)``: a concatenation of 1-3 sources ``s0..`` of shape ``(m, k)``
    (``m`` 0-5, so empty parts too; packed or plain), maybe stacked with a second one of
    sources ``t0..`` along a drawn dim, then 0-2 steps each a pad (to 16: every dim is
    under it), a transpose or a slice (an unstack's ``Select``)."""
    k = draw(st.integers(1, 4))
    rows = draw(st.lists(st.integers(0, 5), min_size=1, max_size=3))
    names = [f"s{i}" for i in range(len(rows))]
    shapes: dict[str, tuple[int, ...]] = {n: (m, k) for n, m in zip(names, rows)}
    e: Expr = concat(names, 0, packed=draw(st.booleans()))
    if draw(st.booleans()):
        others = [f"t{i}" for i in range(len(rows))]
        shapes |= {o: (m, k) for o, m in zip(others, rows)}
        e = stack([e, concat(others, 0)], draw(st.integers(0, 2)))
    nd = 2 + (1 if "t0" in shapes else 0)
    for _ in range(draw(st.integers(0, 2))):
        step = draw(st.sampled_from(["pad", "transpose", "select"]))
        if step == "pad":
            e = Pad(e, draw(st.integers(0, nd - 1)), 16)
        elif step == "transpose":
            e = Transpose(e, draw(st.integers(0, nd - 1)), draw(st.integers(0, nd - 1)))
        elif nd > 1:
            shape = geometry(e, shapes, "x").shape
            d = draw(st.integers(0, nd - 1))
            if shape[d]:
                e = Select(e, d, draw(st.integers(0, shape[d] - 1)))
                nd -= 1
    return e, shapes
