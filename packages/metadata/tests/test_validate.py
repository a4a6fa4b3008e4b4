"""Layout validity (spec/01-layout.md, LAYOUT-*), checked against a brute-force oracle."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, strategies as st
from metadata_oracle import box_points, is_valid, points

from shardspec.metadata import Box, Layout, LayoutError, Shard, chunk_layout
from shardspec.metadata.columns import COLUMNS_FROM, shard_columns
from shardspec.metadata.strategies import permuted, shapes, valid_layouts
from shardspec.metadata.validate import validate_columns, validate_shards


def L(shape: tuple[int, ...], *shards: tuple[tuple[int, ...], tuple[int, ...], int]) -> Layout:
    return Layout(shape, [Shard(Box(o, s), r) for o, s, r in shards])


@st.composite
def mutated_layouts(draw: st.DrawFn) -> Layout:
    """Valid layouts with a random defect (or none): a shard dropped, grown, shrunk, moved,
    duplicated, or given another ndim."""
    layout = draw(valid_layouts(shapes(max_dims=3, max_side=5), max_ranks=4))
    shards = list(layout.shards)
    if not shards:
        return layout
    i = draw(st.integers(0, len(shards) - 1))
    s = shards[i]
    action = draw(st.sampled_from(["drop", "grow", "shrink", "move", "dup", "ndim", "none"]))
    nd = s.box.ndim
    if action == "drop":
        del shards[i]
    elif action in ("grow", "shrink", "move") and nd:
        d = draw(st.integers(0, nd - 1))
        offs, sizes = list(s.box.offsets), list(s.box.sizes)
        if action == "grow":
            sizes[d] += draw(st.integers(1, 3))
        elif action == "shrink" and sizes[d]:
            sizes[d] -= 1
        else:
            offs[d] = draw(st.integers(0, layout.shape[d] + 1))
        shards[i] = Shard(Box(offs, sizes), s.rank)
    elif action == "dup":
        shards.insert(draw(st.integers(0, len(shards))), s)
    elif action == "ndim":
        shards[i] = Shard(Box((*s.box.offsets, 0), (*s.box.sizes, 1)), s.rank)
    return Layout(layout.shape, shards)


@pytest.mark.rule("LAYOUT-1", "LAYOUT-2", "LAYOUT-3")
@given(valid_layouts(shapes(max_dims=4, max_side=6)))
def test_generated_valid_layouts_validate(layout: Layout) -> None:
    assert is_valid(layout)
    layout.validate()


@pytest.mark.rule("LAYOUT-1", "LAYOUT-2", "LAYOUT-3")
@given(mutated_layouts())
def test_validate_agrees_with_brute_force(layout: Layout) -> None:
    expected = is_valid(layout)
    try:
        layout.validate()
    except LayoutError as e:
        assert not expected, f"validate() rejected a valid layout: {e}"
        _check_error_is_true(layout, e)
    else:
        assert expected, f"validate() accepted an invalid layout {layout}"


def _outcome(check: Callable[[], None]) -> LayoutError | None:
    try:
        check()
    except LayoutError as e:
        return e
    return None


@pytest.mark.rule("LAYOUT-1", "LAYOUT-2", "LAYOUT-3", "LAYOUT-4")
@given(st.one_of(mutated_layouts(), valid_layouts(shapes(max_dims=3, max_side=5))))
def test_python_and_numpy_paths_agree_with_brute_force(layout: Layout) -> None:
    """Small layouts are checked in plain Python, large ones in NumPy over their columns:
    both must accept exactly the valid layouts and report the same kind of fault, naming
    the same shards where the report order fixes them (ndim, bounds, duplicate) and a true
    overlap or gap otherwise."""
    columns = shard_columns(layout.shards, layout.ndim)
    python = _outcome(lambda: validate_shards(layout.shape, layout.shards))
    if columns is None:  # a shard of another ndim: no columns, the Python path reports it
        assert python is not None and python.kind == "ndim"
        return
    numpy = _outcome(lambda: validate_columns(layout.shape, layout.shards, columns))
    assert (python is None) == (numpy is None) == is_valid(layout), (python, numpy)
    if python is None or numpy is None:
        return
    assert python.kind == numpy.kind, (python, numpy)
    if python.kind in ("ndim", "bounds", "duplicate"):
        assert str(python) == str(numpy) and python.shards == numpy.shards
    _check_error_is_true(layout, python)
    _check_error_is_true(layout, numpy)


@pytest.mark.rule("LAYOUT-1", "LAYOUT-2", "LAYOUT-3")
def test_large_layouts_report_faults_like_small_ones() -> None:
    # Large enough that Layout keeps columns, so validate() takes the NumPy path.
    n = 4 * COLUMNS_FROM
    good = chunk_layout((n, 2), 0, list(range(n)))
    replicated = Layout(good.shape, [*good.shards, *good.with_ranks(range(n, 2 * n)).shards])
    replicated.validate()
    cases = {
        "duplicate": Layout(good.shape, [*good.shards[:9], good.shards[3], *good.shards[9:]]),
        "bounds": Layout((n - 1, 2), good.shards),
        "gap": Layout(good.shape, good.shards[:5] + good.shards[6:]),
        "ndim": Layout(good.shape, [*good.shards, Shard(Box((0,), (1,)), 0)]),
        "overlap": Layout(good.shape, [*good.shards, Shard(Box((3, 0), (2, 2)), 0)]),
        "replica duplicate": Layout(good.shape, [*replicated.shards, replicated.shards[n + 7]]),
    }
    expected = {
        "duplicate": ("duplicate", (3, 9), None),
        "bounds": ("bounds", (n - 1,), None),
        "gap": ("gap", (), (5, 0)),
        "ndim": ("ndim", (n,), None),
        "overlap": ("overlap", (3, n), None),
        "replica duplicate": ("duplicate", (n + 7, 2 * n), None),
    }
    for name, layout in cases.items():
        with pytest.raises(LayoutError) as ei:
            layout.validate()
        assert (ei.value.kind, ei.value.shards, ei.value.point) == expected[name], name
        small = _outcome(lambda lay=layout: validate_shards(lay.shape, lay.shards))
        assert small is not None and small.kind == ei.value.kind, name
        _check_error_is_true(layout, ei.value)


def _check_error_is_true(layout: Layout, e: LayoutError) -> None:
    """The error's claim must be a fact about the layout, not just any complaint."""
    shards = layout.shards
    if e.kind == "overlap":
        a, b = (shards[i] for i in e.shards)
        assert a.box != b.box and a.box.intersect(b.box) is not None, str(e)
        assert f"rank {a.rank}" in str(e) or f"{a.rank}" in str(e)
    elif e.kind == "gap":
        assert e.point is not None and e.point in set(points(layout.shape)), str(e)
        assert all(e.point not in box_points(s.box) for s in shards), str(e)
    elif e.kind == "bounds":
        (i,) = e.shards
        assert not shards[i].box.fits_in(layout.shape)
    elif e.kind == "duplicate":
        i, j = e.shards
        assert shards[i] == shards[j] and i != j
    elif e.kind == "ndim":
        (i,) = e.shards
        assert shards[i].box.ndim != layout.ndim
    else:
        raise AssertionError(f"unexpected kind {e.kind}: {e}")


