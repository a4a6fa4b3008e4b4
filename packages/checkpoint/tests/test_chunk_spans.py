"""Small saved chunks read by the spans of file they fill (:mod:`shardspec.checkpoint.
chunk_spans`, the ``reads="own"`` path of the collective load): every piece of every chunk
lands where the reference puts it, whatever the dtype and wherever the chunk's data falls in
the span (unaligned to its element size included); a short, missing or mislabelled file is an
error naming the file, the tensor and the chunk."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from shardspec.checkpoint.chunk_spans import Piece, SmallChunk, read_spans, small_entry
from shardspec.checkpoint.dcp_files import HeaderCache
from shardspec.checkpoint.dcp_reader import CheckpointReadError
from shardspec.reshard.reference import same_bits
from shardspec.testing.tensors import random_tensor

torch = pytest.importorskip("torch")

# dtypes whose archives have odd lengths next to wide ones: data lands unaligned in a span
TENSORS = [
    ("a", (3, 5), "uint8"),
    ("b", (7,), "bool"),
    ("c", (4, 3), "float64"),
    ("d", (2, 3, 2), "bfloat16"),
    ("e", (5, 2), "complex64"),
    ("f", (0, 4), "int16"),
    ("g", (6, 4), "int32"),
]


def _save(path: Path) -> tuple[dict[str, Any], Any]:
    import torch.distributed.checkpoint as dcp

    sd = {n: random_tensor(s, getattr(torch, d), i) for i, (n, s, d) in enumerate(TENSORS)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(sd, checkpoint_id=path, no_dist=True)
    md = dcp.FileSystemReader(path).read_metadata()
    return sd, md


def _chunks(
    path: Path, md: Any, boxes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]
) -> tuple[list[SmallChunk], dict[str, Any]]:
    """One chunk per tensor (saved whole), filling a fresh destination of ``boxes[name]``."""
    from torch.distributed.checkpoint.metadata import MetadataIndex

    outs: dict[str, Any] = {}
    chunks = []
    for name, _, dt in TENSORS:
        smd = md.state_dict_metadata[name]
        (c,) = smd.chunks
        index = MetadataIndex(name, c.offsets, 0)
        info = md.storage_data[index]
        assert small_entry(info)
        off, sizes = boxes[name]
        outs[name] = torch.zeros(sizes, dtype=getattr(torch, dt))
        piece = Piece(outs[name], (0,) * len(sizes), off, sizes)
        chunks.append(
            SmallChunk(index, os.path.join(path, info.relative_path), int(info.offset),
                       int(info.length), smd.properties.dtype, tuple(c.sizes), [piece])
        )  # fmt: skip
    return chunks, outs


def _whole(shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return (0,) * len(shape), shape


@pytest.mark.rule("CKPT-24")
@settings(max_examples=30, deadline=None)
@given(st.data())
def test_every_piece_of_every_dtype_lands_where_the_reference_puts_it(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    path = tmp_path_factory.mktemp("spans")
    sd, md = _save(path)
    boxes = {}
    for name, shape, _ in TENSORS:
        lo = tuple(data.draw(st.integers(0, n)) for n in shape)
        hi = tuple(data.draw(st.integers(a, n)) for a, n in zip(lo, shape))
        boxes[name] = (lo, tuple(b - a for a, b in zip(lo, hi)))
    chunks, outs = _chunks(path, md, boxes)
    nread, ranges = read_spans(chunks, trace=True)
    for name, _, _ in TENSORS:
        off, sizes = boxes[name]
        want = sd[name][tuple(slice(o, o + n) for o, n in zip(off, sizes))]
        assert same_bits(outs[name], want), name
    # every byte of every chunk read once, in one read per run of adjacent chunks
    assert nread == sum(c.length for c in chunks)
    assert sum(b - a for _, a, b in ranges) == nread
    assert len(ranges) < len(chunks)


def test_the_spans_put_some_chunks_data_off_its_element_alignment(tmp_path: Path) -> None:
    # the path that copies such data before viewing it typed is one the test above walks
    _, md = _save(tmp_path)
    chunks, _ = _chunks(tmp_path, md, {n: _whole(s) for n, s, _ in TENSORS})
    headers = HeaderCache()
    unaligned = []
    start = min(c.offset for c in chunks)
    with open(chunks[0].path, "rb") as f:
        blob = f.read()
    for c in chunks:
        saved = headers.locate(memoryview(blob[c.offset : c.offset + c.length]))
        if (c.offset - start + saved.data_offset) % saved.itemsize:
            unaligned.append(c.index.fqn)
    assert unaligned, "no chunk's data is unaligned: the test dtypes no longer reach it"


@pytest.mark.rule("CKPT-26")
@pytest.mark.parametrize("damage", ["truncate", "remove", "relabel"])
def test_a_damaged_file_names_the_file_the_tensor_and_the_chunk(
    tmp_path: Path, damage: str
) -> None:
    _, md = _save(tmp_path)
    chunks, _ = _chunks(tmp_path, md, {n: _whole(s) for n, s, _ in TENSORS})
    last = max(chunks, key=lambda c: c.offset)
    if damage == "truncate":
        os.truncate(last.path, last.offset + last.length - 1)
        match = rf"{last.path}: tensor '{last.index.fqn}' chunk at .*: the file is truncated"
    elif damage == "remove":
        os.remove(last.path)
        match = rf"{last.path}: tensor '.*' chunk at offsets .*: cannot open the file"
    else:  # the metadata says another size than the bytes hold
        last.sizes = (99,)
        match = rf"{last.path}: tensor '{last.index.fqn}' .*the metadata says .* of size \(99,\)"
    with pytest.raises(CheckpointReadError, match=match):
        read_spans(chunks, trace=False)


@pytest.mark.rule("CKPT-26")
def test_a_read_cut_short_after_the_size_check_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shardspec.checkpoint.chunk_spans as spans

    _, md = _save(tmp_path)
    chunks, _ = _chunks(tmp_path, md, {n: _whole(s) for n, s, _ in TENSORS})

    def short(fd: int, offset: int, size: int, into: Any = None) -> Any:
        raise EOFError(f"{size - 1} of {size} bytes at offset {offset}")

    monkeypatch.setattr(spans, "read_file_range", short)
    first = min(chunks, key=lambda c: c.offset)
    with pytest.raises(CheckpointReadError, match=rf"{first.path}: tensor '{first.index.fqn}' "):
        read_spans(chunks, trace=False)


def _save_rows(path: Path) -> tuple[dict[str, Any], Any]:
    """Three int16 (4, 6) tensors between odd-sized ones, so their data sits at different
    alignments in the file."""
    import torch.distributed.checkpoint as dcp

    sd: dict[str, Any] = {}
    for i in range(3):
        sd[f"odd{i}"] = random_tensor((2 * i + 1,), torch.uint8, 10 + i)
        sd[f"p{i}"] = random_tensor((4, 6), torch.int16, 20 + i)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, checkpoint_id=path, no_dist=True)
    return sd, dcp.FileSystemReader(path).read_metadata()


def _row_chunk(path: Path, md: Any, name: str, pieces: list[Piece]) -> SmallChunk:
    from torch.distributed.checkpoint.metadata import MetadataIndex

    smd = md.state_dict_metadata[name]
    (c,) = smd.chunks
    index = MetadataIndex(name, c.offsets, 0)
    info = md.storage_data[index]
    return SmallChunk(index, os.path.join(path, info.relative_path), int(info.offset),
                      int(info.length), smd.properties.dtype, tuple(c.sizes), pieces)  # fmt: skip


@pytest.mark.rule("CKPT-24")
def test_destinations_of_one_geometry_are_filled_together_from_several_chunks(
    tmp_path: Path,
) -> None:
    # destination j: rows [4k, 4k + 4) from p((j + k) % 3), columns 1-4 of each: three
    # destinations of one geometry (the gathered path), three pieces each, data unaligned
    sd, md = _save_rows(tmp_path)
    outs = [torch.zeros(12, 4, dtype=torch.int16) for _ in range(3)]
    pieces: dict[str, list[Piece]] = {f"p{i}": [] for i in range(3)}
    for j, out in enumerate(outs):
        for k in range(3):
            pieces[f"p{(j + k) % 3}"].append(Piece(out, (4 * k, 0), (0, 1), (4, 4)))
    chunks = [_row_chunk(tmp_path, md, name, ps) for name, ps in pieces.items()]
    read_spans(chunks, trace=False)
    for j, out in enumerate(outs):
        want = torch.cat([sd[f"p{(j + k) % 3}"][:, 1:5] for k in range(3)])
        assert same_bits(out, want), j


@pytest.mark.rule("CKPT-24")
def test_a_destination_its_pieces_do_not_tile_keeps_the_rest(tmp_path: Path) -> None:
    sd, md = _save_rows(tmp_path)
    out = torch.full((6, 6), 7, dtype=torch.int16)
    chunks = [
        _row_chunk(tmp_path, md, "p1", [Piece(out, (1, 0), (0, 0), (4, 6))]),
        _row_chunk(tmp_path, md, "p2", [Piece(out, (5, 2), (3, 1), (1, 3))]),
    ]
    read_spans(chunks, trace=False)
    want = torch.full((6, 6), 7, dtype=torch.int16)
    want[1:5] = sd["p1"]
    want[5, 2:5] = sd["p2"][3, 1:4]
    assert same_bits(out, want)
