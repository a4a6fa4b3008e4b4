"""Validation is exact at any integer size (spec/01-layout.md, LAYOUT-6).

Large layouts are validated in NumPy over int64 columns; values near 2**62 and 2**63 are
where a sum of two of them wraps. These tests scale layouts up to and past that, so both
paths are driven where they differ, and hold the NumPy path to the exact Python one.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, strategies as st

from shardspec.metadata import Box, Layout, LayoutError, Shard, chunk_layout
from shardspec.metadata.columns import COLUMNS_FROM, INT_LIMIT
from shardspec.metadata.validate import validate_shards

# Scale factors around the int64 edges, and plain ones for contrast.
FACTORS = st.sampled_from([1, 3, 2**30, 2**61, 2**61 + 1, 2**62 - 1, 2**62, 2**63, 2**64 + 5])


def _outcome(check: Callable[[], object]) -> LayoutError | None:
    try:
        check()
    except LayoutError as e:
        return e
    return None


@st.composite
def scaled_large_layouts(draw: st.DrawFn) -> Layout:
    """A chunking of at least COLUMNS_FROM shards (so Layout keeps columns when it can),
    every coordinate of one dim scaled by a factor near the int64 edges, then perhaps one
    shard moved or grown by a little or a lot."""
    n = draw(st.integers(COLUMNS_FROM, COLUMNS_FROM + 8))
    cols = draw(st.integers(1, 3))
    dim = draw(st.integers(0, 1))
    f = draw(FACTORS)
    base = chunk_layout((n, cols), 0, list(range(n)))

    def scale(t: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(v * f if d == dim else v for d, v in enumerate(t))

    shards = [Shard(Box(scale(s.box.offsets), scale(s.box.sizes)), s.rank) for s in base.shards]
    shape = scale(base.shape)
    action = draw(st.sampled_from(["none", "move", "grow", "far"]))
    if action != "none":
        i = draw(st.integers(0, n - 1))
        offs, sizes = list(shards[i].box.offsets), list(shards[i].box.sizes)
        d = draw(st.integers(0, 1))
        if action == "move":
            offs[d] += draw(st.sampled_from([1, f, 2**62, 2**63 - offs[d] - sizes[d]]))
        elif action == "grow":
            sizes[d] += draw(st.sampled_from([1, f, 2**62, 2**63 - offs[d] - sizes[d]]))
        else:
            offs[d] = draw(st.sampled_from([2**62 - 1, 2**62, 2**63 - 1, 2**63, 2**64]))
        shards[i] = Shard(Box([max(o, 0) for o in offs], [max(s, 0) for s in sizes]), i)
    return Layout(shape, shards)


@pytest.mark.rule("LAYOUT-6")
@given(scaled_large_layouts())
def test_numpy_path_agrees_with_exact_python_at_any_size(layout: Layout) -> None:
    """Scaling a dim keeps a layout's validity, and the Python path (exact ints) is the
    oracle: validate() must give its verdict, kind and shards at every size."""
    exact = _outcome(lambda: validate_shards(layout.shape, layout.shards))
    got = _outcome(layout.validate)
    assert (exact is None) == (got is None), (exact, got)
    if exact is not None and got is not None:
        assert (got.kind, got.shards, got.point) == (exact.kind, exact.shards, exact.point)


@pytest.mark.rule("LAYOUT-6")
@pytest.mark.parametrize(
    ("offset", "size"),
    [
        (2**62, 2**62),  # the sum is 2**63: wraps to -2**63 in int64
        (2**63 - 1, 1),
        (2**62 - 1, 2**62),
        (2**63, 2**63),  # each beyond int64
        (2**64 + 1, 0),
        (2**200, 1),
    ],
)
def test_a_shard_far_out_of_bounds_is_reported_at_any_size(offset: int, size: int) -> None:
    n = COLUMNS_FROM
    shards = [Shard(Box((i,), (1,)), 0) for i in range(n)]
    layout = Layout((n,), [*shards, Shard(Box((offset,), (size,)), 1)])
    with pytest.raises(LayoutError) as ei:
        layout.validate()
    assert (ei.value.kind, ei.value.shards) == ("bounds", (n,))
    assert f"ends at {offset + size}" in str(ei.value)


@pytest.mark.rule("LAYOUT-6")
@pytest.mark.parametrize("extent", [INT_LIMIT, 2**62, 2**63 - 1, 2**63, 2**64, 10**30])
def test_shapes_beyond_int64_are_layout_errors_never_overflow(extent: int) -> None:
    """A shape as large as Python allows is validated, never an OverflowError: the gap
    a 64-row tiling leaves in a dim of ``extent`` rows is a true gap."""
    n = COLUMNS_FROM
    layout = Layout((extent,), [Shard(Box((i,), (1,)), 0) for i in range(n)])
    with pytest.raises(LayoutError) as ei:
        layout.validate()
    assert (ei.value.kind, ei.value.point) == ("gap", (n,))
    assert str(extent) in str(ei.value)
    last = Shard(Box((n,), (extent - n,)), 0)
    Layout((extent,), [*layout.shards, last]).validate()  # and the completed one is valid


@pytest.mark.rule("LAYOUT-6")
def test_ints_too_long_to_print_are_shortened_in_messages() -> None:
    # str() refuses ints above 4300 digits (ValueError); a message must still come out.
    huge = 10**5000
    n = COLUMNS_FROM
    layout = Layout(
        (n,), [*(Shard(Box((i,), (1,)), 0) for i in range(n)), Shard(Box((huge,), (1,)), huge)]
    )
    with pytest.raises(LayoutError, match="bits") as ei:
        layout.validate()
    assert ei.value.kind == "bounds" and len(str(ei.value)) < 400
    assert "int of" in repr(layout.shards[-1])
