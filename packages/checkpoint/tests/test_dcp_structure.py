"""A parsed ``.metadata``'s fields checked before anything reads them (CKPT-5,
``shardspec.checkpoint.dcp_structure``): a real DCP checkpoint's metadata with one field
spoiled at a time is refused naming the entry, by the reader and by every path that reads it
(``dcp.load`` with our reader, the offline rewrite); an untouched one passes."""

from __future__ import annotations

import builtins
import dataclasses
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from shardspec.checkpoint.dcp_metadata import read_metadata

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

SHAPES = {"a": (5, 3), "b": (4,), "c": (), "d": (0, 2), "e": (2, 2, 3)}


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint of tensors of several ranks (a 0-d and an empty one) and two values,
    saved by DCP in one process."""
    path = tmp_path_factory.mktemp("structure") / "ck"
    sd: dict[str, Any] = {k: torch.arange(int(torch.Size(s).numel()), dtype=torch.float32)
                          .reshape(s) for k, s in SHAPES.items()}  # fmt: skip
    sd["n"], sd["blob"] = 7, b"bytes"
    dcp.save(sd, checkpoint_id=str(path), no_dist=True)
    return path


@pytest.fixture(scope="module")
def saved(plain: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """:func:`plain` with "a" in two row chunks in its metadata (the bytes not rewritten: the
    reader is not asked here but for the other tensors)."""
    path = tmp_path_factory.mktemp("split") / "ck"
    shutil.copytree(plain, path)
    md = pickle.loads((path / ".metadata").read_bytes())  # written here: trusted
    smd = md.state_dict_metadata["a"]
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    key = next(k for k in md.storage_data if k.fqn == "a")
    info = md.storage_data.pop(key)
    smd.chunks = [
        ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([2, 3])),
        ChunkStorageMetadata(torch.Size([2, 0]), torch.Size([3, 3])),
    ]
    for i, c in enumerate(smd.chunks):
        md.storage_data[MetadataIndex("a", c.offsets, i)] = info
    (path / ".metadata").write_bytes(pickle.dumps(md))
    return path


def _spoiled(saved: Path, tmp: Path, spoil: Callable[[Any], Any]) -> Path:
    out = tmp / "ck"
    shutil.copytree(saved, out)
    md = pickle.loads((out / ".metadata").read_bytes())
    md = spoil(md) or md
    (out / ".metadata").write_bytes(pickle.dumps(md))
    return out


def _entry(md: Any, fqn: str, i: int = 0) -> Any:
    return [k for k in md.storage_data if k.fqn == fqn][i]


def _set_info(md: Any, fqn: str, **fields: Any) -> None:
    key = _entry(md, fqn)
    md.storage_data[key] = dataclasses.replace(md.storage_data[key], **fields)


def _drop_length(md: Any) -> None:
    info = md.storage_data[_entry(md, "b")]
    del info.__dict__["length"]


# (id, spoil, words the error must hold)
SPOILS: list[tuple[str, Callable[[Any], Any], tuple[str, ...]]] = [
    ("sdm-list", lambda md: setattr(md, "state_dict_metadata", []), ("state_dict_metadata",)),
    ("storage-none", lambda md: setattr(md, "storage_data", None), ("storage_data",)),
    ("storage-meta-str", lambda md: setattr(md, "storage_meta", "x"), ("storage_meta",)),
    ("key-int", lambda md: md.state_dict_metadata.update({3: md.state_dict_metadata["b"]}),
     ("3",)),
    ("no-properties", lambda md: setattr(md.state_dict_metadata["b"], "properties", None),
     ("'b'", "properties")),
    ("dtype-str", lambda md: setattr(md.state_dict_metadata["e"].properties, "dtype", "f32"),
     ("'e'", "dtype")),
    ("size-negative", lambda md: setattr(md.state_dict_metadata["a"], "size", (-5, 3)),
     ("'a'", "size")),
    ("size-none", lambda md: setattr(md.state_dict_metadata["c"], "size", None), ("'c'", "size")),
    ("chunks-none", lambda md: setattr(md.state_dict_metadata["d"], "chunks", None),
     ("'d'", "chunks")),
    ("chunk-tuple", lambda md: md.state_dict_metadata["a"].chunks.__setitem__(1, (0, 0)),
     ("chunk 1", "'a'")),
    ("offsets-floats", lambda md: setattr(md.state_dict_metadata["a"].chunks[1], "offsets",
                                          [2.0, 0.0]), ("chunk 1", "'a'", "offsets")),
    ("offsets-bools", lambda md: setattr(md.state_dict_metadata["a"].chunks[0], "offsets",
                                         [False, False]), ("chunk 0", "'a'", "offsets")),
    ("sizes-rank", lambda md: setattr(md.state_dict_metadata["e"].chunks[0], "sizes", [2, 2]),
     ("chunk 0", "'e'", "sizes")),
    ("storage-key-str", lambda md: md.storage_data.update({"k": md.storage_data[_entry(md, "b")]}),
     ("'k'", "MetadataIndex")),
    ("entry-unknown-key", lambda md: md.storage_data.update(
        {dataclasses.replace(_entry(md, "b"), fqn="zz"): md.storage_data[_entry(md, "b")]}),
     ("'zz'", "does not describe")),
    ("path-absolute", lambda md: _set_info(md, "b", relative_path="/etc/hostname"),
     ("'b'", "outside")),
    ("path-up", lambda md: _set_info(md, "a", relative_path="../ck/__0_0.distcp"),
     ("'a'", "outside")),
    ("path-nul", lambda md: _set_info(md, "n", relative_path="__0_0\0.distcp"), ("'n'", "outside")),
    ("path-int", lambda md: _set_info(md, "e", relative_path=5), ("'e'", "not a str")),
    ("offset-negative", lambda md: _set_info(md, "c", offset=-1), ("'c'", "offset -1")),
    ("length-float", lambda md: _set_info(md, "blob", length=5.0), ("'blob'", "length 5.0")),
    ("length-missing", _drop_length, ("'b'", "length")),
    ("transforms-int", lambda md: _set_info(md, "d", transform_descriptors=5),
     ("'d'", "transform_descriptors")),
]  # fmt: skip


@pytest.mark.rule("CKPT-5")
def test_an_untouched_checkpoint_passes_and_loads(saved: Path) -> None:
    md = read_metadata(saved)
    assert set(md.state_dict_metadata) == {*SHAPES, "n", "blob"}
    out = {k: torch.zeros(s) for k, s in SHAPES.items() if k != "a"}
    from shardspec.checkpoint import FileSystemReader, LoadPlanner

    dcp.load(out, storage_reader=FileSystemReader(str(saved)), planner=LoadPlanner(),
             no_dist=True)  # fmt: skip
    for k, t in out.items():
        assert torch.equal(t, torch.arange(t.numel(), dtype=torch.float32).reshape(t.shape)), k


@pytest.mark.rule("CKPT-5")
@pytest.mark.parametrize(("spoil", "words"), [(s, w) for _, s, w in SPOILS],
                         ids=[i for i, _, _ in SPOILS])  # fmt: skip
def test_a_spoiled_field_is_refused_naming_the_entry(
    saved: Path, tmp_path: Path, spoil: Callable[[Any], Any], words: tuple[str, ...]
) -> None:
    ck = _spoiled(saved, tmp_path, spoil)
    with pytest.raises(pickle.UnpicklingError) as e:
        read_metadata(ck)
    msg = str(e.value)
    assert str(ck / ".metadata") in msg and "not a readable DCP metadata file" in msg
    for w in words:
        assert w in msg, (w, msg)


@pytest.mark.rule("CKPT-5")
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_bad_value_in_any_chunk_names_that_chunk(
    saved: Path, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """Not only the first: the chunk, the field and the dim spoiled are drawn."""
    md0 = read_metadata(saved)
    keys = [k for k, v in md0.state_dict_metadata.items() if getattr(v, "chunks", None)
            and len(v.size) > 0]  # fmt: skip
    fqn = data.draw(st.sampled_from(sorted(keys)), label="tensor")
    n = len(md0.state_dict_metadata[fqn].chunks)
    ci = data.draw(st.integers(0, n - 1), label="chunk")
    field = data.draw(st.sampled_from(["offsets", "sizes"]), label="field")
    ndim = len(md0.state_dict_metadata[fqn].size)
    dim = data.draw(st.integers(0, ndim - 1), label="dim")
    bad = data.draw(st.sampled_from([-1, 1.0, "1", None, True, 2**70]), label="value")

    def spoil(md: Any) -> None:
        c = md.state_dict_metadata[fqn].chunks[ci]
        values = list(getattr(c, field))
        values[dim] = bad
        setattr(c, field, values)

    ck = _spoiled(saved, tmp_path_factory.mktemp("drawn"), spoil)
    if bad == 2**70:  # an int, non-negative: CKPT-1 (where the chunks are used) refuses it
        read_metadata(ck)
        return
    with pytest.raises(pickle.UnpicklingError, match=rf"chunk {ci} of tensor '{fqn}' has {field}"):
        read_metadata(ck)


@pytest.mark.rule("CKPT-5", "CKPT-6")
def test_the_commands_read_odd_sizes_for_the_verdict_and_refuse_the_rest(
    saved: Path, tmp_path: Path
) -> None:
    def odd(md: Any) -> None:
        md.state_dict_metadata["a"].chunks[1].offsets = [2.0, 0]

    ck = _spoiled(saved, tmp_path / "odd", odd)
    with pytest.raises(pickle.UnpicklingError):
        read_metadata(ck)
    md = read_metadata(ck, strict=False)  # the verdict names them (CKPT-6)
    assert md.state_dict_metadata["a"].chunks[1].offsets == [2.0, 0]
    ck = _spoiled(saved, tmp_path / "outside", lambda md: _set_info(md, "b", relative_path="/x"))
    with pytest.raises(pickle.UnpicklingError, match="outside the checkpoint"):
        read_metadata(ck, strict=False)


class _Runs:
    def __reduce__(self) -> Any:
        return (builtins.exec, ("import pathlib; pathlib.Path(MARK).write_text('ran')",))


@pytest.mark.rule("CKPT-5")
def test_dcp_load_with_our_reader_runs_nothing_a_hostile_file_names(
    saved: Path, tmp_path: Path
) -> None:
    from torch.distributed.checkpoint.api import CheckpointException

    from shardspec.checkpoint import FileSystemReader, LoadPlanner

    mark = tmp_path / "ran"
    ck = _spoiled(saved, tmp_path / "evil", lambda md: setattr(md, "planner_data", _Runs()))
    builtins.MARK = str(mark)  # type: ignore[attr-defined]
    try:
        with pytest.raises(CheckpointException) as e:
            dcp.load({"b": torch.zeros(4)}, storage_reader=FileSystemReader(str(ck)),
                     planner=LoadPlanner(), no_dist=True)  # fmt: skip
    finally:
        del builtins.MARK  # type: ignore[attr-defined]
    assert not mark.exists()
    assert "builtins.exec" in str(e.value)


@pytest.mark.rule("CKPT-5")
def test_the_offline_rewrite_refuses_a_spoiled_file_in_words(
    plain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardspec.checkpoint.offline import main

    ck = _spoiled(plain, tmp_path / "src", lambda md: _set_info(md, "blob", length=2**62))
    rc = main([str(ck), str(tmp_path / "dst"), "--like", str(plain)])
    err = capsys.readouterr().err
    assert rc == 2 and "truncated at 'blob'" in err, err
    assert not (tmp_path / "dst").exists()


@pytest.mark.rule("CKPT-1", "CKPT-5")
@pytest.mark.parametrize("offsets", [[0.0, 0], [False, 0], [0, 0.0]], ids=repr)
def test_the_chunk_check_does_not_take_equal_floats_for_a_checked_geometry(
    offsets: list[Any],
) -> None:
    """Metadata a planner gets from another reader (DCP's own) is checked by CKPT-1 alone:
    its cache of valid chunkings must not answer for 0.0 or False as for 0."""
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        TensorProperties,
        TensorStorageMetadata,
    )

    from shardspec.checkpoint.chunks import ChunkError
    from shardspec.checkpoint.dcp import checked_chunks

    def smd(at: Any) -> Any:
        chunk = ChunkStorageMetadata(at, torch.Size([4, 6]))
        return TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([4, 6]),
                                     [chunk])  # fmt: skip

    checked_chunks("w", smd(torch.Size([0, 0])))  # valid: its geometry is cached
    with pytest.raises(ChunkError, match=r"'w'.*must be integers"):
        checked_chunks("w", smd(offsets))


@pytest.mark.rule("CKPT-6")
def test_the_commands_show_extents_that_are_no_numbers() -> None:
    from shardspec.checkpoint.cli_common import span

    assert span(2, 3) == "2:5" and span(0.5, 1) == "0.5:1.5"
    assert span("2", 3) == "'2'+3" and span(2, None) == "2+None"
