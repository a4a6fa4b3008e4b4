"""DCP's Hugging Face format read as chunks (CKPT-28): a file a rank, each placing its tensors
in ``__metadata__["DCP_SHARDING_INFO"]``; the shape is the chunks' bounding box, and chunks
that do not hold each of its elements once are refused naming the tensor and the files."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from shardspec.checkpoint.chunks import storable
from shardspec.checkpoint.safetensors_files import (
    SafetensorsError,
    metadata_from_headers,
    read_headers,
)
from shardspec.metadata import Layout
from shardspec.metadata.strategies import shapes, valid_layouts

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

from shardspec.testing.tensors import random_tensor  # noqa: E402

pytestmark = pytest.mark.rule("CKPT-28")

INFO = "DCP_SHARDING_INFO"


def file_name(rank: int) -> str:
    # torch's HuggingFaceStorageWriter's name for rank R's file (R counts from 1)
    return f"shard-{rank + 1:05d}-model-00001-of-00001.safetensors"


def write_rank(
    root: Path, rank: int, chunks: dict[str, tuple[Any, list[int]]], **meta: str
) -> Path:
    """One rank's file as torch's writer makes it: each tensor and its saved offsets."""
    info = {name: {"saved_offsets": offsets} for name, (_, offsets) in chunks.items()}
    metadata = {INFO: json.dumps(info), "DCP_VERSION": "1.0", "format": "pt", **meta}
    f = root / file_name(rank)
    save_file({n: t.contiguous() for n, (t, _) in chunks.items()}, str(f), metadata=metadata)
    return f


def read(root: Path) -> Any:
    return metadata_from_headers(read_headers(root), root)


def chunk_bytes(root: Path, md: Any, name: str, offsets: list[int]) -> Any:
    """The bytes the metadata points at for ``name``'s chunk at ``offsets``, as a tensor."""
    from torch.distributed.checkpoint.metadata import MetadataIndex

    s = md.storage_data[MetadataIndex(name, offsets)]
    data = (root / s.relative_path).read_bytes()[s.offset : s.offset + s.length]
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0)
    saved = s.saved_tensor
    return buf.to(torch.uint8).view(saved.dtype).reshape(saved.size)


@st.composite
def sharded_saves(draw: st.DrawFn) -> tuple[Any, Layout]:
    """A tensor of any shape with an element (0-d included) and a valid layout of it without
    replicas, one box a file, no empty box where another starts (CKPT-1)."""
    shape = draw(shapes(min_dims=0, max_dims=3, max_side=5).filter(lambda s: 0 not in s))
    layout = storable(draw(valid_layouts(st.just(shape), replicas=False)))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.int64, torch.uint8]))
    return random_tensor(shape, dtype, draw(st.integers(0, 2**16))), layout


@given(sharded_saves())
@settings(max_examples=60)
def test_each_chunk_is_the_reference_slice_and_the_shape_their_bounding_box(
    save: tuple[Any, Layout],
) -> None:
    t, layout = save
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for i, s in enumerate(layout.shards):
            write_rank(root, i, {"w": (t[s.box.slices()], list(s.box.offsets))})
        md = read(root)
        tsm = md.state_dict_metadata["w"]
        assert tuple(tsm.size) == tuple(t.shape)
        assert tsm.properties.dtype == t.dtype
        got = sorted((tuple(c.offsets), tuple(c.sizes)) for c in tsm.chunks)
        want = sorted((s.box.offsets, s.box.sizes) for s in layout.shards)
        assert got == want
        # (empty chunks hold no byte, and two of them may share an offset: CKPT-1)
        for s in (s for s in layout.shards if not s.box.is_empty):
            chunk = chunk_bytes(root, md, "w", list(s.box.offsets))
            want = t[s.box.slices()].contiguous().reshape(-1)
            assert chunk.shape == s.box.sizes
            assert torch.equal(chunk.reshape(-1).view(torch.uint8), want.view(torch.uint8))


ROWS = torch.arange(12, dtype=torch.float32).reshape(4, 3)


def two_ranks(
    root: Path, first: tuple[int, int] = (0, 2), second: tuple[int, int] = (2, 2)
) -> None:
    """Rows [a, a + n) of ROWS on rank 0 and on rank 1, as (a, n) says."""
    for rank, (a, n) in enumerate((first, second)):
        write_rank(root, rank, {"w": (ROWS[a : a + n], [a, 0])})


def refused(root: Path, *needles: str) -> str:
    with pytest.raises(SafetensorsError) as e:
        read(root)
    msg = str(e.value)
    assert all(n in msg for n in needles), msg
    return msg


