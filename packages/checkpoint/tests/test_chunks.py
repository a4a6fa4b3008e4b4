"""The chunk check of a checkpointed tensor (CKPT-1): saved metadata that is no shape, and many
chunks checked all at once against the per-chunk loop."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from checkpoint_read_triples import layouts_of
from hypothesis import given, strategies as st

from shardspec.checkpoint import chunks as chunks_module
from shardspec.checkpoint.chunks import ChunkError, check_chunks, chunk_verdict, storable
from shardspec.metadata.strategies import shapes


@pytest.mark.rule("CKPT-1")
@pytest.mark.parametrize(
    ("shape", "fragment"),
    [
        ((-1, 4), "negative size"),
        (("x",), "bad shape"),
        ((None,), "bad shape"),
        ((5.5, 4), "5.5"),  # int() would have read it as 5
        ((True, 4), "True"),
    ],
    ids=repr,
)
def test_a_saved_shape_that_is_no_shape_is_a_value_error(shape: tuple, fragment: str) -> None:
    verdict = chunk_verdict("w", shape, [((0, 0), (1, 4))])
    assert isinstance(verdict, ChunkError)
    assert verdict.kind == "value" and verdict.fqn == "w" and verdict.chunks == ()
    assert str(verdict).startswith("checkpoint tensor 'w': bad shape")
    assert fragment in str(verdict)
    with pytest.raises(ChunkError, match="bad shape"):
        check_chunks("w", shape, [((0, 0), (1, 4))])


def _verdict_both_ways(shape: tuple, chunks: list) -> tuple[Any, Any]:
    """(the per-chunk loop's verdict, the all-at-once path's) on the same chunks."""
    loop = chunks_module.COLUMNS_FROM
    try:
        chunks_module.COLUMNS_FROM = 10**9
        slow = chunk_verdict("t", shape, chunks)
        chunks_module.COLUMNS_FROM = 0
        fast = chunk_verdict("t", shape, chunks)
    finally:
        chunks_module.COLUMNS_FROM = loop
    return slow, fast


def _same_verdict(slow: Any, fast: Any) -> None:
    assert type(slow) is type(fast)
    if isinstance(slow, ChunkError):
        assert (str(fast), fast.kind, fast.chunks, fast.point) == (
            str(slow),
            slow.kind,
            slow.chunks,
            slow.point,
        )
    else:
        assert fast.shape == slow.shape and fast.shards == slow.shards  # order too


@pytest.mark.rule("CKPT-1")
@given(st.data())
def test_many_chunks_checked_at_once_get_the_loops_verdict(data: st.DataObject) -> None:
    # A checkpoint of thousands of chunks is checked with NumPy all at once; the per-chunk loop
    # is the reference: the same layout in the same order, or the same error naming the same
    # chunks, for valid chunk lists and for one defect at a drawn chunk.
    shape = data.draw(shapes(max_dims=3, max_side=6))
    layout = storable(data.draw(layouts_of(shape)))
    boxes = list(dict.fromkeys(s.box for s in layout.shards))
    chunks: list[Any] = [(b.offsets, b.sizes) for b in boxes]
    k = data.draw(st.integers(0, len(chunks) - 1))
    o, z = chunks[k]
    defect = data.draw(
        st.sampled_from(
            ["none", "drop", "twice", "shadow", "bool", "numpy", "past end", "torch.Size"]
        )
    )
    if defect == "drop":
        del chunks[k]
    elif defect == "twice":
        chunks.append(chunks[k])
    elif defect == "shadow":
        chunks.append((o, (0,) * len(o)))
    elif defect == "bool" and o:
        chunks[k] = ((True, *o[1:]), z)
    elif defect == "numpy" and o:
        chunks[k] = ((np.int64(o[0]), *o[1:]), z)
    elif defect == "past end" and o:
        chunks[k] = ((o[0] + 1, *o[1:]), z)
    elif defect == "torch.Size":
        chunks = [(torch.Size(a), torch.Size(b)) for a, b in chunks]
    _same_verdict(*_verdict_both_ways(shape, chunks))


@pytest.mark.rule("CKPT-1")
def test_many_chunks_at_once_hand_worked() -> None:
    # 100 row chunks of a (100, 3) tensor, as DCP saves them (torch.Size); then chunk #57 made
    # rows 58-59, which start where #58 does; then #57 shifted one column, past the end.
    chunks = [(torch.Size((i, 0)), torch.Size((1, 3))) for i in range(100)]
    layout = check_chunks("t", (100, 3), chunks)
    assert [(s.box.offsets, s.box.sizes, s.rank) for s in layout.shards] == [
        ((i, 0), (1, 3), i) for i in range(100)
    ]
    chunks[57] = (torch.Size((58, 0)), torch.Size((2, 3)))
    with pytest.raises(ChunkError, match="start at the same offset") as err:
        check_chunks("t", (100, 3), chunks)
    assert err.value.chunks == (57, 58) and err.value.kind == "offset"
    chunks[57] = (torch.Size((57, 1)), torch.Size((1, 3)))
    with pytest.raises(ChunkError, match="out of bounds") as err:
        check_chunks("t", (100, 3), chunks)
    assert err.value.chunks == (57,)
