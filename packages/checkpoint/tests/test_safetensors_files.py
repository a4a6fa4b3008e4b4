"""A Hugging Face safetensors checkpoint read as DCP's ``Metadata`` (spec/09-checkpoint.md,
CKPT-22): :func:`read_headers` on one rank, :func:`metadata_from_headers` on every rank.

The oracle is the ``safetensors`` package itself: checkpoints are written with
``safetensors.torch.save_file`` (one file, or shards with the index JSON Hugging Face writes)
and each tensor's byte range, read raw and viewed as the metadata's dtype and shape, must be
``safetensors.torch.load_file``'s tensor bit for bit. Damaged files are built by hand, one
fault each, and must be refused with the file (and tensor) named. torch's own
``HuggingFaceStorageReader`` is checked on the same checkpoints: it is the baseline the
collective load is compared with."""

from __future__ import annotations

import json
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from shardspec.checkpoint.safetensors_files import (
    MAX_HEADER_BYTES,
    SafetensorsError,
    SafetensorsStorage,
    data_dir,
    is_safetensors,
    metadata_from_headers,
    read_headers,
)
from shardspec.metadata.strategies import shapes

torch = pytest.importorskip("torch")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from torch.distributed.checkpoint.metadata import MetadataIndex  # noqa: E402

from shardspec.testing.tensors import random_tensor  # noqa: E402

pytestmark = [
    pytest.mark.rule("CKPT-22"),
    # dcp.load without a process group says it assumes one process
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]

# Every torch dtype safetensors.torch saves (getattr: the float8/float4 names are recent).
DTYPES = [
    dt
    for name in (
        "bool",
        "uint8",
        "int8",
        "int16",
        "uint16",
        "int32",
        "uint32",
        "int64",
        "uint64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
        "float4_e2m1fn_x2",
        "complex64",
    )
    if (dt := getattr(torch, name, None)) is not None
]
# torch 2.13's HuggingFaceStorageReader looks dtypes up in safetensors.torch._TYPES, which
# lacks these two (its read_metadata raises KeyError): see test_hf_reader_refuses_*.
HF_READER_MISSING = {"F8_E8M0": "float8_e8m0fnu", "F4": "float4_e2m1fn_x2"}
INDEX = "model.safetensors.index.json"


# ---- drawing checkpoints ----


@st.composite
def state_dicts(draw: st.DrawFn, dtypes: list[Any] = DTYPES) -> dict[str, Any]:
    """1-5 tensors of any dtype: 0-d, zero-size and 1-3 dims; names with dots as in models."""
    names = draw(
        st.lists(
            st.from_regex(r"[a-z]{1,3}(\.[a-z0-9]{1,3}){0,2}", fullmatch=True),
            min_size=1,
            max_size=5,
            unique=True,
        )
    )
    out = {}
    for name in names:
        dtype = draw(st.sampled_from(dtypes))
        # float4_e2m1fn_x2 packs two values per element: the format has no 0-d one
        min_dims = 1 if dtype == getattr(torch, "float4_e2m1fn_x2", None) else 0
        shape = draw(shapes(min_dims=min_dims, max_dims=3, max_side=5))
        out[name] = random_tensor(shape, dtype, draw(st.integers(0, 2**16)))
    return out


def shard_name(i: int, n: int) -> str:
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def write_sharded(root: Path, sd: dict[str, Any], owner: list[int]) -> Path:
    """``sd`` split over files as ``owner`` says (tensor i in file owner[i]), with the index
    JSON Hugging Face writes (``metadata.total_size``, ``weight_map``); returns the dir."""
    files = sorted(set(owner))
    n = len(files)
    weight_map = {}
    total = 0
    for k, f in enumerate(files):
        part = {name: t for (name, t), o in zip(sd.items(), owner) if o == f}
        save_file(part, str(root / shard_name(k, n)), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard_name(k, n)))
        total += sum(t.numel() * t.element_size() for t in part.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True))
    return root


@st.composite
def checkpoints(draw: st.DrawFn) -> tuple[dict[str, Any], str, list[int]]:
    """(state dict, how it is written, the file of each tensor): ``file`` (one .safetensors
    file, passed as the path), ``dir`` (a directory holding model.safetensors) or
    ``sharded`` (shards and the index)."""
    sd = draw(state_dicts())
    kind = draw(st.sampled_from(["file", "dir", "sharded"]))
    owner = [0] * len(sd)
    if kind == "sharded":
        owner = draw(st.lists(st.integers(0, 2), min_size=len(sd), max_size=len(sd)))
    return sd, kind, owner


