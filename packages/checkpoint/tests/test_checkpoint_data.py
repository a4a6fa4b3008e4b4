"""`shardspec inspect` checking a checkpoint's files, `shardspec verify` reading its chunks,
`shardspec diff --values` comparing two checkpoints' values (spec/09-checkpoint.md, CKPT-8..10),
on checkpoints written in DCP's file format by :mod:`checkpoint_files` (and by ``dcp.save``).
Expected values come from the global tensors the checkpoints were cut from."""

from __future__ import annotations

import gc
import json
import math
import weakref
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings, strategies as st

from shardspec.checkpoint.chunks import storable
from shardspec.checkpoint.cli import main
from shardspec.metadata import Box, Layout, Shard, chunk_layout
from shardspec.metadata.strategies import shapes, valid_layouts

torch = pytest.importorskip("torch")
from checkpoint_files import (  # noqa: E402
    storage_of,
    tensor_bytes_at,
    write_data_checkpoint,
)

ROWS = chunk_layout((10, 6), 0, [0, 1, 2, 3])  # rows 3, 3, 3, 1
COLS = chunk_layout((10, 6), 1, [0, 1, 2])  # columns 2, 2, 2

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.bool,
    torch.complex64,
    torch.int8,
    torch.int64,
    torch.uint8,
    torch.uint16,
    torch.int16,
    torch.complex32,
    torch.float8_e4m3fn,
]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def values(shape: tuple[int, ...], dtype: Any, seed: int) -> Any:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return (torch.randn(shape, generator=g, dtype=torch.float64) * 10).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


def saved_chunks(layout: Layout) -> int:
    """How many chunks a checkpoint holds of ``layout``: each distinct box once."""
    return len({s.box for s in layout.shards})


def sample(tmp_path: Path, name: str = "ck") -> tuple[Path, dict[str, Any]]:
    tensors = {
        "model.w": (ROWS, values((10, 6), torch.bfloat16, 0)),
        "model.b": (chunk_layout((5,), 0, [0, 1, 2, 3, 4, 5, 6]), values((5,), torch.float32, 1)),
        "step_t": (Layout((), [Shard(Box((), ()), 0)]), torch.tensor(7)),
        "mask": (COLS, values((10, 6), torch.bool, 2)),
    }
    return write_data_checkpoint(tmp_path / name, tensors, objects={"step": 7}), tensors


# ---------------------------------------------------------------- the helper writes what DCP does


