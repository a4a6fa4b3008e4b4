"""`shardspec inspect` / `shardspec diff` and the restricted metadata reader
(spec/09-checkpoint.md, CKPT-5..7), on metadata files written here: by DCP in one process,
and by pickling DCP's own Metadata built from hand-worked layouts. Checkpoints written by
real ranks (DTensor, ShardedTensor, FSDP, TorchRec) are inspected in those packages' tests."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shardspec.checkpoint.cli import main
from shardspec.checkpoint.dcp_metadata import RefusedGlobal, read_metadata
from shardspec.metadata import Box, Layout, Shard, chunk_layout
from shardspec.metadata.dcp import to_tensor_storage_metadata
from shardspec.testing import scaled

torch = pytest.importorskip("torch")
from torch.distributed.checkpoint.filesystem import _StorageInfo  # noqa: E402
from torch.distributed.checkpoint.metadata import (  # noqa: E402
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
)


def write_checkpoint(
    path: Path, layouts: dict[str, tuple[Layout, Any]], objects: tuple[str, ...] = ()
) -> Path:
    """A checkpoint directory whose .metadata describes ``layouts`` (key -> (layout, dtype)),
    chunk i of each tensor in file ``__{i}_0.distcp`` at byte 64. The data files are zeros
    of the length the metadata needs (inspect reads no data, only their sizes)."""
    path.mkdir(parents=True, exist_ok=True)
    sdm: dict[str, Any] = {}
    storage: dict[Any, Any] = {}
    for fqn, (layout, dtype) in layouts.items():
        md = to_tensor_storage_metadata(layout, dtype)
        sdm[fqn] = md
        for i, c in enumerate(md.chunks):
            n = Box(tuple(c.offsets), tuple(c.sizes)).numel * dtype.itemsize
            storage[MetadataIndex(fqn, c.offsets, i)] = _StorageInfo(f"__{i}_0.distcp", 64, n)
    for o in objects:
        sdm[o] = BytesStorageMetadata()
        storage[MetadataIndex(o)] = _StorageInfo("__0_0.distcp", 0, 10)
    (path / ".metadata").write_bytes(pickle.dumps(Metadata(sdm, storage_data=storage)))
    ends: dict[str, int] = {}
    for info in storage.values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in ends.items():
        (path / name).write_bytes(bytes(end))
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


ROWS = chunk_layout((10, 6), 0, [0, 1, 2, 3])  # rows 3, 3, 3, 1


@pytest.mark.rule("CKPT-6")
def test_inspect_lists_each_tensor_with_its_chunks_files_and_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ck = write_checkpoint(
        tmp_path / "ck",
        {
            "w": (ROWS, torch.bfloat16),
            "b": (chunk_layout((5,), 0, [0, 1]), torch.float32),
            "s": (Layout((), [Shard(Box((), ()), 0)]), torch.int64),
        },
        objects=("step",),
    )
    rc, out, _ = run(["inspect", str(ck)], capsys)
    assert rc == 0
    # Summary first: 148 B = 60 bf16 + 5 f32 + 1 i64; chunks 4 + 2 + 1; file __i ends at the
    # end of its longest chunk, all written at byte 64: three rows of w (64 + 36 B) in
    # __0..__2, one row (64 + 12 B) in __3: 3 * 100 + 76 = 376 B.
    assert out.splitlines()[0] == (
        f"{ck}: 3 tensors (148 B), 7 chunks, 1 other value, 4 files (376 B); "
        "valid (metadata and file sizes)"
    )
    # Keys sorted.
    lines = out.splitlines()
    assert [ln.split()[0] for ln in lines if "  shape " in ln] == ["b", "s", "w"]
    assert "w  shape (10, 6)  bfloat16  120 B  4 chunks  OK" in out
    assert "b  shape (5,)  float32  20 B  2 chunks  OK" in out
    assert "s  shape ()  int64  8 B  1 chunk  OK" in out
    # Hand-worked: chunk 3 holds rows 9:10; it is the fourth file, 6 bf16 elements.
    assert "chunk #3  [9:10, 0:6]  __3_0.distcp @ 64 (12 B)" in out
    assert "| r2 |" in out  # the text picture
    assert "step  object  in __0_0.distcp" in out


@pytest.mark.rule("CKPT-6")
def test_inspect_json_describes_the_layouts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardspec.metadata import layout_from_dict

    grid = Layout(
        (4, 4),
        [
            Shard(Box((r, c), (2, 2)), i)
            for i, (r, c) in enumerate([(0, 0), (0, 2), (2, 0), (2, 2)])
        ],
    )
    ck = write_checkpoint(tmp_path / "ck", {"g": (grid, torch.float16)})
    rc, out, _ = run(["inspect", str(ck), "--json"], capsys)
    doc = json.loads(out)
    assert rc == 0 and doc["ok"] is True
    (t,) = doc["tensors"]
    assert (t["fqn"], t["shape"], t["dtype"], t["bytes"]) == ("g", [4, 4], "float16", 32)
    assert [c["offsets"] for c in t["chunks"]] == [[0, 0], [0, 2], [2, 0], [2, 2]]
    assert [c["file"] for c in t["chunks"]] == [f"__{i}_0.distcp" for i in range(4)]
    assert layout_from_dict(t["layout"]) == grid
    assert t["verdict"] == {"ok": True}


@pytest.mark.rule("CKPT-6")
@pytest.mark.parametrize(
    ("boxes", "kind", "words"),
    [
        ([Box((0, 0), (3, 6)), Box((6, 0), (4, 6))], "gap", ["gap", "18 of 60", "(3, 0)"]),
        ([Box((0, 0), (6, 6)), Box((5, 0), (5, 6))], "overlap", ["#0", "#1", "overlap"]),
    ],
)
def test_inspect_names_gaps_and_overlaps_and_exits_1(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    boxes: list[Box],
    kind: str,
    words: list[str],
) -> None:
    bad = Layout((10, 6), [Shard(b, i) for i, b in enumerate(boxes)])
    ck = write_checkpoint(tmp_path / "ck", {"ok": (ROWS, torch.float32)})
    # to_tensor_storage_metadata refuses invalid layouts: write the bad chunks by hand.
    md = pickle.loads((ck / ".metadata").read_bytes())
    bad_md = to_tensor_storage_metadata(ROWS, torch.float32)
    bad_md.chunks[:] = [
        type(bad_md.chunks[0])(torch.Size(s.box.offsets), torch.Size(s.box.sizes))
        for s in bad.shards
    ]
    md.state_dict_metadata["layer.bad"] = bad_md
    (ck / ".metadata").write_bytes(pickle.dumps(md))
    rc, out, _ = run(["inspect", str(ck)], capsys)
    assert rc == 1
    line = next(ln for ln in out.splitlines() if ln.startswith("layer.bad "))
    assert line.endswith(f"INVALID ({kind})")
    for w in words:
        assert w in out, (w, out)
    assert "INVALID: 1 invalid tensor" in out.splitlines()[0]
    rc, out, _ = run(["inspect", str(ck), "--json"], capsys)
    doc = json.loads(out)
    assert rc == 1 and doc["ok"] is False
    verdicts = {t["fqn"]: t["verdict"] for t in doc["tensors"]}
    assert verdicts["ok"] == {"ok": True}
    assert (
        verdicts["layer.bad"]["kind"] == kind and "'layer.bad'" in verdicts["layer.bad"]["message"]
    )


@pytest.mark.rule("CKPT-6")
@pytest.mark.parametrize("size", [10.5, 10.0, "10"], ids=repr)
def test_inspect_refuses_a_saved_size_that_is_no_integer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], size: object
) -> None:
    # int() would read 10.5, 10.0 or "10" as the valid 10 and call the tensor fine
    ck = write_checkpoint(tmp_path / "ck", {"w": (ROWS, torch.float32)})
    md = pickle.loads((ck / ".metadata").read_bytes())
    md.state_dict_metadata["w"].size = (size, 6)
    (ck / ".metadata").write_bytes(pickle.dumps(md))
    rc, out, _ = run(["inspect", str(ck), "--json"], capsys)
    doc = json.loads(out)
    assert rc == 1 and doc["ok"] is False
    (t,) = doc["tensors"]
    assert t["verdict"]["kind"] == "value" and repr(size) in t["verdict"]["message"]
    rc, out, _ = run(["inspect", str(ck)], capsys)
    assert rc == 1 and "INVALID" in out.splitlines()[0]


@pytest.mark.rule("CKPT-6")
def test_inspect_svg_draws_each_chunk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import xml.etree.ElementTree as ET

    ck = write_checkpoint(tmp_path / "ck", {"w<1>": (ROWS, torch.float32)})
    svg = tmp_path / "w.svg"
    rc, _, _ = run(["inspect", str(ck), "--svg", str(svg), "--no-layout"], capsys)
    assert rc == 0
    root = ET.fromstring(svg.read_text())  # well-formed XML, the odd key escaped
    ns = "{http://www.w3.org/2000/svg}"
    rects = root.findall(f"{ns}rect")
    titles = [r.find(f"{ns}title").text for r in rects]  # type: ignore[union-attr]
    assert titles[0] == "not in any chunk"
    assert titles[1:] == [
        f"chunk #{i} offsets ({o}, 0) sizes ({n}, 6) in __{i}_0.distcp"
        for i, (o, n) in enumerate([(0, 3), (3, 3), (6, 3), (9, 1)])
    ]
    # Rows scale to the panel: chunk 3 (1 row of 10) is a tenth of the height of the tensor.
    assert float(rects[4].get("height")) == pytest.approx(float(rects[0].get("height")) / 10)
    assert "w&lt;1&gt;" in svg.read_text()


@pytest.mark.rule("CKPT-7")
def test_diff_names_shape_dtype_and_layout_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_checkpoint(
        tmp_path / "a",
        {
            "same": (ROWS, torch.float32),
            "rows": (ROWS, torch.float32),
            "wide": (ROWS, torch.float32),
            "half": (ROWS, torch.float32),
            "gone": (ROWS, torch.float32),
        },
        objects=("step",),
    )
    b = write_checkpoint(
        tmp_path / "b",
        {
            "same": (ROWS.with_ranks([3, 2, 1, 0]), torch.float32),  # owners are not recorded
            "rows": (chunk_layout((10, 6), 1, [0, 1]), torch.float32),
            "wide": (chunk_layout((10, 7), 0, [0, 1, 2, 3]), torch.float32),
            "half": (ROWS, torch.bfloat16),
            "new": (ROWS, torch.float32),
        },
        objects=("step",),
    )
    rc, out, _ = run(["diff", str(a), str(b)], capsys)
    assert rc == 1
    lines = out.splitlines()
    assert "rows: layout 4 chunks vs 2 chunks" in out
    assert "wide: shape [10, 6] vs [10, 7]" in lines
    assert "half: dtype float32 vs bfloat16" in lines
    assert "gone: only in A" in lines and "new: only in B" in lines
    assert not any(ln.startswith(("same", "step")) for ln in lines)
    assert lines[-1] == "5 differences"
    rc, out, _ = run(["diff", str(a), str(b), "--json"], capsys)
    doc = json.loads(out)
    assert rc == 1 and doc["same"] is False
    whats = {(d["fqn"], d["what"]) for d in doc["differences"]}
    assert whats == {
        ("rows", "layout"),
        ("wide", "shape"),
        ("half", "dtype"),
        ("gone", "only in A"),
        ("new", "only in B"),
    }
    rc, out, _ = run(["diff", str(a), str(a)], capsys)
    assert rc == 0 and out.splitlines()[-1] == "0 differences"


@pytest.mark.rule("CKPT-6")
def test_progress_bar_on_many_tensors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    many = {f"t{i}": (chunk_layout((4,), 0, [0, 1]), torch.float32) for i in range(250)}
    ck = write_checkpoint(tmp_path / "ck", many)
    rc, out, err = run(["inspect", str(ck), "--no-layout", "--progress", "always"], capsys)
    assert rc == 0 and "250/250" in err and "250 tensors" in out
    rc, _, err = run(["inspect", str(ck), "--no-layout", "--progress", "never"], capsys)
    assert rc == 0 and err == ""


@pytest.mark.rule("CKPT-6")
def test_inspect_reads_no_tensor_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch.distributed.checkpoint as dcp

    ck = tmp_path / "ck"
    dcp.save({"w": torch.arange(12.0).reshape(3, 4)}, checkpoint_id=str(ck), no_dist=True)
    data = [p for p in ck.iterdir() if p.suffix == ".distcp"]
    assert data
    for p in data:
        p.write_bytes(bytes(p.stat().st_size))  # zeros of the same length: only sizes count
    rc, out, _ = run(["inspect", str(ck)], capsys)
    assert rc == 0 and f"chunk #0  [0:3, 0:4]  {data[0].name} @ " in out


class Hostile:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


class HostileEval:
    def __reduce__(self) -> tuple[Any, ...]:
        return (eval, ("__import__('os').getcwd()",))


@pytest.mark.rule("CKPT-5")
@pytest.mark.parametrize("where", ["top", "inside-metadata", "eval"])
def test_a_hostile_metadata_file_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    marker = tmp_path / "pwned"
    ck = tmp_path / "ck"
    ck.mkdir()
    if where == "top":
        payload: Any = Hostile(marker)
        refused = f"{os.system.__module__}.system"
    elif where == "eval":
        payload = HostileEval()
        refused = "builtins.eval"
    else:
        md = to_tensor_storage_metadata(ROWS, torch.float32)
        payload = Metadata({"w": md}, planner_data={"w": Hostile(marker)})
        refused = f"{os.system.__module__}.system"
    (ck / ".metadata").write_bytes(pickle.dumps(payload))
    with pytest.raises(RefusedGlobal) as err:
        read_metadata(ck)
    assert (err.value.module + "." + err.value.name) == refused
    assert f"'{refused}'" in str(err.value)
    rc, out, msg = run(["inspect", str(ck)], capsys)
    assert rc == 2 and out == "" and f"refused to unpickle global '{refused}'" in msg
    if where != "top":
        return
    # Through `python -m` too, in a fresh interpreter.
    proc = subprocess.run(
        [sys.executable, "-m", "shardspec.checkpoint", "inspect", str(ck)],
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert proc.returncode == 2 and refused in proc.stderr
    assert not marker.exists()


@pytest.mark.rule("CKPT-5")
def test_not_a_checkpoint_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, msg = run(["inspect", str(tmp_path)], capsys)
    assert rc == 2 and "no such file" in msg and ".metadata" in msg
    (tmp_path / ".metadata").write_bytes(pickle.dumps({"just": "a dict"}))
    rc, _, msg = run(["inspect", str(tmp_path)], capsys)
    assert rc == 2 and "not DCP's Metadata" in msg
    (tmp_path / ".metadata").write_bytes(b"not a pickle")
    rc, _, msg = run(["inspect", str(tmp_path)], capsys)
    assert rc == 2 and "not a readable DCP metadata file" in msg


@pytest.mark.rule("CKPT-6")
def test_inspect_leaves_pictures_out_beyond_20_tensors_unless_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardspec.checkpoint.cli_inspect import LAYOUT_UP_TO

    assert LAYOUT_UP_TO == 20  # the number the help, README and CKPT-6 give
    few = write_checkpoint(tmp_path / "few", {f"t{i}": (ROWS, torch.float32) for i in range(20)})
    many = write_checkpoint(tmp_path / "many", {f"t{i}": (ROWS, torch.float32) for i in range(21)})
    rc, out, _ = run(["inspect", str(few)], capsys)
    assert rc == 0 and "chunk #0  [0:3, 0:6]" in out and "| r1 |" in out
    rc, out, _ = run(["inspect", str(many)], capsys)
    assert rc == 0 and "chunk #0" not in out and "| r1 |" not in out
    assert len([ln for ln in out.splitlines() if ln]) == 1 + 21  # summary, a line per tensor
    rc, out, _ = run(["inspect", str(many), "--layout"], capsys)
    assert rc == 0 and out.count("chunk #0  [0:3, 0:6]") == 21
    rc, out, _ = run(["inspect", str(few), "--no-layout"], capsys)
    assert rc == 0 and "chunk #0" not in out
    # Keys sorted as strings: t0, t1, t10, ..., t19, t2, t20, t3, ...
    keys = [ln.split()[0] for ln in out.splitlines() if "  shape " in ln]
    assert keys == sorted(f"t{i}" for i in range(20))