@pytest.mark.rule("LAYOUT-1")
def test_out_of_bounds_names_shard_rank_and_dim() -> None:
    layout = L((5,), ((0,), (2,), 0), ((2,), (2,), 1), ((4,), (1,), 2), ((6,), (0,), 3))
    with pytest.raises(LayoutError, match=r"shard #3 on rank 3 is out of bounds in dim 0") as ei:
        layout.validate()
    assert ei.value.kind == "bounds" and ei.value.shards == (3,)


@pytest.mark.rule("LAYOUT-1")
def test_mismatched_ndim_is_named() -> None:
    with pytest.raises(LayoutError, match=r"shard #1 on rank 1 has 1 dims"):
        L((4, 4), ((0, 0), (2, 4), 0), ((2,), (2,), 1)).validate()


@pytest.mark.rule("LAYOUT-2", "BOX-2")
def test_empty_box_inside_another_is_not_an_overlap() -> None:
    # Upstream's validator reports exactly this as an overlap.
    L((4, 4), ((0, 0), (4, 4), 0), ((2, 1), (0, 2), 1)).validate()


@pytest.mark.rule("LAYOUT-2")
def test_partial_overlap_names_both_shards() -> None:
    layout = L((4, 4), ((0, 0), (2, 4), 0), ((1, 0), (3, 4), 1))
    with pytest.raises(LayoutError, match=r"#0 .* rank 0 and shard #1 .* rank 1 share") as ei:
        layout.validate()
    assert ei.value.kind == "overlap" and set(ei.value.shards) == {0, 1}
    assert "Box(offsets=(1, 0), sizes=(1, 4))" in str(ei.value)