def write(root: Path, sd: dict[str, Any], kind: str, owner: list[int]) -> Path:
    if kind == "sharded":
        return write_sharded(root, sd, owner)
    save_file(sd, str(root / "model.safetensors"))
    return root / "model.safetensors" if kind == "file" else root


def expected(path: Path) -> dict[str, Any]:
    """Every tensor of the checkpoint as safetensors itself loads it."""
    root = data_dir(path)
    files = [path] if path.is_file() else sorted(root.glob("*.safetensors"))
    out: dict[str, Any] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def raw(t: Any) -> bytes:
    """The tensor's bytes, row-major (NaN payloads, -0.0 and all)."""
    flat = t.contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy().tobytes()) if flat.numel() else b""


def from_bytes(data: bytes, dtype: Any, shape: tuple[int, ...]) -> Any:
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0)
    return buf.to(torch.uint8).view(dtype).reshape(shape)


# ---- drawn checkpoints read back ----


@given(checkpoints())
@settings(max_examples=80)
def test_each_tensors_byte_range_is_what_safetensors_loads(
    case: tuple[dict[str, Any], str, list[int]],
) -> None:
    sd, kind, owner = case
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp), sd, kind, owner)
        assert is_safetensors(path)
        blob = read_headers(path)
        # canonical: the same checkpoint gives the same bytes on any rank that reads it
        assert blob == read_headers(path)
        assert blob == json.dumps(json.loads(blob), sort_keys=True, separators=(",", ":")).encode()
        md = metadata_from_headers(blob, path)
        want = expected(path)
        assert sorted(md.state_dict_metadata) == sorted(want)
        for name, t in want.items():
            tmd = md.state_dict_metadata[name]
            zeros = torch.Size([0] * t.dim())
            assert (tmd.properties.dtype, tmd.size) == (t.dtype, t.shape), name
            assert [(c.offsets, c.sizes) for c in tmd.chunks] == [(zeros, t.shape)], name
            st_ = md.storage_data[MetadataIndex(name, zeros, 0)]
            assert isinstance(st_, SafetensorsStorage)
            nbytes = t.numel() * t.element_size()
            saved = st_.saved_tensor
            assert st_.length == saved.data_length == nbytes, name
            assert (saved.dtype, saved.size, saved.storage_offset) == (t.dtype, tuple(t.shape), 0)
            assert saved.stride == torch.empty(t.shape, dtype=t.dtype).stride(), name
            assert (saved.itemsize, saved.data_offset) == (t.element_size(), 0), name
            with open(data_dir(path) / st_.relative_path, "rb") as f:
                f.seek(st_.offset)
                data = f.read(st_.length)
            got = from_bytes(data, tmd.properties.dtype, tuple(tmd.size))
            assert (got.dtype, got.shape) == (t.dtype, t.shape), name
            assert raw(got) == raw(t), name
            if kind == "sharded":
                index = json.loads((path / INDEX).read_text())
                assert st_.relative_path == index["weight_map"][name], name


def test_a_scalar_and_a_zero_size_tensor_by_hand(tmp_path: Path) -> None:
    sd = {"s": torch.tensor(-0.0), "z": torch.empty(3, 0, 2, dtype=torch.bfloat16)}
    save_file(sd, str(tmp_path / "model.safetensors"))
    md = metadata_from_headers(read_headers(tmp_path), tmp_path)
    s = md.storage_data[MetadataIndex("s", [], 0)]
    z = md.storage_data[MetadataIndex("z", [0, 0, 0], 0)]
    assert (s.length, s.saved_tensor.size, s.saved_tensor.stride) == (4, (), ())
    assert (z.length, z.saved_tensor.size, z.saved_tensor.stride) == (0, (3, 0, 2), (2, 2, 1))
    data = (tmp_path / "model.safetensors").read_bytes()[s.offset : s.offset + 4]
    assert data == struct.pack("<f", -0.0)


