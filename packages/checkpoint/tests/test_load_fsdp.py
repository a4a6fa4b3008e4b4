"""``shardspec.checkpoint.load`` of checkpoints a real FSDP2 job wrote (spec/09-checkpoint.md,
CKPT-23, CKPT-24): the uneven model of ``shardspec.testing.fsdp_model`` after one Adam step,
its model and optimizer state dicts (``get_state_dict``) saved by ``dcp.save`` under FSDP2 +
TP on a 2x2 mesh (``_StridedShard`` chunks) or FSDP2 on 2 ranks, loaded into a fresh model on
another mesh. Every rank's local tensors and values are ``dcp.load``'s from the same files,
bit for bit, every DTensor is whole what was saved, and the model and optimizer take them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from fsdp_load_cases import load_trained, save_trained

from shardspec.reshard.reference import same_bits
from shardspec.testing import get_pool

# (saved on, loaded on): meshes as (dp, tp)
CASES = [((2, 2), (3, 1)), ((2, 1), (2, 2))]


def _world(mesh: tuple[int, ...]) -> int:
    return mesh[0] * mesh[1]


def _same(what: str, got: Any, want: Any) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and same_bits(got, want), (what, got, want)
    else:
        assert got == want, (what, got, want)


@pytest.mark.rule("CKPT-23", "CKPT-24")
@pytest.mark.parametrize(
    ("saved_on", "loaded_on"), CASES, ids=["fsdp2xtp-to-fsdp2", "fsdp2-to-fsdp2xtp"]
)
def test_a_real_fsdp2_checkpoint_loads_as_dcp_load_loads_it(
    tmp_path: Path, saved_on: tuple[int, int], loaded_on: tuple[int, int]
) -> None:
    saver = get_pool(_world(saved_on), timeout=240)
    saved = saver.call(save_trained, str(tmp_path), list(saved_on))[0]
    loader = get_pool(_world(loaded_on), timeout=240)
    want = loader.call(load_trained, str(tmp_path), list(loaded_on), "dcp")
    assert set(want[0]["whole"]) == set(saved)
    for how in ("own", "once", "auto"):
        got = loader.call(load_trained, str(tmp_path), list(loaded_on), how)
        for rank, (g, w) in enumerate(zip(got, want)):
            assert set(g["local"]) == set(w["local"]), (how, rank)
            for key, value in w["local"].items():
                _same(f"{how}: rank {rank} {key}", g["local"][key], value)
            for key, value in saved.items():
                _same(f"{how}: rank {rank} {key} whole", g["whole"][key], value)
        reads = {g["reads"] for g in got}
        assert reads == ({how} if how != "auto" else reads) and len(reads) == 1, (how, reads)
