"""The chunk check of a checkpointed tensor (CKPT-1) on saved metadata that is no shape."""

from __future__ import annotations

import pytest

from shardspec.checkpoint.chunks import ChunkError, check_chunks, chunk_verdict


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