def test_dcp_loads_what_the_helper_writes(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    ck, tensors = sample(tmp_path)
    out = {k: torch.zeros_like(v) for k, (_, v) in tensors.items()}
    out["step"] = 0
    with pytest.warns(UserWarning, match="single process"):
        dcp.load(out, checkpoint_id=str(ck), no_dist=True)
    for k, (_, v) in tensors.items():
        assert torch.equal(out[k], v), k
    assert out["step"] == 7


# ---------------------------------------------------------------- CKPT-8: inspect checks files


@pytest.mark.rule("CKPT-8")
def test_inspect_names_a_missing_data_file_and_its_tensors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ck, _ = sample(tmp_path)
    rc, out, _ = run(["inspect", str(ck)], capsys)
    assert rc == 0 and "valid (metadata and file sizes)" in out.splitlines()[0]
    (ck / "__1_0.distcp").unlink()
    rc, out, _ = run(["inspect", str(ck)], capsys)
    assert rc == 1
    first = out.splitlines()[0]
    assert "INVALID" in first and "1 missing file" in first, first
    # __1 holds chunk #1 of every tensor with two chunks or more (chunk i -> file i % 2).
    (problem,) = [ln for ln in out.splitlines() if "__1_0.distcp: missing" in ln]
    for key in ("'model.w'", "'model.b'", "'mask'"):
        assert key in problem, problem
    assert "'step_t'" not in problem
    rc, out, _ = run(["inspect", str(ck), "--json"], capsys)
    doc = json.loads(out)
    assert rc == 1 and doc["ok"] is False
    bad = [f for f in doc["files"] if not f["ok"]]
    assert [(f["file"], f["size"]) for f in bad] == [("__1_0.distcp", None)]
    assert sorted(bad[0]["keys"]) == ["mask", "model.b", "model.w"]
    assert doc["summary"]["missing_files"] == 1


@pytest.mark.rule("CKPT-8")
def test_inspect_names_a_truncated_data_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pickle

    ck, _ = sample(tmp_path)
    f = ck / "__0_0.distcp"
    data = f.read_bytes()
    md = pickle.loads((ck / ".metadata").read_bytes())
    end = max(i.offset + i.length for i in md.storage_data.values() if i.relative_path == f.name)
    assert end == len(data)  # the last byte of the file is some chunk's last byte
    f.write_bytes(data[:-1])
    rc, out, _ = run(["inspect", str(ck)], capsys)
    assert rc == 1
    assert "1 truncated file" in out.splitlines()[0]
    assert (
        f"__0_0.distcp: truncated, {len(data) - 1} bytes but the metadata names bytes up to {end}"
        in out
    )
    rc, out, _ = run(["inspect", str(ck), "--json"], capsys)
    doc = json.loads(out)
    assert doc["ok"] is False and doc["summary"]["short_files"] == 1


@pytest.mark.rule("CKPT-8")
def test_inspect_names_a_chunk_the_metadata_puts_in_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pickle

    ck, _ = sample(tmp_path)
    md = pickle.loads((ck / ".metadata").read_bytes())
    (idx,) = [k for k in md.storage_data if k.fqn == "model.w" and k.index == 2]
    del md.storage_data[idx]
    (ck / ".metadata").write_bytes(pickle.dumps(md))
    rc, out, _ = run(["inspect", str(ck)], capsys)
    assert rc == 1
    assert "chunk #2 of tensor 'model.w': the metadata names no file holding its data" in out
    doc = json.loads(run(["inspect", str(ck), "--json"], capsys)[1])
    assert doc["ok"] is False and doc["unlisted"] == [{"fqn": "model.w", "chunk": 2}]


# ---------------------------------------------------------------- CKPT-9: verify reads the data


@pytest.mark.rule("CKPT-9")
def test_verify_passes_a_sound_checkpoint_written_by_dcp(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch.distributed.checkpoint as dcp

    ck = tmp_path / "ck"
    sd = {f"t.{d}".replace("torch.", ""): values((3, 4), d, 3) for d in DTYPES}
    sd["zero"] = torch.zeros(0, 5)
    sd["scalar"] = torch.tensor(2.5)
    with pytest.warns(UserWarning, match="single process"):
        dcp.save(sd, checkpoint_id=str(ck), no_dist=True)
    rc, out, _ = run(["verify", str(ck)], capsys)
    assert rc == 0, out
    first = out.splitlines()[0]
    assert f"read {len(sd)} chunks of {len(sd)} tensors" in first and first.endswith("all valid")


@pytest.mark.rule("CKPT-9")
def test_verify_passes_chunked_tensors_of_every_dtype(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tensors = {
        f"x.{i}": (ROWS if i % 2 else COLS, values((10, 6), d, i)) for i, d in enumerate(DTYPES)
    }
    tensors["empty_chunks"] = (
        chunk_layout((2, 3), 0, [0, 1, 2, 3]),  # two empty chunks at offset 2
        values((2, 3), torch.float32, 9),
    )
    # two empty chunks of different shapes at one offset share one stored archive (DCP files
    # chunks by offset): either holds nothing, so each passes (found on a Megatron checkpoint)
    tensors["empty_at_one_offset"] = (
        Layout(
            (0, 1, 0), [Shard(Box((0, 0, 0), (0, 0, 0)), 0), Shard(Box((0, 0, 0), (0, 1, 0)), 1)]
        ),
        torch.zeros((0, 1, 0)),
    )
    ck = write_data_checkpoint(tmp_path / "ck", tensors)
    rc, out, _ = run(["verify", str(ck), "--json"], capsys)
    doc = json.loads(out)
    assert rc == 0 and doc["ok"] is True and doc["problems"] == []
    assert doc["chunks"] == sum(saved_chunks(lay) for lay, _ in tensors.values())


def _flip_one_data_byte(ck: Path, key: str, chunk: int) -> None:
    file, at, n = tensor_bytes_at(ck, key, chunk)
    assert n > 0
    raw = bytearray(file.read_bytes())
    raw[at + n - 1] ^= 0x01  # the lowest bit of the last element's last byte
    file.write_bytes(bytes(raw))


@pytest.mark.rule("CKPT-9")
@pytest.mark.parametrize("damage", ["flipped bit", "truncated", "missing", "dtype", "shape"])
def test_verify_names_each_bad_chunk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    import pickle

    ck, _ = sample(tmp_path)
    rc, _, _ = run(["verify", str(ck)], capsys)
    assert rc == 0
    info = storage_of(ck, "model.w", 1)  # rows 3:6, in __1_0.distcp
    expect = ["__1_0.distcp", "'model.w'", "chunk #1", "(3, 0)"]
    if damage == "flipped bit":
        _flip_one_data_byte(ck, "model.w", 1)
        expect.append("CRC-32")
    elif damage == "truncated":
        f = ck / info.relative_path
        f.write_bytes(f.read_bytes()[: info.offset + info.length // 2])
        expect.append("truncated")
    elif damage == "missing":
        (ck / info.relative_path).unlink()
        expect.append("missing")
    else:
        md = pickle.loads((ck / ".metadata").read_bytes())
        tmd = md.state_dict_metadata["model.w"]
        if damage == "dtype":
            tmd.properties.dtype = torch.float16  # the data is bfloat16
            expect = [*expect, "bfloat16", "float16"]
            expect.remove("chunk #1")  # every chunk is named; check one
        else:
            c = tmd.chunks[1]
            tmd.chunks[1] = type(c)(c.offsets, torch.Size([2, 6]))  # saved: 3 rows
            tmd.chunks.append(type(c)(torch.Size([5, 0]), torch.Size([1, 6])))
            expect.append("holds shape (3, 6), the metadata says (2, 6)")
        (ck / ".metadata").write_bytes(pickle.dumps(md))
    rc, out, _ = run(["verify", str(ck)], capsys)
    assert rc == 1, out
    assert "all valid" not in out
    bad = [ln for ln in out.splitlines() if "'model.w'" in ln and "__1_0.distcp" in ln]
    assert bad, out
    for word in expect:
        assert any(word in ln for ln in bad), (word, out)
    doc = json.loads(run(["verify", str(ck), "--json"], capsys)[1])
    assert doc["ok"] is False
    data = [p for p in doc["problems"] if p["what"] in ("data", "file")]
    assert data


@pytest.mark.rule("CKPT-9")
def test_verify_holds_one_chunk_at_a_time_and_draws_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardspec.checkpoint import cli_verify

    ck, tensors = sample(tmp_path)
    live: list[weakref.ref[Any]] = []
    most = 0
    real = cli_verify.read_saved_chunk

    def counting(*args: Any) -> Any:
        nonlocal most
        gc.collect()
        most = max(most, sum(r() is not None for r in live))
        t = real(*args)
        live.append(weakref.ref(t))
        return t

    with mock.patch.object(cli_verify, "read_saved_chunk", counting):
        rc, _, err = run(["verify", str(ck), "--progress", "always"], capsys)
    assert rc == 0
    assert len(live) == sum(saved_chunks(lay) for lay, _ in tensors.values())
    assert most == 0  # each chunk is dropped before the next is read
    assert "verify" in err and "B/" in err  # tqdm's bar, in bytes


# ---------------------------------------------------------------- CKPT-7: diff says what it read


@pytest.mark.rule("CKPT-7")
def test_diff_says_it_compared_metadata_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_data_checkpoint(tmp_path / "a", {"w": (ROWS, values((10, 6), torch.float32, 0))})
    b = write_data_checkpoint(tmp_path / "b", {"w": (ROWS, values((10, 6), torch.float32, 1))})
    rc, out, _ = run(["diff", str(a), str(b)], capsys)
    assert rc == 0
    assert out.splitlines()[0].startswith("compared metadata only")
    assert "--values" in out.splitlines()[0]
    doc = json.loads(run(["diff", str(a), str(b), "--json"], capsys)[1])
    assert doc["compared"] == "metadata only" and doc["values_compared"] is False
    rc, out, _ = run(["diff", str(a), str(b), "--values"], capsys)
    assert rc == 1 and out.splitlines()[0].startswith("compared metadata and values")
    assert "w: values differ in 60 of 60 elements" in out


# ---------------------------------------------------------------- CKPT-10: diff --values


def _changed(x: Any, index: tuple[int, ...]) -> tuple[Any, Any]:
    """``x`` with the element at ``index`` changed, and that new element."""
    y = x.clone()
    old = x[index].item()
    if x.dtype == torch.bool:
        new: Any = not old
    elif x.dtype.is_floating_point or x.dtype.is_complex:
        new = -old if old != 0 else 1  # exact in every float format, even float8
    else:
        new = old + 3 if old < 50 else old - 3
    y[index] = new
    return y, y[index].item()


@st.composite
def diff_cases(draw: st.DrawFn) -> tuple[Layout, Layout, Any, tuple[int, ...] | None]:
    shape = draw(shapes(max_dims=3, max_side=6))
    lay_a = storable(draw(valid_layouts(st.just(shape), replicas=False)))
    lay_b = storable(draw(valid_layouts(st.just(shape), replicas=False)))
    dtype = draw(st.sampled_from(DTYPES))
    index = None
    if math.prod(shape) and draw(st.booleans()):
        index = tuple(draw(st.integers(0, n - 1)) for n in shape)
    return lay_a, lay_b, dtype, index


@pytest.mark.rule("CKPT-10")
@settings(max_examples=60, deadline=None)
@given(case=diff_cases(), seed=st.integers(0, 2**16), block=st.sampled_from([1, 5, 1 << 22]))
def test_diff_values_finds_the_one_changed_element_whatever_the_layouts(
    tmp_path_factory: pytest.TempPathFactory,
    case: tuple[Layout, Layout, Any, tuple[int, ...] | None],
    seed: int,
    block: int,
) -> None:
    from shardspec.checkpoint import value_diff
    from shardspec.checkpoint.dcp_metadata import read_metadata
    from shardspec.checkpoint.report import tensor_reports

    lay_a, lay_b, dtype, index = case
    x = values(lay_a.shape, dtype, seed)
    y, new = (x, None) if index is None else _changed(x, index)
    root = tmp_path_factory.mktemp("d")
    a = write_data_checkpoint(root / "a", {"t": (lay_a, x)}, files=3)
    b = write_data_checkpoint(root / "b", {"t": (lay_b, y)}, files=2)
    (ta,) = tensor_reports(read_metadata(a))
    (tb,) = tensor_reports(read_metadata(b))
    with mock.patch.object(value_diff, "BLOCK", block):
        d = value_diff.diff_tensor_values(a, ta, b, tb)
    if index is None:
        assert d is None
        return
    assert d is not None
    old = x[index].item()
    assert (d.count, d.where) == (1, index)
    assert d.max_diff == pytest.approx(abs(complex(old) - complex(new)))
    assert (d.a, d.b) == (repr(old), repr(new))


@pytest.mark.rule("CKPT-10")
def test_diff_values_command_reports_largest_difference_and_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x = torch.arange(60, dtype=torch.float32).reshape(10, 6)
    y = x.clone()
    y[7, 4] += 0.5  # in A's chunk #2 (rows 6:9), B's column chunk #2 (columns 4:6)
    y[1, 1] -= 2.0
    y[4, 0] = math.nan
    a = write_data_checkpoint(tmp_path / "a", {"w": (ROWS, x), "same": (ROWS, x), "nan": (ROWS, y)})
    b = write_data_checkpoint(tmp_path / "b", {"w": (COLS, y), "same": (COLS, x), "nan": (COLS, y)})
    rc, out, _ = run(["diff", str(a), str(b), "--values"], capsys)
    assert rc == 1
    lines = out.splitlines()
    assert (
        "w: values differ in 3 of 60 elements; largest difference inf at (4, 0) (24.0 vs nan)"
        in lines
    )
    # NaN == NaN here; the layouts differ (rows vs columns), and diff says so too.
    assert not any(ln.startswith(("same: values", "nan: values")) for ln in lines)
    assert "same: layout 4 chunks vs 3 chunks" in out
    assert lines[-1] == "4 differences"
    y[4, 0] = x[4, 0]
    b = write_data_checkpoint(tmp_path / "b2", {"w": (COLS, y)})
    a = write_data_checkpoint(tmp_path / "a2", {"w": (ROWS, x)})
    doc = json.loads(run(["diff", str(a), str(b), "--values", "--json"], capsys)[1])
    assert doc["same"] is False and doc["compared"] == "metadata and values"
    (d,) = [d for d in doc["differences"] if d["what"] == "values"]
    assert (d["fqn"], d["what"], d["count"], d["max_diff"], d["where"]) == (
        "w",
        "values",
        2,
        2.0,
        [1, 1],
    )
    # Tolerances: the differences are 2.0 (7 vs 5 at (1, 1)) and 0.5 (46 vs 46.5 at (7, 4)).
    rc, out, _ = run(["diff", str(a), str(b), "--values", "--atol", "1"], capsys)
    assert (
        rc == 1 and "w: values differ in 1 of 60 elements; largest difference 2.0 at (1, 1)" in out
    )
    rc, out, _ = run(["diff", str(a), str(b), "--values", "--atol", "2"], capsys)
    assert "values differ" not in out and out.splitlines()[-1] == "1 difference"  # the layout
    # rtol against b: |46 - 46.5| <= 0.02 * 46.5 holds; |7 - 5| <= 0.02 * 5 does not.
    rc, out, _ = run(["diff", str(a), str(b), "--values", "--rtol", "0.02"], capsys)
    assert rc == 1 and "differ in 1 of 60" in out
    rc, _, err = run(["diff", str(a), str(b), "--atol", "1"], capsys)
    assert rc == 2 and "--values" in err
    with pytest.raises(SystemExit):
        main(["diff", str(a), str(b), "--values", "--atol", "-1"])


@pytest.mark.rule("CKPT-10")
def test_diff_values_holds_at_most_one_chunk_of_each_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardspec.checkpoint import value_diff

    x = values((10, 6), torch.float64, 5)
    a = write_data_checkpoint(tmp_path / "a", {"w": (ROWS, x)})
    b = write_data_checkpoint(tmp_path / "b", {"w": (COLS, x)})
    live: list[weakref.ref[Any]] = []
    most = 0
    real = value_diff.read_saved_chunk

    def counting(*args: Any) -> Any:
        nonlocal most
        gc.collect()
        most = max(most, sum(r() is not None for r in live))
        t = real(*args)
        live.append(weakref.ref(t))
        return t

    with mock.patch.object(value_diff, "read_saved_chunk", counting):
        _, out, _ = run(["diff", str(a), str(b), "--values"], capsys)
    assert "values differ" not in out and "w: layout 4 chunks vs 3 chunks" in out
    assert most == 1  # one chunk of the other side at most, while the next is read
    assert len(live) >= 4 + 3  # every chunk of each side was read


@pytest.mark.rule("CKPT-10")
def test_diff_values_names_an_unreadable_chunk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x = values((10, 6), torch.float32, 5)
    a = write_data_checkpoint(tmp_path / "a", {"w": (ROWS, x)})
    b = write_data_checkpoint(tmp_path / "b", {"w": (COLS, x)})
    _flip_one_data_byte(b, "w", 2)
    rc, _, err = run(["diff", str(a), str(b), "--values"], capsys)
    assert rc == 2 and "'w' chunk #2" in err and "CRC-32" in err


@pytest.mark.rule("CKPT-10")
def test_diff_values_compares_non_tensor_values_as_stored_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x = values((4,), torch.float32, 1)
    lay = chunk_layout((4,), 0, [0, 1])
    a = write_data_checkpoint(tmp_path / "a", {"w": (lay, x)}, objects={"step": 3, "lr": 0.1})
    b = write_data_checkpoint(tmp_path / "b", {"w": (lay, x)}, objects={"step": 4, "lr": 0.1})
    rc, out, _ = run(["diff", str(a), str(b)], capsys)
    assert rc == 0  # metadata only: the same
    rc, out, _ = run(["diff", str(a), str(b), "--values"], capsys)
    assert rc == 1
    assert out.splitlines()[1:] == [
        "step: non-tensor value stored as different bytes",
        "1 difference",
    ]
