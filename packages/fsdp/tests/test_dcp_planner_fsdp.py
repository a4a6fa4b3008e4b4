"""shardspec's DCP planners on real FSDP checkpoints (spec/09-checkpoint.md, CKPT-3): FSDP1 +
TP (uneven, shardspec's extension) and FSDP2 + TP saved on 4 gloo ranks, FSDP2 and FSDP1 saved
on 2, each loaded on fewer, the same or more ranks into other FSDP layouts with our
LoadPlanner and with DCP's default: the same bytes, and the reference model's values at the
boxes FSDP-1 gives each rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fsdp_dcp_planner_checks import load_model, save_model

from shardspec.checkpoint.cli import main
from shardspec.testing import RankPool, get_pool
from shardspec.testing.fsdp_model import make_model, truth_layout as _truth_layout

# saved with (world, kind) -> loaded with (world, kind)
LOADS = {
    (4, "fsdp1_tp"): [(4, "fsdp2"), (4, "fsdp1_tp"), (2, "fsdp2"), (2, "fsdp1")],
    (4, "fsdp2_tp"): [(4, "fsdp1_tp"), (4, "fsdp2_tp"), (2, "fsdp2"), (2, "fsdp1")],
    (2, "fsdp2"): [(4, "fsdp2_tp"), (4, "fsdp1_tp")],
    (2, "fsdp1"): [(4, "fsdp2_tp"), (2, "fsdp2")],
}


@pytest.fixture
def pools() -> dict[int, RankPool]:
    # the session's pools of 4 and 2 ranks
    return {w: get_pool(w, timeout=300) for w in (4, 2)}


@pytest.mark.rule("CKPT-3")
@pytest.mark.parametrize(("saved_on", "kind"), list(LOADS), ids=[f"{k}-on-{w}" for w, k in LOADS])
def test_fsdp_checkpoint_loads_like_the_default_planner(
    pools: dict[int, RankPool], tmp_path: Path, saved_on: int, kind: str
) -> None:
    pools[saved_on].call(save_model, str(tmp_path), kind)
    for world, target in LOADS[(saved_on, kind)]:
        reports = pools[world].call(load_model, str(tmp_path), target)
        for r, rep in enumerate(reports):
            where = f"{kind} on {saved_on} -> {target} on {world}, rank {r}"
            assert not rep["ours"], (where, rep["ours"])
            assert not rep["default"], (where, rep["default"])
            assert not rep["same"], (where, rep["same"])
            assert len(rep["keys"]) == 10, (where, rep["keys"])  # 5 Linears: weight + bias


@pytest.mark.rule("CKPT-6")
@pytest.mark.parametrize("kind", ["fsdp1_tp", "fsdp2_tp"])
def test_inspect_reads_fsdp_tp_checkpoints(
    pools: dict[int, RankPool], tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    pools[4].call(save_model, str(tmp_path), kind)
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ref = make_model(0).state_dict()
    got = {t["fqn"]: t for t in doc["tensors"]}
    assert set(got) == {f"model.{k}" for k in ref}
    for name, full in ref.items():
        t = got[f"model.{name}"]
        assert t["verdict"] == {"ok": True} and t["shape"] == list(full.shape)
        assert t["dtype"] == "float32" and t["bytes"] == 4 * full.numel()
        # The boxes FSDP-1 gives the ranks of the 2 x 2 mesh, each written once.
        truth = {s.box for s in _truth_layout(name, tuple(full.shape), 2, 2).shards}
        chunks = {(tuple(c["offsets"]), tuple(c["sizes"])) for c in t["chunks"]}
        assert chunks == {(b.offsets, b.sizes) for b in truth}, name
        assert all(c["file"] and c["file"].endswith(".distcp") for c in t["chunks"])
