"""The column encoding of a DCP checkpoint's metadata (CKPT-23): what rank 0 of a collective
load sends the other ranks instead of the ``.metadata`` file's bytes. Whatever it encodes
decodes to the same metadata (every chunk, every storage entry, whatever index a lookup
carries), checks the same way (the same layout or the same error naming the same chunks), and
what it cannot keep exactly it refuses, so that the file's bytes are sent instead."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from shardspec.checkpoint.chunks import ChunkError
from shardspec.checkpoint.dcp import checked_chunks
from shardspec.checkpoint.dcp_columns import ColumnChunks, ColumnStorage, decode, encode
from shardspec.checkpoint.dcp_metadata import RawTensorStorage

torch = pytest.importorskip("torch")
from torch.distributed.checkpoint.filesystem import _StorageInfo  # noqa: E402
from torch.distributed.checkpoint.metadata import (  # noqa: E402
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

WHERE = __import__("pathlib").Path("/ckpt/.metadata")
DTYPES = (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64, torch.uint8)


def _tiles(shape: tuple[int, ...], cuts: list[list[int]]) -> list[tuple[tuple[int, ...], ...]]:
    """The grid of boxes the cut points make: (offsets, sizes) each."""
    per_dim = []
    for n, cut in zip(shape, cuts):
        points = sorted({0, n, *(c for c in cut if 0 < c < n)})
        per_dim.append([(a, b - a) for a, b in itertools.pairwise(points)] or [(0, 0)])
    out = []
    for combo in itertools.product(*per_dim):
        out.append((tuple(o for o, _ in combo), tuple(s for _, s in combo)))
    return out


@st.composite
def tensor_entries(draw: Any, fqn: str) -> tuple[TensorStorageMetadata, dict[Any, Any]]:
    """A tensor's saved chunks, often a grid (sometimes with more than 64 chunks), sometimes
    damaged (a chunk dropped, moved, duplicated, an empty chunk at a taken offset, a negative
    offset), and its storage entries (sometimes missing)."""
    if draw(st.booleans()):  # 64 chunks or more: checked from the arrays at once
        ndim = draw(st.integers(1, 2))
        shape = (draw(st.integers(64, 150)),) if ndim == 1 else (8, draw(st.integers(8, 12)))
        step = draw(st.integers(1, 2)) if ndim == 1 else 1
        cuts = [list(range(step, n, step)) for n in shape]
    else:
        ndim = draw(st.integers(0, 3))
        shape = tuple(draw(st.lists(st.integers(0, 12), min_size=ndim, max_size=ndim)))
        cuts = [draw(st.lists(st.integers(1, 11), max_size=9)) for _ in shape]
    boxes = _tiles(shape, cuts) if shape else [((), ())]
    damage = draw(st.sampled_from(["none", "none", "drop", "move", "twice", "empty", "neg"]))
    boxes = list(boxes)
    if boxes and damage == "drop":
        boxes.pop(draw(st.integers(0, len(boxes) - 1)))
    elif boxes and damage == "move" and ndim:
        i = draw(st.integers(0, len(boxes) - 1))
        o, s = boxes[i]
        boxes[i] = ((o[0] + 1, *o[1:]), s)
    elif boxes and damage == "twice":
        boxes.append(boxes[draw(st.integers(0, len(boxes) - 1))])
    elif boxes and damage == "empty" and ndim:
        o, _ = boxes[draw(st.integers(0, len(boxes) - 1))]
        boxes.append((o, (0,) * ndim))
    elif boxes and damage == "neg" and ndim:
        i = draw(st.integers(0, len(boxes) - 1))
        o, s = boxes[i]
        boxes[i] = ((-1, *o[1:]), s)
    chunks = [ChunkStorageMetadata(torch.Size(o), torch.Size(s)) for o, s in boxes]
    props = TensorProperties(dtype=draw(st.sampled_from(DTYPES)))
    smd = TensorStorageMetadata(props, torch.Size(shape), chunks)
    storage: dict[Any, Any] = {}
    files = draw(st.lists(st.sampled_from(["__0_0.distcp", "__1_0.distcp", "d/ü.distcp"]),
                          min_size=1, max_size=3))  # fmt: skip
    missing = draw(st.booleans()) and draw(st.booleans())
    for i, c in enumerate(chunks):
        if missing and i % 3 == 1:
            continue
        storage[MetadataIndex(fqn, c.offsets, i)] = _StorageInfo(
            files[i % len(files)], draw(st.integers(0, 2**40)), draw(st.integers(0, 2**20))
        )
    return smd, storage


@st.composite
def metadatas(draw: Any) -> Metadata:
    sdm: dict[str, Any] = {}
    storage: dict[Any, Any] = {}
    for k in range(draw(st.integers(0, 4))):
        fqn = f"layer.{k}.w" if k % 2 else f"m{k}"
        if draw(st.integers(0, 4)) == 0:
            sdm[fqn] = BytesStorageMetadata()
            storage[MetadataIndex(fqn)] = _StorageInfo("__0_0.distcp", k, 7)
            continue
        smd, entries = draw(tensor_entries(fqn))
        sdm[fqn] = smd
        storage.update(entries)
    planner = {k: (k,) for k in sdm}
    return Metadata(sdm, planner_data=planner, storage_data=storage,
                    storage_meta=StorageMeta(checkpoint_id="/ckpt"))  # fmt: skip


def _same_verdict(fqn: str, a: Any, b: Any) -> None:
    def verdict(smd: Any) -> Any:
        try:
            return checked_chunks(fqn, smd)
        except ChunkError as e:
            return e

    va, vb = verdict(a), verdict(b)
    if isinstance(va, ChunkError):
        assert isinstance(vb, ChunkError), (va, vb)
        assert (str(va), va.kind, va.chunks, va.point) == (str(vb), vb.kind, vb.chunks, vb.point)
    else:
        assert not isinstance(vb, ChunkError), vb
        assert va == vb and va.fingerprint() == vb.fingerprint()


@pytest.mark.rule("CKPT-23")
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(metadatas())
def test_decoded_metadata_is_the_encoded_one(md: Metadata) -> None:
    blob = encode(md)
    assert blob is not None
    got = decode(blob, WHERE)
    assert list(got.state_dict_metadata) == list(md.state_dict_metadata)
    assert got.planner_data == md.planner_data and got.storage_meta == md.storage_meta
    assert got.version == md.version
    for fqn, want in md.state_dict_metadata.items():
        have = got.state_dict_metadata[fqn]
        assert type(have) is type(want)
        if isinstance(want, TensorStorageMetadata):
            assert isinstance(have.chunks, ColumnChunks)
            assert have.size == want.size and have.properties == want.properties
            assert list(have.chunks) == want.chunks and len(have.chunks) == len(want.chunks)
            assert [have.chunks[i] for i in range(len(want.chunks))] == want.chunks
            assert have.chunks[1:3] == want.chunks[1:3]
            _same_verdict(fqn, have, want)
    storage = got.storage_data
    assert isinstance(storage, ColumnStorage)
    assert set(storage) == set(md.storage_data) and len(storage) == len(md.storage_data)
    for n, (key, info) in enumerate(md.storage_data.items()):
        assert storage[key] == info
        if n % 7 == 0:  # a lookup finds the entry by key and offsets whatever index it carries
            for index in (None, 0, 3, 10**6, -1):
                assert storage.get(MetadataIndex(key.fqn, key.offset, index)) == info
    for fqn, smd in md.state_dict_metadata.items():
        if isinstance(smd, TensorStorageMetadata):
            for i, c in enumerate(smd.chunks):
                want = md.storage_data.get(MetadataIndex(fqn, c.offsets, i))
                assert storage.get(MetadataIndex(fqn, c.offsets, i)) == want
                entry = storage.entry(fqn, i)
                expect = (want.relative_path, want.offset, want.length) if want else None
                assert entry == expect
            assert storage.get(MetadataIndex(fqn, (10**6,) * max(1, len(smd.size)), 0)) is None
    assert storage.get(MetadataIndex("no such key", torch.Size([0]))) is None


def _one(boxes: list[tuple[int, int]] | None = None, **change: Any) -> Metadata:
    """A tensor of 140 elements in 70 chunks of 2, or in ``boxes`` (offset, size)."""
    boxes = boxes or [(2 * i, 2) for i in range(70)]
    chunks = [ChunkStorageMetadata(torch.Size([o]), torch.Size([n])) for o, n in boxes]
    smd = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([140]), chunks)
    storage: dict[Any, Any] = {
        MetadataIndex("w", c.offsets, i): _StorageInfo("__0_0.distcp", 8 * i, 8)
        for i, c in enumerate(chunks)
    }
    md = Metadata({"w": smd}, storage_data=storage)
    for name, value in change.items():
        if name == "storage":
            value(md.storage_data)
        elif name == "chunk":
            value(md.state_dict_metadata["w"].chunks)  # type: ignore[union-attr]
    return md


def _set_first(storage: dict[Any, Any], info: Any) -> None:
    storage[next(iter(storage))] = info


@pytest.mark.rule("CKPT-23")
@pytest.mark.parametrize(
    "damage",
    [
        # what only the pickle keeps exactly
        lambda s: _set_first(s, _StorageInfo("f", 0, 8, transform_descriptors=["zstd"])),
        lambda s: _set_first(s, RawTensorStorage("f", 0, 8, b"pickle")),
        lambda s: _set_first(s, _StorageInfo("f\0g", 0, 8)),
        lambda s: _set_first(s, _StorageInfo("f", 0.0, 8)),
        lambda s: _set_first(s, _StorageInfo("f", 2**64, 8)),
        lambda s: _set_first(s, _StorageInfo("f", True, 8)),
        lambda s: s.__setitem__(MetadataIndex("w", torch.Size([1]), 0), _StorageInfo("f", 0, 8)),
        lambda s: s.__setitem__(MetadataIndex("gone", torch.Size([0]), 0), _StorageInfo("f", 0, 8)),
        lambda s: s.__setitem__(MetadataIndex("w"), _StorageInfo("f", 0, 8)),
    ],
)
def test_entries_only_the_pickle_keeps_are_not_encoded(damage: Any) -> None:
    assert encode(_one()) is not None
    assert encode(_one(storage=damage)) is None


@pytest.mark.rule("CKPT-23")
@pytest.mark.parametrize(
    "chunk",
    [
        ChunkStorageMetadata(torch.Size([2**63]), torch.Size([2])),
        ChunkStorageMetadata((0,), torch.Size([2])),  # type: ignore[arg-type]
        ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([2, 2])),
    ],
)
def test_chunks_only_the_pickle_keeps_are_not_encoded(chunk: Any) -> None:
    assert encode(_one(chunk=lambda cs: cs.append(chunk))) is None


@pytest.mark.rule("CKPT-23")
def test_a_tensor_of_many_chunks_checks_from_its_arrays_and_names_the_culprits() -> None:
    md = _one([(2 * i, 2) for i in range(69)] + [(137, 3)])
    got = decode(encode(md) or b"", WHERE)
    with pytest.raises(ChunkError) as e:
        checked_chunks("w", got.state_dict_metadata["w"])
    # hand-worked: chunk 68 is [136, 138), chunk 69 [137, 140): they overlap in [137, 138)
    assert e.value.kind == "overlap" and e.value.chunks == (68, 69)
    assert "#68" in str(e.value) and "#69" in str(e.value)
    good = decode(encode(_one()) or b"", WHERE).state_dict_metadata["w"]
    layout = checked_chunks("w", good)
    assert layout.boxes_of(69)[0].offsets == (138,) and len(layout) == 70


@pytest.mark.rule("CKPT-23")
def test_a_broken_encoding_is_refused() -> None:
    blob = encode(_one()) or b""
    with pytest.raises(ValueError, match="column encoding"):
        decode(b"x" + blob, WHERE)
    with pytest.raises(ValueError, match="wrong length"):
        decode(blob + b"\0" * 8, WHERE)


def test_skeleton_is_the_metadata_without_its_chunks() -> None:
    md = _one()
    blob = encode(md) or b""
    # the chunk table is 70 x (1 + 1 + 3) int64 values and the counts: the skeleton is small
    assert len(blob) < 70 * 5 * 8 + 2_000
    got = decode(blob, WHERE)
    assert dataclasses.replace(got, state_dict_metadata={}, storage_data=None) == (
        dataclasses.replace(md, state_dict_metadata={}, storage_data=None)
    )
