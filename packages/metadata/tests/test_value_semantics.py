"""Box, Shard and Layout as values (spec/01-layout.md, BOX-1, LAYOUT-5, LAYOUT-7): equality
with other types, immutability, pickling, length and how long integers print.

Expectations are worked by hand from the rules and the docstrings.
"""

from __future__ import annotations

import pickle
import re

import pytest

from shardspec.metadata import Box, Layout, LayoutError, Shard, chunk_layout


class _Index:
    """An integer that is not an int: what numpy or a 0-d torch integer looks like."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


class _BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


@pytest.mark.rule("BOX-1")
def test_box_from_bounds_refuses_stops_before_starts() -> None:
    # [0, 2) x [3, 5) is the box at offsets (0, 3) with sizes (2, 2); a stop equal to its start
    # is an empty interval, allowed; a stop one below its start is refused.
    assert Box.from_bounds((0, 3), (2, 5)) == Box((0, 3), (2, 2))
    assert Box.from_bounds((4,), (4,)) == Box((4,), (0,))
    with pytest.raises(LayoutError, match="lie before starts"):
        Box.from_bounds((0, 3), (2, 2))
    with pytest.raises(LayoutError, match="lie before starts"):
        Box.from_bounds((5,), (0,))
    with pytest.raises(LayoutError, match="differ in length"):
        Box.from_bounds((0, 0), (1,))


@pytest.mark.rule("BOX-1", "LAYOUT-5")
def test_box_equality_with_other_types() -> None:
    b = Box((1, 2), (3, 4))
    assert b.__eq__(((1, 2), (3, 4))) is NotImplemented
    assert b.__eq__("Box(offsets=(1, 2), sizes=(3, 4))") is NotImplemented
    assert (b == ((1, 2), (3, 4))) is False
    assert (b == [(1, 3), (2, 4)]) is False  # what iterating the box gives
    assert b != object()
    assert b != Shard(b, 0)


@pytest.mark.rule("LAYOUT-5")
def test_shard_equality_with_other_types() -> None:
    s = Shard(Box((0,), (4,)), 1)
    assert s.__eq__((Box((0,), (4,)), 1)) is NotImplemented
    assert (s == (Box((0,), (4,)), 1)) is False  # its match args, as a tuple
    assert s != Box((0,), (4,))
    assert s == Shard(Box((0,), (4,)), 1) and s != Shard(Box((0,), (4,)), 2)


@pytest.mark.rule("LAYOUT-5")
def test_layout_equality_with_other_types() -> None:
    shards = [Shard(Box((0,), (2,)), 0), Shard(Box((2,), (2,)), 1)]
    layout = Layout((4,), shards)
    assert layout.__eq__(shards) is NotImplemented
    assert (layout == shards) is False
    assert (layout == tuple(shards)) is False
    assert layout != {"shape": [4], "shards": shards}
    assert layout == Layout((4,), shards[::-1])  # still equal to a Layout whatever the order


@pytest.mark.rule("BOX-1", "LAYOUT-5")
def test_box_refuses_deleting_attributes() -> None:
    b = Box((1,), (2,))
    for name in ("offsets", "sizes", "_hash"):
        with pytest.raises(AttributeError, match="Box is immutable"):
            delattr(b, name)
    assert b.offsets == (1,) and b.sizes == (2,) and hash(b) == hash(Box((1,), (2,)))


@pytest.mark.rule("LAYOUT-5")
def test_shard_refuses_assignment_and_deletion() -> None:
    s = Shard(Box((0,), (4,)), 3)
    with pytest.raises(AttributeError, match="Shard is immutable"):
        s.rank = 0  # type: ignore[misc]
    with pytest.raises(AttributeError, match="Shard is immutable"):
        s.box = Box((0,), (1,))  # type: ignore[misc]
    with pytest.raises(AttributeError, match="Shard is immutable"):
        s.extra = 1  # type: ignore[attr-defined]
    for name in ("box", "rank"):
        with pytest.raises(AttributeError, match="Shard is immutable"):
            delattr(s, name)
    assert s.rank == 3 and s.box == Box((0,), (4,))


@pytest.mark.rule("LAYOUT-5")
def test_layout_refuses_assignment_and_deletion() -> None:
    layout = Layout((4,), [Shard(Box((0,), (4,)), 0)])
    for name, value in (("shape", (5,)), ("shards", ()), ("extra", 1)):
        with pytest.raises(AttributeError, match="Layout is immutable"):
            setattr(layout, name, value)
    for name in ("shape", "shards"):
        with pytest.raises(AttributeError, match="Layout is immutable"):
            delattr(layout, name)
    assert layout.shape == (4,) and layout.shards == (Shard(Box((0,), (4,)), 0),)


@pytest.mark.rule("BOX-1", "LAYOUT-5")
def test_box_pickles_to_an_equal_box() -> None:
    for b in (Box((1, 2), (3, 4)), Box((), ()), Box((7,), (0,)), Box((2**300,), (1,))):
        back = pickle.loads(pickle.dumps(b))
        assert type(back) is Box
        assert back == b and hash(back) == hash(b)
        assert back.offsets == b.offsets and back.sizes == b.sizes
        with pytest.raises(AttributeError, match="Box is immutable"):
            back.offsets = (0,)  # type: ignore[misc]


@pytest.mark.rule("LAYOUT-5")
def test_shard_pickles_to_an_equal_shard() -> None:
    s = Shard(Box((2, 0), (1, 5)), 6)
    back = pickle.loads(pickle.dumps(s))
    assert type(back) is Shard and back == s and hash(back) == hash(s)
    assert back.rank == 6 and back.box == Box((2, 0), (1, 5))


@pytest.mark.rule("LAYOUT-5")
def test_layout_pickles_to_an_equal_layout_in_the_same_shard_order() -> None:
    # Equality ignores shard order, so the round trip must keep the order on its own:
    # rank 1's two boxes are its local storage order, [2, 4) before [0, 2).
    shards = (
        Shard(Box((2,), (2,)), 1),
        Shard(Box((0,), (2,)), 1),
        Shard(Box((0,), (4,)), 0),
        Shard(Box((4,), (0,)), 2),
    )
    layout = Layout((4,), shards)
    back = pickle.loads(pickle.dumps(layout))
    assert type(back) is Layout and back == layout and hash(back) == hash(layout)
    assert back.shape == (4,) and back.shards == shards
    assert back.boxes_of(1) == (Box((2,), (2,)), Box((0,), (2,)))
    # 64 shards and more also keep their boxes as arrays (LAYOUT-4): still one value.
    many = Layout((70,), [Shard(Box((i,), (1,)), i) for i in range(70)])
    many_back = pickle.loads(pickle.dumps(many))
    assert many_back == many and many_back.shards == many.shards
    assert many_back.is_valid()


@pytest.mark.rule("LAYOUT-5")
def test_layout_len_counts_every_shard_as_written() -> None:
    # Replicas and empty boxes are shards too.
    full = Box((0,), (4,))
    assert len(Layout((4,), [])) == 0
    assert len(Layout((4,), [Shard(full, 0)])) == 1
    assert len(Layout((4,), [Shard(full, 0), Shard(full, 1), Shard(Box((4,), (0,)), 2)])) == 3
    assert len(Layout.replicated((2, 3), [0, 1, 2, 3, 4])) == 5


@pytest.mark.rule("BOX-1")
def test_shard_rank_that_is_an_integer_but_not_an_int_is_stored_as_an_int() -> None:
    s = Shard(Box((0,), (1,)), _Index(3))  # type: ignore[arg-type]
    assert s.rank == 3 and type(s.rank) is int
    assert s == Shard(Box((0,), (1,)), 3) and hash(s) == hash(Shard(Box((0,), (1,)), 3))
    with pytest.raises(LayoutError, match="non-negative"):
        Shard(Box((0,), (1,)), _Index(-1))  # type: ignore[arg-type]
    for bad in (True, 1.0, "1", None):
        with pytest.raises(LayoutError, match=r"Shard\.rank must be a non-negative int"):
            Shard(Box((0,), (1,)), bad)  # type: ignore[arg-type]


@pytest.mark.rule("LAYOUT-7")
def test_integers_over_256_bits_print_as_their_bit_length() -> None:
    # 2**256 - 1 has 256 bits: printed exactly. 2**256 has 257 bits, 2**300 has 301.
    edge = 2**256 - 1
    assert repr(Box((edge,), (1,))) == f"Box(offsets=({edge},), sizes=(1,))"
    assert repr(Box((2**300,), (1,))) == "Box(offsets=(<int of 301 bits>,), sizes=(1,))"
    assert repr(Box((2**256, 0), (1, 2))) == "Box(offsets=(<int of 257 bits>, 0), sizes=(1, 2))"
    assert repr(Layout((2**300,), [])) == "Layout(shape=(<int of 301 bits>,), shards=[])"
    with pytest.raises(LayoutError) as e:
        Box((2**300,), (1,)).relative_to(Box((0,), (1,)))
    assert "<int of 301 bits>" in str(e.value) and str(2**300) not in str(e.value)


@pytest.mark.rule("LAYOUT-7")
def test_a_value_whose_repr_raises_is_named_by_its_type() -> None:
    from shardspec.metadata.errors import shorten

    # reprlib names an object whose __repr__ raises by its class ("<C instance at 0x...>"),
    # inside containers too.
    named = r"<_BadRepr instance at 0x[0-9a-f]+>"
    assert re.fullmatch(named, shorten(_BadRepr()))
    assert re.fullmatch(rf"\[{named}\]", shorten([_BadRepr()]))
    with pytest.raises(LayoutError, match=rf"Shard.rank must be a non-negative int, got {named}"):
        Shard(Box((0,), (1,)), _BadRepr())  # type: ignore[arg-type]
    # A class named like a builtin gets reprlib's handler for that builtin; when that handler
    # fails, shorten itself falls back to the type's name.
    impostor = type("list", (), {"__len__": _raise})()
    assert shorten(impostor) == "<list>"
    with pytest.raises(LayoutError, match=r"Shard.box must be a Box, got list: <list>$"):
        Shard(impostor, 0)  # type: ignore[arg-type]


def _raise(self: object) -> int:
    raise RuntimeError("hostile")


def _rows_layout(layout: Layout) -> Layout:
    """``layout`` rebuilt as the converters build one from checked rows (its Shard objects
    are made only when asked for)."""
    from shardspec.metadata.columns import plain_columns

    offsets = [s.box.offsets for s in layout.shards]
    sizes = [s.box.sizes for s in layout.shards]
    columns = plain_columns(offsets, sizes, [s.rank for s in layout.shards], layout.shape)
    assert columns is not None
    return Layout._from_plain(layout.shape, offsets, sizes, columns)


def _grid(rows: int, cols: int, world: int) -> Layout:
    # a (2 * rows, 3 * cols) tensor cut into rows x cols boxes of (2, 3), cell k on k % world
    return Layout(
        (2 * rows, 3 * cols),
        [
            Shard(Box((2 * i, 3 * j), (2, 3)), (i * cols + j) % world)
            for i in range(rows)
            for j in range(cols)
        ],
    )


@pytest.mark.rule("LAYOUT-9")
@pytest.mark.parametrize("n", [(2, 3), (10, 10)])  # below and above the columns' threshold
def test_fingerprint_is_the_same_however_the_layout_was_built(n: tuple[int, int]) -> None:
    layout = _grid(*n, world=3)
    expected = layout.fingerprint()
    assert len(expected) == 16
    assert Layout(layout.shape, list(layout.shards)).fingerprint() == expected
    assert pickle.loads(pickle.dumps(layout)).fingerprint() == expected
    if n[0] * n[1] >= 64:
        lazy = _rows_layout(layout)
        assert lazy.fingerprint() == expected  # before its shards exist
        assert lazy.shards == layout.shards
        assert _rows_layout(layout).fingerprint() == expected


@pytest.mark.rule("LAYOUT-9")
def test_fingerprint_is_the_documented_digest_of_int64_rows() -> None:
    import hashlib
    import struct

    layout = Layout((4, 6), [Shard(Box((0, 0), (4, 3)), 1), Shard(Box((0, 3), (4, 3)), 0)])
    rows = struct.pack("<10q", 0, 0, 4, 3, 1, 0, 3, 4, 3, 0)
    worked = hashlib.blake2b(b"shardspec-layout-rows\0(4, 6)\0" + rows, digest_size=16)
    assert layout.fingerprint() == worked.digest()
    # a layout that keeps int64 columns (64 shards or more) digests the same rows
    big = _grid(10, 10, world=3)
    values = [v for s in big.shards for v in (*s.box.offsets, *s.box.sizes, s.rank)]
    rows = struct.pack(f"<{len(values)}q", *values)
    worked = hashlib.blake2b(b"shardspec-layout-rows\0(20, 30)\0" + rows, digest_size=16)
    assert big.fingerprint() == worked.digest()
    assert _rows_layout(big).fingerprint() == worked.digest()


@pytest.mark.rule("LAYOUT-9")
@pytest.mark.parametrize("big", [False, True])
def test_fingerprint_changes_with_any_single_value_or_the_order(big: bool) -> None:
    layout = _grid(10, 10, world=4) if big else _grid(2, 3, world=4)
    base = layout.fingerprint()
    shards = list(layout.shards)
    k = len(shards) // 2 + 1  # one shard in the middle, not the first or the last
    s = shards[k]
    variants = {
        "offset": Shard(Box((s.box.offsets[0] + 1, s.box.offsets[1]), s.box.sizes), s.rank),
        "size": Shard(Box(s.box.offsets, (s.box.sizes[0], s.box.sizes[1] - 1)), s.rank),
        "rank": Shard(s.box, s.rank + 1),
    }
    seen = {base}
    for what, changed in variants.items():
        other = Layout(layout.shape, [*shards[:k], changed, *shards[k + 1 :]])
        assert other.fingerprint() != base, what
        seen.add(other.fingerprint())
    swapped = [*shards[:k], shards[k + 1], shards[k], *shards[k + 2 :]]
    reordered = Layout(layout.shape, swapped)
    assert reordered == layout  # LAYOUT-5: the same layout
    assert reordered.fingerprint() != base  # but another storage order
    seen.add(reordered.fingerprint())
    bigger = Layout((layout.shape[0] + 1, layout.shape[1]), shards)
    seen.add(bigger.fingerprint())
    assert len(seen) == 6


@pytest.mark.rule("LAYOUT-9", "LAYOUT-6")
def test_fingerprint_of_values_past_int64_is_exact() -> None:
    huge = 2**64 + 5
    a = Layout((huge,), [Shard(Box((0,), (huge,)), 0)])
    b = Layout((huge + 1,), [Shard(Box((0,), (huge + 1,)), 0)])
    assert a.fingerprint() != b.fingerprint()
    assert Layout((huge,), [Shard(Box((0,), (huge,)), 0)]).fingerprint() == a.fingerprint()


@pytest.mark.rule("LAYOUT-9", "LAYOUT-5")
def test_a_layout_built_from_rows_answers_as_the_same_layout_written_out() -> None:
    layout = _grid(10, 10, world=3)
    lazy = _rows_layout(layout)
    assert len(lazy) == 100
    assert lazy.ranks == (0, 1, 2)
    for r in (0, 1, 2, 7, 1):  # rank 1 twice: the second answer is the kept one
        assert lazy.shards_of(r) == layout.shards_of(r)
        assert lazy.positions_of(r) == [i for i, s in enumerate(layout.shards) if s.rank == r]
    assert lazy.validate() is lazy
    offs, sizes = lazy.box_arrays()
    assert offs.shape == sizes.shape == (100, 2)
    assert offs[37].tolist() == list(layout.shards[37].box.offsets)
    assert sizes[37].tolist() == [2, 3]
    with pytest.raises(ValueError):
        offs[0, 0] = 5  # read-only views of the layout's own arrays
    assert _rows_layout(layout) == layout
    assert hash(_rows_layout(layout)) == hash(layout)


@pytest.mark.rule("LAYOUT-9", "LAYOUT-2")
def test_a_layout_built_from_rows_names_the_shards_of_a_fault() -> None:
    shards = list(_grid(10, 10, world=3).shards)
    s = shards[41]
    shards[41] = Shard(Box(s.box.offsets, (s.box.sizes[0], s.box.sizes[1] + 1)), s.rank)
    lazy = _rows_layout(Layout((20, 30), shards))
    with pytest.raises(LayoutError, match="overlap") as e:
        lazy.validate()
    assert 41 in e.value.shards


@pytest.mark.rule("LAYOUT-9", "LAYOUT-6")
def test_box_arrays_of_a_small_layout_and_of_values_past_int64() -> None:
    layout = Layout((4, 6), [Shard(Box((0, 3), (4, 3)), 1), Shard(Box((0, 0), (4, 3)), 0)])
    offs, sizes = layout.box_arrays()
    assert offs.tolist() == [[0, 3], [0, 0]]
    assert sizes.tolist() == [[4, 3], [4, 3]]
    assert str(offs.dtype) == "int64"
    empty = Layout((0,), [Shard(Box((0,), (0,)), 0)])
    assert empty.box_arrays()[1].tolist() == [[0]]
    huge = 2**64
    with pytest.raises(LayoutError, match="does not fit int64"):
        Layout((huge,), [Shard(Box((0,), (huge,)), 0)]).box_arrays()


def test_rank_array_is_the_shards_ranks_in_order_small_large_and_past_int64() -> None:
    small = Layout((4, 6), [Shard(Box((0, 3), (4, 3)), 7), Shard(Box((0, 0), (4, 3)), 2)])
    assert small.rank_array().tolist() == [7, 2]
    large = chunk_layout((100,), 0, list(range(99, -1, -1)))  # 100 shards: kept as columns
    ranks = large.rank_array()
    assert ranks.tolist() == [s.rank for s in large.shards] == list(range(99, -1, -1))
    assert str(ranks.dtype) == "int64"
    with pytest.raises(ValueError):
        ranks[0] = 5  # a view of the layout's own columns: read-only
    assert large.rank_array()[0] == 99
    with pytest.raises(LayoutError, match="does not fit int64"):
        Layout((1,), [Shard(Box((0,), (1,)), 2**64)]).rank_array()


def _array_layout(layout: Layout) -> Layout:
    """``layout`` rebuilt from int64 arrays, as a checkpoint's saved chunks arrive from the
    metadata's column encoding (the rows are read from the arrays when asked)."""
    import numpy as np

    from shardspec.metadata.columns import ArrayRows, array_columns

    offsets = np.array([s.box.offsets for s in layout.shards], dtype=np.int64)
    sizes = np.array([s.box.sizes for s in layout.shards], dtype=np.int64)
    ranks = np.array([s.rank for s in layout.shards], dtype=np.int64)
    columns = array_columns(offsets, sizes, ranks, layout.shape)
    assert columns is not None
    offsets[0, 0] = 99  # the columns are copies: changing the arrays after does not move them
    lazy = Layout._from_plain(layout.shape, ArrayRows(offsets), ArrayRows(sizes), columns)
    offsets[0, 0] = layout.shards[0].box.offsets[0]
    return lazy