def test_is_safetensors(tmp_path: Path) -> None:
    save_file({"a": torch.ones(2)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "notes.txt").write_text("x")
    assert is_safetensors(tmp_path)
    assert is_safetensors(tmp_path / "model.safetensors")
    assert not is_safetensors(tmp_path / "notes.txt")
    assert not is_safetensors(tmp_path / "absent")
    index_only = tmp_path / "index_only"
    index_only.mkdir()
    (index_only / INDEX).write_text("{}")
    assert is_safetensors(index_only)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert not is_safetensors(empty)
    (tmp_path / ".metadata").write_bytes(b"")  # a DCP checkpoint beside the file
    assert not is_safetensors(tmp_path)


# ---- hostile files: one fault each, refused naming the file and the tensor ----


def write_raw(path: Path, header: dict[str, Any] | bytes, data: bytes, extra_len: int = 0) -> Path:
    """A safetensors file from a header (a dict, or bytes as they are) and data bytes;
    ``extra_len`` is added to the header length written in the first 8 bytes."""
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h) + extra_len) + h + data)
    return path


def tensor(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


# a good file: "a" 4 bytes, "b" two float32 (8 bytes)
GOOD = {"a": tensor("U8", [4], 0, 4), "b": tensor("F32", [2], 4, 12)}


def one_file(header: dict[str, Any] | bytes, data: bytes = bytes(12), extra_len: int = 0) -> Any:
    def build(root: Path) -> tuple[Path, Path]:
        f = write_raw(root / "model.safetensors", header, data, extra_len)
        return root, f

    return build


def with_b(**changes: Any) -> dict[str, Any]:
    return {**GOOD, "b": {**GOOD["b"], **changes}}


def sharded(files: dict[str, dict[str, Any]], weight_map: dict[str, str], bad: str) -> Any:
    """Shards with these headers (data sized to fit) and this weight_map; ``bad`` the file
    the error must name."""

    def build(root: Path) -> tuple[Path, Path]:
        for name, header in files.items():
            end = max((t["data_offsets"][1] for t in header.values()), default=0)
            write_raw(root / name, header, bytes(end))
        (root / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
        return root, root / bad

    return build


F1, F2 = shard_name(0, 2), shard_name(1, 2)
A_ONLY = {"a": tensor("U8", [4], 0, 4)}
B_ONLY = {"b": tensor("F32", [2], 0, 8)}

HOSTILE = [
    # (id, build, tensor the message names or None, what the message says)
    ("index-names-a-missing-file", sharded({F1: A_ONLY}, {"a": F1, "b": F2}, F2), "b", "missing"),
    ("header-length-past-file", one_file(GOOD, extra_len=13), None, "past the end"),
    ("header-length-over-100MB", one_file(GOOD, extra_len=MAX_HEADER_BYTES), None, "limit"),
    ("file-shorter-than-8-bytes", lambda r: (r, _short_file(r)), None, "8-byte"),
    ("header-not-json", one_file(b'{"a": {'), None, "not JSON"),
    ("header-not-utf8", one_file(b'{"\xff": 1}'), None, "not UTF-8"),
    ("header-nan", one_file(b'{"a": NaN}'), None, "not JSON"),
    ("header-a-list", one_file(b"[1, 2]"), None, "not a dict"),
    ("header-a-string", one_file(b'"x"'), None, "not a dict"),
    ("header-repeats-a-tensor", one_file(b'{"b": 1, "b": 2}'), "b", "twice"),
    ("entry-not-a-dict", one_file({**GOOD, "b": [1, 2]}), "b", "not a dict"),
    ("entry-without-shape", one_file({**GOOD, "b": {"dtype": "F32"}}), "b", "shape"),
    ("offsets-one-int", one_file(with_b(data_offsets=[4])), "b", "two ints"),
    ("offsets-three-ints", one_file(with_b(data_offsets=[4, 8, 12])), "b", "two ints"),
    ("offsets-a-string", one_file(with_b(data_offsets=[4, "12"])), "b", "two ints"),
    ("offsets-a-float", one_file(with_b(data_offsets=[4, 12.0])), "b", "two ints"),
    ("offsets-a-bool", one_file(with_b(data_offsets=[True, 12])), "b", "two ints"),
    ("offsets-null", one_file(with_b(data_offsets=None)), "b", "two ints"),
    ("offsets-negative", one_file(with_b(data_offsets=[-4, 4])), "b", "two ints"),
    ("offsets-begin-after-end", one_file(with_b(data_offsets=[12, 4])), "b", "begin <= end"),
    ("end-past-the-data", one_file(with_b(shape=[3], data_offsets=[4, 16])), "b", "run past"),
    ("length-not-the-shapes", one_file(with_b(shape=[3])), "b", "needs 12"),
    ("length-not-the-dtypes", one_file(with_b(dtype="F64")), "b", "needs 16"),
    ("sub-byte-length", one_file(with_b(dtype="F4", shape=[3])), "b", "whole number of bytes"),
    ("unknown-dtype", one_file(with_b(dtype="F128")), "b", "unknown dtype"),
    ("dtype-not-a-string", one_file(with_b(dtype=4)), "b", "unknown dtype"),
    ("shape-negative", one_file(with_b(shape=[-2])), "b", "non-negative ints"),
    ("shape-a-float", one_file(with_b(shape=[2.0])), "b", "non-negative ints"),
    ("shape-a-string", one_file(with_b(shape="2")), "b", "non-negative ints"),
    ("metadata-not-strings", one_file({**GOOD, "__metadata__": {"k": 1}}), None, "strings"),
    ("overlap", one_file(with_b(data_offsets=[2, 10]), bytes(10)), "b", "overlap"),
    ("hole", one_file(with_b(data_offsets=[6, 14]), bytes(14)), "b", "no tensor"),
    ("trailing-bytes", one_file(GOOD, bytes(16)), None, r"\[12, 16\)"),
    (
        "tensor-absent-from-its-file",
        sharded({F1: A_ONLY, F2: {}}, {"a": F1, "b": F2}, F2),
        "b",
        "has no tensor",
    ),
    (
        "tensor-in-a-file-the-index-does-not-assign",
        sharded(
            {F1: A_ONLY, F2: {**B_ONLY, "c": tensor("U8", [1], 8, 9)}},
            {"a": F1, "b": F2, "c": F1},
            F2,
        ),
        "c",
        "assigns to",
    ),
    (
        "tensor-the-index-does-not-list",
        sharded({F1: A_ONLY, F2: {**B_ONLY, "c": tensor("U8", [1], 8, 9)}}, {"a": F1, "b": F2}, F2),
        "c",
        "does not list",
    ),
    (
        "tensor-in-two-files",
        sharded({F1: {**A_ONLY, "b": tensor("U8", [1], 4, 5)}, F2: B_ONLY}, {"a": F1, "b": F2}, F2),
        "b",
        "two files",
    ),
    (
        "index-file-outside-the-dir",
        sharded({F1: A_ONLY}, {"a": "../" + F1}, "../" + F1),
        None,
        "relative path",
    ),
]


def _short_file(root: Path) -> Path:
    f = root / "model.safetensors"
    f.write_bytes(b"\x05\x00")
    return f


@pytest.mark.parametrize(
    ("build", "tensor_name", "says"), [pytest.param(*c[1:], id=c[0]) for c in HOSTILE]
)
def test_a_damaged_checkpoint_is_refused_naming_the_file_and_tensor(
    tmp_path: Path,
    build: Callable[[Path], tuple[Path, Path]],
    tensor_name: str | None,
    says: str,
) -> None:
    path, bad = build(tmp_path)
    with pytest.raises(SafetensorsError, match=says) as e:
        read_headers(path)
    msg = str(e.value)
    assert str(bad.name) in msg, msg
    if tensor_name is not None:
        assert repr(tensor_name) in msg, msg


def test_two_tensors_in_two_files_without_an_index_are_refused(tmp_path: Path) -> None:
    save_file({"w": torch.ones(2)}, str(tmp_path / "a.safetensors"))
    save_file({"w": torch.zeros(2)}, str(tmp_path / "b.safetensors"))
    with pytest.raises(SafetensorsError, match="two files") as e:
        read_headers(tmp_path)
    assert all(s in str(e.value) for s in ("'w'", "a.safetensors", "b.safetensors"))


def test_an_ambiguous_or_broken_index_is_refused(tmp_path: Path) -> None:
    save_file({"w": torch.ones(2)}, str(tmp_path / "model.safetensors"))
    (tmp_path / INDEX).write_text('{"metadata": {}}')
    with pytest.raises(SafetensorsError, match="weight_map") as e:
        read_headers(tmp_path)
    assert INDEX in str(e.value)
    (tmp_path / INDEX).write_text("{")
    with pytest.raises(SafetensorsError, match=f"{INDEX}: the index is not JSON"):
        read_headers(tmp_path)
    (tmp_path / INDEX).write_text('{"weight_map": {"w": "model.safetensors"}}')
    (tmp_path / "other.safetensors.index.json").write_text("{}")
    with pytest.raises(SafetensorsError, match="2 index files"):
        read_headers(tmp_path)


@pytest.mark.parametrize(
    ("dtype", "shape", "nbytes", "says"),
    [
        ("F6_E2M3", [4], 3, "no torch dtype"),
        ("F6_E3M2", [4], 3, "no torch dtype"),
        ("F4", [2, 1], 1, "must be even"),
    ],
)
def test_a_dtype_torch_cannot_hold_is_refused_on_every_rank(
    tmp_path: Path, dtype: str, shape: list[int], nbytes: int, says: str
) -> None:
    """The format allows these; read_headers passes them on, torch cannot hold them."""
    write_raw(tmp_path / "model.safetensors", {"x": tensor(dtype, shape, 0, nbytes)}, bytes(nbytes))
    blob = read_headers(tmp_path)
    with pytest.raises(SafetensorsError, match=says) as e:
        metadata_from_headers(blob, tmp_path)
    assert "model.safetensors" in str(e.value) and "'x'" in str(e.value)


def test_broadcast_bytes_are_checked_again(tmp_path: Path) -> None:
    """A blob damaged or forged on the way is held to the file's rules on every rank."""
    save_file({"a": torch.ones(2), "b": torch.ones(3)}, str(tmp_path / "model.safetensors"))
    blob = json.loads(read_headers(tmp_path))
    header = blob["files"]["model.safetensors"]["header"]
    header["b"]["shape"] = [4]
    with pytest.raises(SafetensorsError, match=r"model\.safetensors: tensor 'b'.*needs 16"):
        metadata_from_headers(json.dumps(blob).encode(), tmp_path)
    header["b"]["shape"], header["b"]["dtype"] = [3], "F99"
    with pytest.raises(SafetensorsError, match="tensor 'b': unknown dtype 'F99'"):
        metadata_from_headers(json.dumps(blob).encode(), tmp_path)
    with pytest.raises(SafetensorsError, match="not JSON"):
        metadata_from_headers(b"\x00", tmp_path)
    with pytest.raises(SafetensorsError, match="read_headers' form"):
        metadata_from_headers(b"{}", tmp_path)


# Bytes that make JSON headers say something else: digits (offsets, shapes), quotes, brackets.
MUTANTS = st.sampled_from(b'0123456789"[]{},:-.eE FUI').map(lambda b: bytes([b]))


@given(sd=state_dicts(), data=st.data())
@settings(max_examples=120)
def test_a_damaged_header_is_refused_or_read_as_safetensors_reads_it(
    sd: dict[str, Any], data: st.DataObject
) -> None:
    """Any one byte of the header replaced: read_headers raises SafetensorsError or reads the
    names, dtypes and shapes safetensors itself reads (never more leniently than the format,
    but for empty ranges, which may sit anywhere); nothing else escapes. Any strict prefix of
    a file is refused."""
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "model.safetensors"
        save_file(sd, str(f))
        good = f.read_bytes()
        (n,) = struct.unpack("<Q", good[:8])
        if data.draw(st.booleans(), label="cut"):
            f.write_bytes(good[: data.draw(st.integers(0, len(good) - 1), label="length")])
            with pytest.raises(SafetensorsError):
                read_headers(f)
            return
        at = data.draw(st.integers(0, 8 + n - 1), label="at")
        f.write_bytes(good[:at] + data.draw(MUTANTS, label="byte") + good[at + 1 :])
        try:
            blob = json.loads(read_headers(f))
            metadata_from_headers(json.dumps(blob).encode(), f)
        except SafetensorsError:
            return
        header = blob["files"]["model.safetensors"]["header"]
        header.pop("__metadata__", None)
        if any(t["data_offsets"][0] == t["data_offsets"][1] for t in header.values()):
            return  # the format wants empty ranges between tensors; we do not
        ours = {k: (t["dtype"], t["shape"]) for k, t in header.items()}
        with safe_open(str(f), framework="np") as theirs_file:
            theirs = {
                k: (theirs_file.get_slice(k).get_dtype(), theirs_file.get_slice(k).get_shape())
                for k in theirs_file.keys()  # noqa: SIM118
            }
        assert ours == theirs


# ---- torch's HuggingFaceStorageReader: the baseline ----


def zeros_like(t: Any) -> Any:
    n = t.numel() * t.element_size()
    return torch.zeros(n, dtype=torch.uint8).view(t.dtype).reshape(t.shape)


HF_DTYPES = [
    dt for dt in DTYPES if str(dt).removeprefix("torch.") not in HF_READER_MISSING.values()
]


@given(sd=state_dicts(HF_DTYPES), data=st.data())
@settings(max_examples=15)
def test_hf_reader_loads_a_sharded_checkpoint_as_load_file_does(
    sd: dict[str, Any], data: st.DataObject
) -> None:
    """``dcp.load`` with torch's own reader on one process (no process group) loads every
    tensor of a sharded checkpoint bit for bit, and its metadata is ours."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    owner = data.draw(st.lists(st.integers(0, 2), min_size=len(sd), max_size=len(sd)))
    with tempfile.TemporaryDirectory() as tmp:
        root = write_sharded(Path(tmp), sd, owner)
        want = expected(root)
        dest = {k: zeros_like(t) for k, t in want.items()}
        dcp.load(dest, storage_reader=HuggingFaceStorageReader(str(root)))
        for k, t in want.items():
            assert (dest[k].dtype, dest[k].shape) == (t.dtype, t.shape), k
            assert raw(dest[k]) == raw(t), k
        theirs = HuggingFaceStorageReader(str(root)).read_metadata().state_dict_metadata
        ours = metadata_from_headers(read_headers(root), root).state_dict_metadata
        assert {k: (v.properties.dtype, v.size, v.chunks) for k, v in theirs.items()} == {
            k: (v.properties.dtype, v.size, v.chunks) for k, v in ours.items()
        }


@pytest.mark.parametrize("code", sorted(HF_READER_MISSING))
@pytest.mark.failure_matches("HuggingFaceStorageReader: KeyError", raises=AssertionError)
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="torch 2.13's HuggingFaceStorageReader.read_metadata looks the dtype up in "
    "safetensors.torch._TYPES, which has no F8_E8M0 or F4 (safetensors 0.8)",
)
def test_hf_reader_refuses_dtypes_safetensors_saves(tmp_path: Path, code: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    dtype = getattr(torch, HF_READER_MISSING[code], None)
    if dtype is None:
        pytest.skip(f"this torch has no {HF_READER_MISSING[code]}")
    t = random_tensor((2, 4), dtype, 0)
    write_sharded(tmp_path, {"w": t}, [0])
    # ours reads it
    md = metadata_from_headers(read_headers(tmp_path), tmp_path)
    assert md.state_dict_metadata["w"].properties.dtype == dtype
    dest = {"w": zeros_like(t)}
    try:
        dcp.load(dest, storage_reader=HuggingFaceStorageReader(str(tmp_path)))
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        assert f"metadata read failed: '{code}'" in str(e), str(e)
        raise AssertionError(f"HuggingFaceStorageReader: KeyError {code!r}") from e
    assert raw(dest["w"]) == raw(t)


def test_hf_reader_reads_a_tensor_in_two_files_silently(tmp_path: Path) -> None:
    """What we refuse (test_two_tensors_in_two_files_without_an_index_are_refused), torch's
    reader takes: both copies become chunks at offset 0 and one of them is loaded."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    save_file({"w": torch.ones(2)}, str(tmp_path / "a.safetensors"))
    save_file({"w": torch.zeros(2)}, str(tmp_path / "b.safetensors"))
    md = HuggingFaceStorageReader(str(tmp_path)).read_metadata()
    assert len(md.state_dict_metadata["w"].chunks) == 2
    assert len(md.storage_data) == 1  # MetadataIndex("w", [0]) twice: one entry kept
