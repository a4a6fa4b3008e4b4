"""Box, Shard and Layout as values (spec/01-layout.md, BOX-1, LAYOUT-5, LAYOUT-7): equality
with other types, immutability, pickling, length and how long integers print.

Expectations are worked by hand from the rules and the docstrings.
"""

from __future__ import annotations

import pickle
import re

import pytest

from shardspec.metadata import Box, Layout, LayoutError, Shard


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