@pytest.mark.rule("LAYOUT-9", "LAYOUT-5")
def test_a_layout_built_from_arrays_answers_as_the_same_layout_written_out() -> None:
    layout = _grid(10, 10, world=3)
    lazy = _array_layout(layout)
    assert lazy.box_arrays()[0][0].tolist() == list(layout.shards[0].box.offsets)
    for r in (2, 0, 5):
        assert lazy.shards_of(r) == layout.shards_of(r)
    assert lazy.validate() is lazy
    assert lazy == layout and hash(lazy) == hash(layout)
    assert lazy.fingerprint() == layout.fingerprint()
    assert type(lazy.shards[37].box.offsets[0]) is int  # plain ints, not NumPy scalars


@pytest.mark.rule("LAYOUT-9")
def test_array_rows_read_as_the_list_of_tuples() -> None:
    import numpy as np

    from shardspec.metadata.columns import ArrayRows

    a = np.arange(12, dtype=np.int64).reshape(4, 3)
    rows = ArrayRows(a)
    want = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (9, 10, 11)]
    assert len(rows) == 4 and list(rows) == want
    assert rows[2] == want[2] and rows[-1] == want[-1] and rows[1:3] == want[1:3]
    assert type(rows[0][0]) is int
    with pytest.raises(IndexError):
        rows[4]


