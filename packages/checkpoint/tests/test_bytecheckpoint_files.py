"""Our checkpoint tools on a real ByteCheckpoint 0.0.2 checkpoint, read without ByteCheckpoint
installed (spec/09-checkpoint.md, CKPT-19): its ``.metadata`` through the restricted reader
(its two classes read by name as DCP's), its raw-bytes data files by `inspect`, `verify`,
`diff --values`, `reshard` and our ``FileSystemReader``.

The checkpoint (``data/bytecheckpoint-0.0.2-fsdp2-uneven``, README there) was written by
ByteCheckpoint's own ``save`` on 2 gloo ranks by ``conformance/peers/bytecheckpoint/data.py``: FSDP2
over an uneven bfloat16 MLP after one Adam step. The values are rebuilt here from the
generator's formula with the plain (unsharded) model."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from shardspec.checkpoint.cli import main
from shardspec.checkpoint.dcp_metadata import (
    BYTECHECKPOINT,
    DCP,
    RawTensorStorage,
    RefusedGlobal,
    metadata_format,
    read_metadata,
)

torch = pytest.importorskip("torch")
# dcp.load without a process group says it assumes one process
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

DATA = Path(__file__).parent / "data" / "bytecheckpoint-0.0.2-fsdp2-uneven"
MODEL, OPTIM = DATA / "model", DATA / "optimizer"
# The generator's model: Linear(5, 7) -> ReLU -> Linear(7, 3), FSDP2 over 2 ranks (4/3, 2/1).
SHAPES = {"0.weight": (7, 5), "0.bias": (7,), "2.weight": (3, 7), "2.bias": (3,)}
ROWS = {7: [(0, 4), (4, 3)], 3: [(0, 2), (2, 1)]}


def expected() -> dict[str, Any]:
    """The generator's formula (conformance/peers/bytecheckpoint/data.py): parameter i of n
    elements ``(arange(n) - n // 2) / 8 + i``, gradient ``(arange(n) % 5 - 2) / 4``, one
    ``Adam(lr=0.125, betas=(0.5, 0.75), foreach=False)`` step in bfloat16, on the plain
    model; keys as the checkpoint holds them."""
    params = {}
    for i, (name, shape) in enumerate(SHAPES.items()):
        n = 1
        for s in shape:
            n *= s
        p = ((torch.arange(n) - n // 2).to(torch.bfloat16) / 8 + i).reshape(shape)
        params[name] = torch.nn.Parameter(p)
    opt = torch.optim.Adam(params.values(), lr=0.125, betas=(0.5, 0.75), foreach=False)
    for p in params.values():
        n = p.numel()
        p.grad = ((torch.arange(n) % 5 - 2).to(torch.bfloat16) / 4).reshape(p.shape)
    opt.step()
    out: dict[str, Any] = {k: p.detach().clone() for k, p in params.items()}
    for k, p in params.items():
        for what, v in opt.state[p].items():
            out[f"state.{k}.{what}"] = v.detach().clone()
    return out


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def bits(t: Any) -> bytes:
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())


def assert_bits(key: str, got: Any, want: Any) -> None:
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape), (
        f"{key}: {got.dtype} {tuple(got.shape)}, but should be {want.dtype} {tuple(want.shape)}"
    )
    assert bits(got) == bits(want), f"{key}={got.tolist()}, but should be {want.tolist()}"


@pytest.mark.rule("CKPT-19", "CKPT-5")
def test_the_metadata_reads_as_dcps_without_bytecheckpoint() -> None:
    assert metadata_format(MODEL) == BYTECHECKPOINT == metadata_format(OPTIM)
    md = read_metadata(MODEL)
    assert "bytecheckpoint" not in sys.modules  # read by name: nothing of it imported
    assert sorted(md.state_dict_metadata) == sorted(SHAPES)
    for key, shape in SHAPES.items():
        smd = md.state_dict_metadata[key]
        assert tuple(smd.size) == shape and smd.properties.dtype == torch.bfloat16
        boxes = [(tuple(c.offsets), tuple(c.sizes)) for c in smd.chunks]
        rest = shape[1:]
        assert boxes == [((o, *(0,) * len(rest)), (n, *rest)) for o, n in ROWS[shape[0]]]
    infos = list(md.storage_data.values())
    assert all(isinstance(i, RawTensorStorage) and i.tensor_pickle for i in infos)
    assert sorted({i.relative_path for i in infos}) == ["__0_0.distcp", "__1_0.distcp"]


@pytest.mark.rule("CKPT-19", "CKPT-6", "CKPT-8")
def test_inspect_calls_it_valid_with_its_shapes_and_dtypes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for path, keys in ((MODEL, 4), (OPTIM, 12)):
        rc, out, err = run(["inspect", str(path), "--json"], capsys)
        assert rc == 0, err
        report = json.loads(out)
        assert report["ok"] and report["summary"]["tensors"] == keys
        assert report["summary"]["missing_files"] == report["summary"]["short_files"] == 0
        tensors = {t["fqn"]: t for t in report["tensors"]}
        for key, shape in SHAPES.items():
            name = key if path == MODEL else f"state.{key}.exp_avg"
            t = tensors[name]
            assert (tuple(t["shape"]), t["dtype"], t["verdict"]["ok"]) == (shape, "bfloat16", True)
            assert [c["file"] for c in t["chunks"]] == ["__0_0.distcp", "__1_0.distcp"]
    rc, out, _ = run(["inspect", str(OPTIM), "--no-layout"], capsys)
    assert rc == 0 and "valid (metadata and file sizes)" in out.splitlines()[0]
    assert "state.0.weight.step  shape ()  float32" in out and "param_groups  object" in out


@pytest.mark.rule("CKPT-19", "CKPT-9")
def test_verify_reads_every_raw_chunk_as_its_metadata_says(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for path, chunks in ((MODEL, 8), (OPTIM, 20)):
        rc, out, err = run(["verify", str(path), "--json"], capsys)
        assert rc == 0, out + err
        report = json.loads(out)
        assert report["ok"] and report["chunks"] == chunks and report["problems"] == []


def _load_with_our_reader(path: Path, keys: list[str]) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp

    from shardspec.checkpoint.dcp import FileSystemReader, LoadPlanner

    want = expected()
    sd = {k: torch.full_like(want[k], -1) for k in keys}
    reader = FileSystemReader(path, whole_item_bytes=0)  # every chunk by its parts (CKPT-14)
    dcp.load(sd, storage_reader=reader, planner=LoadPlanner(), no_dist=True)
    assert reader.stats.fallback_items == 0
    return sd


@pytest.mark.rule("CKPT-19", "CKPT-13")
def test_our_reader_loads_the_values_the_generator_wrote() -> None:
    want = expected()
    model = _load_with_our_reader(MODEL, list(SHAPES))
    for k, v in model.items():
        assert_bits(k, v, want[k])
    keys = [k for k in want if k.startswith("state.")]
    optim = _load_with_our_reader(OPTIM, keys)
    for k, v in optim.items():
        assert_bits(k, v, want[k])
    assert float(optim["state.0.weight.step"]) == 1.0


@pytest.mark.rule("CKPT-19", "CKPT-13")
def test_our_reader_loads_its_non_tensor_values_through_dcps_reader() -> None:
    import torch.distributed.checkpoint as dcp

    from shardspec.checkpoint.dcp import FileSystemReader

    sd: dict[str, Any] = {"param_groups": None, "state.2.bias.exp_avg": torch.zeros(3)}
    sd["state.2.bias.exp_avg"] = sd["state.2.bias.exp_avg"].to(torch.bfloat16)
    reader = FileSystemReader(OPTIM)
    dcp.load(sd, storage_reader=reader, no_dist=True)
    assert reader.stats.fallback_items == 1  # param_groups: a torch.save archive
    groups = sd["param_groups"]
    assert groups[0]["lr"] == 0.125 and tuple(groups[0]["betas"]) == (0.5, 0.75)
    assert_bits(
        "state.2.bias.exp_avg", sd["state.2.bias.exp_avg"], expected()["state.2.bias.exp_avg"]
    )


@pytest.mark.rule("CKPT-19", "CKPT-10", "CKPT-17")
def test_reshard_writes_a_dcp_copy_that_diff_values_finds_equal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch.distributed.checkpoint as dcp

    from shardspec.checkpoint.offline import reshard_checkpoint
    from shardspec.metadata import Box, Layout, Shard

    layouts = {}
    for key, shape in SHAPES.items():  # whole tensors on rank 0, columns for 2-D
        if len(shape) == 2:
            half = shape[1] // 2
            boxes = [Box((0, 0), (shape[0], half)), Box((0, half), (shape[0], shape[1] - half))]
        else:
            boxes = [Box((0,), shape)]
        layouts[key] = Layout(shape, [Shard(b, r) for r, b in enumerate(boxes)])
    out = tmp_path / "dcp"
    reshard_checkpoint(MODEL, out, layouts=layouts)
    assert metadata_format(out) == DCP
    rc, text, _ = run(["diff", str(MODEL), str(out), "--values"], capsys)
    assert rc == 1 and "layout" in text  # the chunks differ, the values do not
    assert "values differ" not in text, text
    # and plain DCP loads the copy to the generator's values
    want = expected()
    sd = {k: torch.zeros_like(want[k]) for k in SHAPES}
    dcp.load(sd, checkpoint_id=str(out), no_dist=True)
    for k, v in sd.items():
        assert_bits(k, v, want[k])


@pytest.mark.rule("CKPT-19", "CKPT-10")
def test_diff_values_names_a_changed_element(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "model"
    shutil.copytree(MODEL, copy)
    md = read_metadata(copy)
    at = next(
        i for k, i in md.storage_data.items() if k.fqn == "2.weight" and tuple(k.offset) == (2, 0)
    )
    path = copy / at.relative_path
    data = bytearray(path.read_bytes())
    data[at.offset + 2 * 3 + 1] ^= 0x40  # element (2, 3) of 2.weight: its high byte
    path.write_bytes(bytes(data))
    rc, out, _ = run(["diff", str(MODEL), str(copy), "--values", "--json"], capsys)
    assert rc == 1
    report = json.loads(out)
    changed = [d for d in report["differences"] if d["what"] == "values"]
    assert len(changed) == 1 and changed[0]["fqn"] == "2.weight", report
    assert (changed[0]["count"], changed[0]["where"]) == (1, [2, 3]), report
    rc, out, _ = run(["verify", str(copy)], capsys)
    assert rc == 0  # raw bytes carry no checksum: verify cannot see a flipped bit


@pytest.mark.rule("CKPT-19", "CKPT-8", "CKPT-16")
def test_a_truncated_or_missing_data_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from shardspec.checkpoint.dcp import FileSystemReader, read_error

    copy = tmp_path / "model"
    shutil.copytree(MODEL, copy)
    f = copy / "__1_0.distcp"
    f.write_bytes(f.read_bytes()[:-3])
    rc, out, _ = run(["inspect", str(copy)], capsys)
    assert rc == 1 and "INVALID" in out and "__1_0.distcp: truncated" in out
    rc, out, _ = run(["verify", str(copy)], capsys)
    assert rc == 1 and "truncated" in out
    want = expected()
    sd = {k: torch.zeros_like(want[k]) for k in SHAPES}
    with pytest.raises(CheckpointException) as err:
        dcp.load(sd, storage_reader=FileSystemReader(copy), no_dist=True)
    assert "__1_0.distcp" in str(read_error(err.value)) and "truncated" in str(
        read_error(err.value)
    )
    f.unlink()
    rc, out, _ = run(["verify", str(copy)], capsys)
    assert rc == 1 and "__1_0.distcp: missing" in out
    (copy / ".metadata").unlink()
    rc, _, err_text = run(["verify", str(copy)], capsys)
    assert rc == 2 and "no such file" in err_text


@pytest.mark.rule("CKPT-19", "CKPT-5")
@pytest.mark.parametrize(
    "name",
    [
        "bytecheckpoint.checkpointer.meta_type.WriteResult",
        "bytecheckpoint.api.save.save",
        "bytecheckpoint.utilities.serialization._deserialize_tensor",
    ],
)
def test_no_other_name_of_bytecheckpoint_is_read(tmp_path: Path, name: str) -> None:
    module, _, attr = name.rpartition(".")
    data = f"c{module}\n{attr}\n)R.".encode()  # GLOBAL module.name, called with ()
    bad = tmp_path / "ck"
    bad.mkdir()
    (bad / ".metadata").write_bytes(data)
    with pytest.raises(RefusedGlobal) as err:
        read_metadata(bad)
    assert f"{err.value.module}.{err.value.name}" == name
    assert "bytecheckpoint" not in sys.modules


@pytest.mark.rule("CKPT-19", "CKPT-23", "CKPT-24")
@pytest.mark.parametrize("reads", ["own", "once"])
def test_the_collective_load_reads_it_on_two_ranks(reads: str) -> None:
    from dcp_load_cases import load_peer

    from shardspec.testing import get_pool

    want = expected()
    pool = get_pool(2, timeout=180)
    dt = {k: (tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in want.items()}
    model = pool.call(load_peer, str(MODEL), {k: dt[k] for k in SHAPES}, [], reads)
    keys = [k for k in want if k.startswith("state.")]
    optim = pool.call(load_peer, str(OPTIM), {k: dt[k] for k in keys}, ["param_groups"], reads)
    for results in (model, optim):
        for r in results:
            for k, v in r["tensors"].items():
                assert_bits(k, v, want[k])
    groups = optim[1]["values"]["param_groups"]
    assert groups[0]["lr"] == 0.125 and tuple(groups[0]["betas"]) == (0.5, 0.75)
