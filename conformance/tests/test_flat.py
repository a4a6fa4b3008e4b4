"""Flat layouts (spec/11-flat.md, FLAT-1..7): a flat range's boxes against the greedy oracle and
the elements of an index tensor, flat validation against enumeration, flat layouts as boxes and
back, and ZeRO's partitions against buffers built the way DeepSpeed builds them."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch
from hypothesis import example, given, strategies as st

from conformance import reference
from conformance.assertions import assert_boxes_equal, assert_equal, assert_verdict, fail
from conformance.cases import case
from conformance.impls import Impl
from conformance.strategies import shapes, valid_layouts
from shardspec.metadata import Box, Layout, Shard

Piece = tuple[int, int, int, int]


def _elements(shape: tuple[int, ...], box: Box) -> list[int]:
    ids = torch.arange(math.prod(shape)).reshape(shape)
    return ids[tuple(slice(o, o + n) for o, n in zip(box.offsets, box.sizes))].reshape(-1).tolist()


@st.composite
def flat_ranges(draw: st.DrawFn) -> tuple[tuple[int, ...], int, int]:
    """A shape (0-d, zero-size dims and 1-d included) and a range of its elements, its ends
    often at row boundaries (where an off-by-one between head, rows and tail shows)."""
    shape = draw(shapes(max_dims=4, max_side=6))
    n = math.prod(shape)
    inner = math.prod(shape[1:]) if len(shape) > 1 else 1
    ends = st.integers(0, n) | st.integers(0, n // max(inner, 1)).map(lambda r: r * inner)
    a, b = sorted((min(draw(ends), n), min(draw(ends), n)))
    return shape, a, b


@pytest.mark.rule("FLAT-1", "FLAT-2")
@given(flat_ranges())
@example(((3, 5), 3, 12))  # head, whole row, tail
@example(((3, 5), 4, 11))  # a head and a tail of one element each
@example(((2, 3, 4), 5, 19))  # heads and tails on two levels: 4 boxes
@example(((2, 3, 4), 0, 24))  # the whole tensor: one box
@example(((), 0, 1))  # a 0-d tensor's element
@example(((4, 0, 3), 0, 0))  # no elements
@example(((1, 1, 7), 2, 6))  # size-1 outer dims
def test_a_flat_range_is_its_canonical_boxes(
    impl: Impl, c: tuple[tuple[int, ...], int, int]
) -> None:
    shape, a, b = c
    ex = f"flat_range_boxes(shape={shape}, [{a}, {b}))"
    with case():
        boxes = impl.flat_range_boxes(shape, a, b)
        got = [i for box in boxes for i in _elements(shape, box)]
        assert_equal(f"{impl.name}.elements", got, list(range(a, b)), ex, "FLAT-2")
        assert_boxes_equal(f"{impl.name}.boxes", boxes, reference.flat_boxes(shape, a, b), ex)


@st.composite
def flat_layouts(draw: st.DrawFn) -> tuple[tuple[int, ...], list[Piece]]:
    """Valid flat layouts (cut points, each range on 1-3 ranks, buffers in a drawn order with
    room between pieces) and, about half the time, one piece moved, resized, dropped, copied
    onto its own rank or onto another's place in a buffer: any of which may or may not break
    FLAT-4 (the oracle says which)."""
    shape = draw(shapes(max_dims=3, max_side=5))
    n = math.prod(shape)
    cuts = sorted(set(draw(st.lists(st.integers(0, n), max_size=5))) | {0, n})
    world = draw(st.integers(1, 4))
    owned: dict[int, list[tuple[int, int]]] = {}
    for a, b in itertools.pairwise(cuts):
        for r in draw(st.sets(st.integers(0, world - 1), min_size=1, max_size=min(world, 3))):
            owned.setdefault(r, []).append((a, b))
    pieces: list[Piece] = []
    for r, ranges in sorted(owned.items()):
        at = 0
        for a, b in draw(st.permutations(ranges)):
            pieces.append((r, a, b, at))
            at += b - a + draw(st.integers(0, 1))
    if not pieces:
        pieces.append((0, n, n, 0))
    if draw(st.booleans()):
        i = draw(st.integers(0, len(pieces) - 1))
        r, a, b, at = pieces[i]
        how = draw(st.sampled_from(["shift", "grow", "shrink", "drop", "twice", "at"]))
        if how == "shift":
            pieces[i] = (r, a + 1, b + 1, at)
        elif how == "grow":
            pieces[i] = (r, a, b + 1, at)
        elif how == "shrink" and b > a:
            pieces[i] = (r, a, b - 1, at)
        elif how == "drop":
            del pieces[i]
        elif how == "twice":
            pieces.append((r, a, b, at + n + 1))
        elif how == "at":
            pieces[i] = (r, a, b, max(at - 1, 0))
    return shape, draw(st.permutations(pieces))


@pytest.mark.rule("FLAT-4")
@given(flat_layouts())
@example(((3, 5), [(0, 0, 7, 0), (1, 7, 15, 0)]))
@example(((3, 5), [(0, 0, 7, 0), (1, 6, 15, 0)]))  # overlapping ranges
@example(((3, 5), [(0, 0, 7, 0), (1, 0, 7, 0), (0, 7, 15, 7)]))  # a replica
@example(((3, 5), [(0, 0, 7, 0), (0, 7, 15, 6)]))  # one buffer place twice
@example(((3, 5), [(0, 0, 7, 0), (1, 8, 15, 0)]))  # element 7 held by no one
@example(((6,), [(2, 0, 6, 0), (2, 0, 6, 6)]))  # the same range twice on one rank
@example(((), [(0, 0, 1, 0), (1, 0, 1, 0), (1, 0, 1, 2)]))  # ... after a replica on another
@example(((3, 5), [(0, 0, 16, 0)]))  # past the end
@example(((3, 5), [(0, 0, 7, 0)]))  # nothing holds the last 8
@example(((3, 5), [(0, 9, 7, 0), (1, 0, 15, 0)]))  # a stop before its start
def test_flat_validation_agrees_with_the_oracle(
    impl: Impl, c: tuple[tuple[int, ...], list[Piece]]
) -> None:
    shape, pieces = c
    ex = f"FlatLayout(shape={shape}, pieces={pieces})"
    with case():
        accepted = impl.flat_is_valid(shape, pieces)
        assert_verdict(
            f"{impl.name}.validate", accepted, reference.flat_is_valid(shape, pieces), ex
        )


@pytest.mark.rule("FLAT-5")
@given(flat_layouts())
def test_a_flat_layout_is_each_ranks_pieces_as_boxes(
    impl: Impl, c: tuple[tuple[int, ...], list[Piece]]
) -> None:
    shape, pieces = c
    if not reference.flat_is_valid(shape, pieces):
        return
    ex = f"FlatLayout(shape={shape}, pieces={pieces}).to_layout()"
    with case():
        by_rank = impl.flat_boxes_by_rank(shape, pieces)
        ranks = {p[0] for p in pieces}
        if shape:  # a rank that holds nothing of a 0-d tensor has no box to say so (BOX-3)
            assert_equal(f"{impl.name}.ranks", sorted(by_rank), sorted(ranks), ex, "FLAT-5")
        for r in sorted(ranks):
            want = [
                box
                for _, a, b, _ in sorted((p for p in pieces if p[0] == r), key=lambda p: p[3])
                for box in reference.flat_boxes(shape, a, b)
            ]
            got = [box for box in by_rank.get(r, []) if box.numel]
            assert_boxes_equal(f"{impl.name}.rank{r}.boxes", got, want, ex, "FLAT-5")


REPLICA_BESIDE_A_RANGE = Layout(
    (2,), [Shard(Box((0,), (1,)), 0), Shard(Box((0,), (1,)), 1), Shard(Box((1,), (1,)), 0)]
)


@pytest.mark.rule("FLAT-3", "FLAT-5")
@given(valid_layouts(shapes(max_dims=3, max_side=5), max_ranks=4))
# element 0 replicated on ranks 0 and 1 beside rank 0's element 1: merged on rank 0 alone,
# [0, 2) would overlap rank 1's [0, 1) without being it
@example(REPLICA_BESIDE_A_RANGE)
@example(Layout((2, 3), [Shard(Box((0, 0), (2, 3)), 0), Shard(Box((0, 0), (0, 3)), 1)]))
def test_a_layout_as_flat_ranges_holds_the_same_elements(impl: Impl, layout: Layout) -> None:
    ex = f"flat_from_layout({layout})"
    with case():
        pieces = impl.flat_pieces_of_boxes(layout.shape, [(s.box, s.rank) for s in layout.shards])
        assert_equal(
            f"{impl.name}.valid", reference.flat_is_valid(layout.shape, pieces), True, ex, "FLAT-5"
        )
        got_ranks = sorted({p[0] for p in pieces})
        assert_equal(f"{impl.name}.ranks", got_ranks, sorted(layout.ranks), ex, "FLAT-5")
        for r in layout.ranks:
            want = sorted(i for box in layout.boxes_of(r) for i in _elements(layout.shape, box))
            mine = sorted((p for p in pieces if p[0] == r), key=lambda p: p[3])
            got = [i for _, a, b, _ in mine for i in range(a, b)]
            assert_equal(f"{impl.name}.rank{r}.elements", got, want, ex, "FLAT-5")
            at = 0
            for _, a, b, place in mine:
                if b > a:
                    assert_equal(f"{impl.name}.rank{r}.[{a}, {b}).at", place, at, ex, "FLAT-5")
                    at += b - a


def _zero12_cases() -> Any:
    return st.tuples(
        st.lists(shapes(max_dims=3, max_side=5), min_size=1, max_size=5),
        st.integers(1, 6),
        st.sampled_from([1, 2, 4]),
        st.booleans(),
    )


@pytest.mark.rule("FLAT-6")
@given(_zero12_cases())
@example(([(3, 5), (7,)], 2, 2, False))  # 22 elements padded to 24: rank 1's last 2 padding
@example(([(2, 2), (3,), (1,), (5,)], 2, 2, True))  # round robin: 0, 2, then 1, 3
@example(([(5,), (0, 4), (3,)], 3, 2, False))  # a parameter with no elements
@example(([(1,)], 6, 2, False))  # more ranks than elements
def test_zero12_pieces_are_deepspeeds_partitions(
    impl: Impl, c: tuple[list[tuple[int, ...]], int, int, bool]
) -> None:
    shapes_, dp, alignment, round_robin = c
    ex = f"zero12(shapes={shapes_}, dp={dp}, alignment={alignment}, round_robin={round_robin})"
    with case():
        layouts = impl.zero12_pieces(shapes_, dp, alignment, round_robin)
        assert_equal(f"{impl.name}.len", len(layouts), len(shapes_), ex, "FLAT-6")
        buffers = reference.zero12_buffers(shapes_, dp, alignment, round_robin)
        for r, buf in enumerate(buffers):
            held: list[tuple[int, int] | None] = [None] * len(buf)
            for k, pieces in enumerate(layouts):
                for rank, a, b, at in pieces:
                    if rank != r:
                        continue
                    if not 0 <= at <= at + b - a <= len(buf):
                        fail(f"{impl.name}.param{k}.rank{r}.at", at, f"within {len(buf)}", ex)
                    for j in range(b - a):
                        held[at + j] = (k, a + j)
            if held != buf:
                where = next(j for j, (x, y) in enumerate(zip(held, buf)) if x != y)
                fail(
                    f"{impl.name}.rank{r}.partition[{where}]", held[where], buf[where], ex, "FLAT-6"
                )


@pytest.mark.rule("FLAT-7")
@given(shapes(max_dims=3, max_side=6), st.integers(1, 9))
@example((7,), 3)
@example((2,), 4)  # ranks past the data
@example((0, 3), 2)
@example((), 3)
def test_zero3_pieces_are_each_ranks_ceil_slice(
    impl: Impl, shape: tuple[int, ...], dp: int
) -> None:
    ex = f"zero3(shape={shape}, dp={dp})"
    with case():
        pieces = impl.zero3_pieces(shape, dp)
        got = sorted((r, a, b) for r, a, b, _ in pieces)
        want = [(r, a, b) for r, (a, b) in enumerate(reference.zero3_ranges(shape, dp))]
        assert_equal(f"{impl.name}.pieces", got, want, ex, "FLAT-7")
        assert_equal(f"{impl.name}.at", {at for *_, at in pieces}, {0}, ex, "FLAT-7")