@pytest.mark.rule("LAYOUT-9", "LAYOUT-6")
def test_array_columns_refuse_what_plain_columns_refuses() -> None:
    import numpy as np

    from shardspec.metadata.columns import INT_LIMIT, array_columns

    def cols(offs: list[list[int]], sizes: list[list[int]], ranks: list[int]) -> object:
        return array_columns(
            np.array(offs, dtype=np.int64).reshape(len(ranks), 2),
            np.array(sizes, dtype=np.int64).reshape(len(ranks), 2),
            np.array(ranks, dtype=np.int64),
            (4, 6),
        )

    assert cols([[0, 0], [0, 3]], [[4, 3], [4, 3]], [0, 1]) is not None
    assert cols([[0, 0], [0, 4]], [[4, 3], [4, 3]], [0, 1]) is None  # leaves the shape
    assert cols([[0, -1], [0, 3]], [[4, 3], [4, 3]], [0, 1]) is None  # negative offset
    assert cols([[0, 0], [0, 3]], [[4, 3], [4, -3]], [0, 1]) is None  # negative size
    assert cols([[0, 0], [0, 3]], [[4, 3], [4, 3]], [0, -1]) is None  # negative rank
    assert cols([[0, 0], [0, 3]], [[4, 3], [4, 3]], [0, INT_LIMIT + 1]) is None
    assert cols([], [], []) is None  # no boxes: the per-box path
    wrong = np.zeros((2, 3), dtype=np.int64)  # three dims for a 2-D shape
    assert array_columns(wrong, wrong, np.array([0, 1]), (4, 6)) is None