@pytest.mark.rule("LAYOUT-2")
def test_replicas_are_identical_boxes_on_other_ranks() -> None:
    L((4,), ((0,), (4,), 0), ((0,), (4,), 1), ((0,), (4,), 2)).validate()
    L((4,), ((0,), (2,), 0), ((2,), (2,), 1), ((0,), (2,), 2), ((2,), (2,), 3)).validate()
    with pytest.raises(LayoutError, match=r"same box .* twice on rank 0"):
        L((4,), ((0,), (4,), 0), ((0,), (4,), 0)).validate()


@pytest.mark.rule("LAYOUT-3", "BOX-3")
def test_zero_dim_layouts() -> None:
    L((), ((), (), 0)).validate()
    L((), ((), (), 0), ((), (), 3)).validate()
    with pytest.raises(LayoutError, match=r"element \(\) of shape \(\)"):
        L(()).validate()


@pytest.mark.rule("LAYOUT-3")
def test_gap_names_an_uncovered_point() -> None:
    layout = L((3, 4), ((0, 0), (3, 2), 0), ((0, 2), (1, 2), 1), ((2, 2), (1, 2), 2))
    with pytest.raises(LayoutError, match=r"element \(1, 2\) of shape \(3, 4\)") as ei:
        layout.validate()
    assert ei.value.point == (1, 2)


@pytest.mark.rule("LAYOUT-3")
def test_zero_size_tensor_needs_no_coverage() -> None:
    L((0, 4)).validate()
    L((3, 0), ((0, 0), (3, 0), 0)).validate()


@pytest.mark.rule("LAYOUT-3", "LAYOUT-4")
def test_pinwheel_without_guillotine_cut() -> None:
    # Five boxes tiling a 3x3 square with no straight cut through it: the general path.
    pin = [
        ((0, 0), (2, 1), 0),
        ((0, 1), (1, 2), 1),
        ((1, 2), (2, 1), 2),
        ((2, 0), (1, 2), 3),
        ((1, 1), (1, 1), 4),
    ]
    L((3, 3), *pin).validate()
    with pytest.raises(LayoutError, match=r"element \(1, 1\)"):
        L((3, 3), *pin[:4]).validate()
    with pytest.raises(LayoutError, match="overlap"):
        L((3, 3), *pin, ((1, 1), (2, 1), 5)).validate()


@pytest.mark.rule("LAYOUT-4")
def test_large_grid_and_chunking_validate() -> None:
    # Correctness at scale; speed is measured by `nox -s bench`, not asserted here.
    n = 200
    grid = Layout(
        (n * 3, n * 2),
        [Shard(Box((i * 3, j * 2), (3, 2)), (i * n + j) % 64) for i in range(n) for j in range(n)],
    )
    grid.validate()
    chunk_layout((100_000, 3), 0, list(range(50_000))).validate()
    broken = Layout(grid.shape, grid.shards[:-1])
    with pytest.raises(LayoutError, match=r"element \(597, 398\)"):
        broken.validate()


@pytest.mark.rule("LAYOUT-5")
@given(valid_layouts(shapes(max_dims=3, max_side=5)), st.data())
def test_equality_ignores_shard_order(layout: Layout, data: st.DataObject) -> None:
    other = data.draw(permuted(layout))
    assert other == layout and hash(other) == hash(layout)
    if layout.shards:
        changed = Layout(layout.shape, layout.shards[1:])
        assert changed != layout


@pytest.mark.rule("LAYOUT-5")
def test_equality_is_per_rank() -> None:
    a = L((4,), ((0,), (2,), 0), ((2,), (2,), 1))
    b = L((4,), ((0,), (2,), 1), ((2,), (2,), 0))
    assert a != b
    assert a.shards_of(0) == (Shard(Box((0,), (2,)), 0),)


@pytest.mark.rule("LAYOUT-1", "LAYOUT-3")
def test_large_layouts_beyond_int64_still_validate() -> None:
    # Python ints have no width; a layout whose numbers leave int64 has no columns and is
    # checked from its shards, with the same rules.
    n, big = 2 * COLUMNS_FROM, 2**70
    ranks = [big + i for i in range(n)]
    Layout((n, 3), [Shard(Box((i, 0), (1, 3)), r) for i, r in enumerate(ranks)]).validate()
    wide = Layout((n, big), [Shard(Box((i, 0), (1, big)), i) for i in range(n)])
    wide.validate()
    with pytest.raises(LayoutError) as ei:
        Layout((n, big), [*wide.shards[:-1], Shard(Box((n - 1, 1), (1, big - 1)), 0)]).validate()
    assert (ei.value.kind, ei.value.point) == ("gap", (n - 1, 0))