def test_two_ranks_read_back_whole(tmp_path: Path) -> None:
    two_ranks(tmp_path)
    md = read(tmp_path)
    assert tuple(md.state_dict_metadata["w"].size) == (4, 3)
    assert torch.equal(chunk_bytes(tmp_path, md, "w", [2, 0]), ROWS[2:])


def test_a_lost_file_inside_the_box_is_a_gap_refused(tmp_path: Path) -> None:
    for rank, a in enumerate((0, 1, 3)):  # rank 1's rows 1-2 lost: only row 1 saved
        write_rank(tmp_path, rank, {"w": (ROWS[a : a + 1], [a, 0])})
    refused(tmp_path, "'w'", "gap", "(2, 0)", "bounding box")


def test_overlapping_chunks_are_refused_naming_both_files(tmp_path: Path) -> None:
    two_ranks(tmp_path, (0, 3), (2, 2))
    refused(tmp_path, "'w'", "overlap", file_name(0), file_name(1))


def test_two_chunks_at_one_offset_are_refused(tmp_path: Path) -> None:
    write_rank(tmp_path, 0, {"w": (ROWS[:4], [0, 0])})
    write_rank(tmp_path, 1, {"w": (ROWS[:0], [0, 0])})  # empty, where the other starts
    refused(tmp_path, "'w'")


@pytest.mark.parametrize(
    ("info", "needle"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a dict"),
        (json.dumps({"w": {"saved_offsets": [0]}}), "1 offsets for 2 dims"),
        (json.dumps({"w": {"saved_offsets": [0, -1]}}), "non-negative ints"),
        (json.dumps({"w": {"saved_offsets": [0, 1.5]}}), "non-negative ints"),
        (json.dumps({"w": {"saved_offsets": [0, True]}}), "non-negative ints"),
        (json.dumps({"w": [0, 0]}), "non-negative ints"),
        (json.dumps({"v": {"saved_offsets": [0, 0]}}), "lacks"),
        (json.dumps({}), "no place"),
    ],
)
def test_a_bad_sharding_info_is_refused_naming_the_file(
    tmp_path: Path, info: str, needle: str
) -> None:
    save_file({"w": ROWS}, str(tmp_path / file_name(0)), metadata={INFO: info})
    refused(tmp_path, needle, file_name(0))


def test_chunks_of_other_dtypes_or_dims_are_refused(tmp_path: Path) -> None:
    write_rank(tmp_path, 0, {"w": (ROWS[:2], [0, 0])})
    write_rank(tmp_path, 1, {"w": (ROWS[2:].double(), [2, 0])})
    refused(tmp_path, "'w'", "F64", "F32")
    (tmp_path / file_name(1)).unlink()
    write_rank(tmp_path, 1, {"w": (ROWS[2:].reshape(-1), [6])})
    refused(tmp_path, "'w'", "differ in dims")


def test_a_tensor_in_two_files_needs_a_place_in_both(tmp_path: Path) -> None:
    write_rank(tmp_path, 0, {"w": (ROWS[:2], [0, 0])})
    save_file({"w": ROWS[2:].contiguous()}, str(tmp_path / file_name(1)))
    refused(tmp_path, "'w'", "two files", INFO)


def test_an_index_gives_each_tensor_one_file(tmp_path: Path) -> None:
    write_rank(tmp_path, 0, {"w": (ROWS[:2], [0, 0])})
    write_rank(tmp_path, 1, {"w": (ROWS[2:], [2, 0]), "b": (torch.arange(3), [0])})
    weight_map = {"w": file_name(0), "b": file_name(1)}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    refused(tmp_path, "'w'", "two files", "index")


def test_a_file_of_several_tensors_and_a_rank_holding_nothing(tmp_path: Path) -> None:
    """Each file places each of its tensors; a rank with no chunk writes a file of none."""
    write_rank(tmp_path, 0, {"w": (ROWS[:2], [0, 0]), "b": (torch.arange(3), [0])})
    write_rank(tmp_path, 1, {"w": (ROWS[2:], [2, 0])})
    write_rank(tmp_path, 2, {})
    md = read(tmp_path)
    assert tuple(md.state_dict_metadata["w"].size) == (4, 3)
    assert tuple(md.state_dict_metadata["b"].size) == (3,)
    assert len(md.state_dict_metadata["w"].chunks) == 2


def test_a_box_spanned_by_one_chunk_off_the_origin(tmp_path: Path) -> None:
    """One chunk at (2, 0) of 2 rows: its bounding box is 4 rows, rows 0-1 in no chunk."""
    write_rank(tmp_path, 0, {"w": (ROWS[2:], [2, 0])})
    refused(tmp_path, "'w'", "gap")
