"""Checkpoints written by peers in DCP's format are read by every tool here (CKPT-21), in the
default environment, without the peer installed: the committed Megatron-Core checkpoint
(``tests/data/megatron-*``, its README says how it was written) is inspected, verified,
diffed, rewritten and loaded with ``LoadPlanner`` + ``FileSystemReader``, and what is read
equals the values the writer saved (``peer_checkpoints.values()``, a formula).

``SHARDSPEC_MEGATRON_CHECKPOINT=DIR`` adds a checkpoint just written by the real package
(``nox -s peers_megatron`` does, with ``peer_checkpoints.write_megatron``)."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from peer_checkpoints import COMMON, MEGATRON_DIR, PIECES, values

from shardspec.checkpoint.cli import main
from shardspec.checkpoint.dcp import FileSystemReader, LoadPlanner
from shardspec.checkpoint.dcp_metadata import read_metadata
from shardspec.metadata import Box, Layout, Shard
from shardspec.metadata.serialize import layout_to_json

CHECKPOINTS = [pytest.param(MEGATRON_DIR, id="megatron-committed")]
if os.environ.get("SHARDSPEC_MEGATRON_CHECKPOINT"):
    CHECKPOINTS.append(
        pytest.param(Path(os.environ["SHARDSPEC_MEGATRON_CHECKPOINT"]), id="megatron-fresh")
    )


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out + err


@pytest.mark.rule("CKPT-21")
@pytest.mark.parametrize("path", CHECKPOINTS)
def test_inspect_and_verify_accept_a_megatron_checkpoint(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out = _run(["inspect", str(path), "--json"], capsys)
    assert rc == 0, out
    report = json.loads(out)
    assert report["ok"] is True and report["summary"]["invalid_tensors"] == 0, report["summary"]
    assert [o["fqn"] for o in report["objects"]] == ["common_state/shard_0_1"]
    tensors = {t["fqn"]: t for t in report["tensors"]}
    want = values()
    assert set(tensors) == set(want)
    for key, t in tensors.items():
        assert tuple(t["shape"]) == tuple(want[key].shape), key
        assert t["dtype"] == str(want[key].dtype).removeprefix("torch."), key
        assert t["verdict"] == {"ok": True}, (key, t["verdict"])
        # replicas are saved once: the main replica's piece
        saved = {(tuple(c["offsets"]), tuple(c["sizes"])) for c in t["chunks"]}
        assert saved == set(PIECES[key]), key
    rc, out = _run(["verify", str(path), "--progress", "never"], capsys)
    assert rc == 0 and out.splitlines()[0].endswith("all valid"), out


@pytest.mark.rule("CKPT-21")
@pytest.mark.parametrize("path", CHECKPOINTS)
def test_the_metadata_of_a_megatron_checkpoint_keeps_its_save_plans(path: Path) -> None:
    """Megatron's torch_dist metadata carries every rank's DCP SavePlan (``all_local_plans``),
    read through the allow-list (CKPT-5) as what they are."""
    from torch.distributed.checkpoint.planner import SavePlan, WriteItemType

    md = read_metadata(path)
    plans = md.all_local_plans  # type: ignore[attr-defined]
    assert len(plans) == 2 and all(isinstance(p, SavePlan) for p in plans)
    kinds = {i.type for p in plans for i in p.items}
    assert kinds == {WriteItemType.SHARD, WriteItemType.BYTE_IO}


@pytest.mark.rule("CKPT-21")
@pytest.mark.parametrize("path", CHECKPOINTS)
def test_dcp_load_with_our_planner_and_reader_gives_the_saved_values(path: Path) -> None:
    want = values()
    state = {k: torch.full_like(v, 7) for k, v in want.items()}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=FileSystemReader(path), planner=LoadPlanner(), no_dist=True)
    for key, t in want.items():
        assert state[key].dtype == t.dtype, key
        assert torch.equal(state[key], t), (key, state[key], t)
    # the pieces a 2-rank job would load: each rank's own box
    for key, pieces in PIECES.items():
        for offsets, sizes in pieces:
            index = tuple(slice(o, o + n) for o, n in zip(offsets, sizes))
            assert torch.equal(state[key][index], want[key][index]), key
    assert COMMON["iteration"] == 3  # the common state is a DCP bytes value, read by Megatron


@pytest.mark.rule("CKPT-21")
@pytest.mark.parametrize("path", CHECKPOINTS)
def test_diff_and_reshard_accept_a_megatron_checkpoint(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out = _run(["diff", str(path), str(path), "--values"], capsys)
    assert rc == 0, out
    # rewrite every tensor into one whole chunk, then load the result with plain DCP
    layouts = {
        key: json.loads(layout_to_json(Layout(t.shape, [Shard(Box([0] * t.dim(), t.shape), 0)])))
        for key, t in values().items()
    }
    (tmp_path / "layouts.json").write_text(json.dumps(layouts))
    dst = tmp_path / "whole"
    rc, out = _run(["reshard", str(path), str(dst), "--layouts", str(tmp_path / "layouts.json")],
                   capsys)  # fmt: skip
    assert rc == 0, out
    rc, out = _run(["diff", str(path), str(dst), "--values"], capsys)
    assert rc == 1 and "layout" in out, out  # the same values, in other chunks
    state = {k: torch.zeros_like(v) for k, v in values().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=str(dst), no_dist=True)
    for key, t in values().items():
        assert torch.equal(state[key], t), key


@pytest.mark.rule("CKPT-21", "CKPT-23", "CKPT-24")
@pytest.mark.parametrize("path", CHECKPOINTS)
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("reads", ["own", "once"])
def test_the_collective_load_reads_it_on_another_world(path: Path, world: int, reads: str) -> None:
    """``shardspec.checkpoint.load`` into DTensors split by rows over 2 ranks (as saved for
    two tensors, across the saved grid and replicas for the others) and over 3: every tensor
    the writer's values, Megatron's common state what ``dcp.load`` gives (the value in a
    list), and the job reads each saved tensor byte once either way (no destination box is
    held twice)."""
    from dcp_load_cases import load_peer

    from shardspec.testing import get_pool

    want = values()
    dt = {k: (tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in want.items()}
    common = "common_state/shard_0_1"
    results = get_pool(world, timeout=180).call(load_peer, str(path), dt, [common], reads)
    for r in results:
        for key, t in r["tensors"].items():
            assert t.dtype == want[key].dtype and torch.equal(t, want[key]), (key, t)
        assert r["values"] == {common: [COMMON]}
        assert r["stats"]["reads"] == reads
    saved = sum(t.numel() * t.element_size() for t in want.values())
    assert sum(r["stats"]["data_bytes"] for r in results) == saved
