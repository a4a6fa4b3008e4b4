"""Checkpoints written by peers, kept as test data (``tests/data/<peer>-<release>-...``): what
each holds, computed from a formula, and the function that wrote it with the real package.

``VALUES`` and :func:`megatron_state` need no peer installed: ``test_peer_checkpoints.py``
compares what shardspec reads from the committed files with them. Writing needs the peer:
``nox -s peers_megatron`` reruns :func:`write_megatron` into a temporary folder (``python
packages/checkpoint/tests/peer_checkpoints.py megatron DIR``) and runs the same tests on it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

MEGATRON_RELEASE = "0.19.2"
MEGATRON_DIR = Path(__file__).parent / "data" / f"megatron-{MEGATRON_RELEASE}-torch-2.13.0-2ranks"
MEGATRON_WORLD = 2


def values() -> dict[str, torch.Tensor]:
    """Every tensor of the peer checkpoints, whole: a formula, no randomness."""
    return {
        # 7 rows on 2 ranks, 4 and 3: Megatron's box form (axis_fragmentations=None)
        "decoder.weight": torch.arange(28, dtype=torch.float32).reshape(7, 4) * 0.5 - 3.0,
        # 6 values on 2 ranks, 3 each, bfloat16: from_rank_offsets
        "decoder.bias": (torch.arange(6, dtype=torch.float32) / 8 - 0.25).to(torch.bfloat16),
        # a 2-D grid: columns 0-2 and 3-5 of a 4 x 6 table, stated with axis_fragmentations
        "embedding.weight": torch.arange(24, dtype=torch.float32).reshape(4, 6) * -1.25,
        # the same 5 values on both ranks: replicas (replica_id 0 on rank 0, 1 on rank 1)
        "final_norm.weight": torch.arange(5, dtype=torch.float32) + 100.0,
    }


# Per key, per rank: (offsets, sizes, form) of the rank's piece; "replica" = whole, replica_id
# = rank.
PIECES: dict[str, list[tuple[tuple[int, ...], tuple[int, ...]]]] = {
    "decoder.weight": [((0, 0), (4, 4)), ((4, 0), (3, 4))],
    "decoder.bias": [((0,), (3,)), ((3,), (3,))],
    "embedding.weight": [((0, 0), (4, 3)), ((0, 3), (4, 3))],
    "final_norm.weight": [((0,), (5,)), ((0,), (5,))],
}
COMMON = {"iteration": 3, "note": "shardspec peer checkpoint"}


def megatron_state(rank: int) -> dict[str, Any]:
    """Rank ``rank``'s sharded state dict for ``megatron.core.dist_checkpointing.save``, in
    the three forms Megatron has (imports Megatron)."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    full = values()

    def piece(key: str) -> torch.Tensor:
        offsets, sizes = PIECES[key][rank]
        index = tuple(slice(o, o + n) for o, n in zip(offsets, sizes))
        return full[key][index].clone()

    weight = piece("decoder.weight")
    offsets, sizes = PIECES["decoder.weight"][rank]
    embed = piece("embedding.weight")
    return {
        "decoder.weight": ShardedTensor(
            "decoder.weight", weight, weight.dtype, sizes, (7, 4), offsets, None
        ),
        "decoder.bias": ShardedTensor.from_rank_offsets(
            "decoder.bias", piece("decoder.bias"), (0, rank, MEGATRON_WORLD)
        ),
        "embedding.weight": ShardedTensor(
            "embedding.weight",
            embed,
            embed.dtype,
            tuple(embed.shape),
            (4, 6),
            PIECES["embedding.weight"][rank][0],
            (1, 2),
        ),
        "final_norm.weight": ShardedTensor.from_rank_offsets(
            "final_norm.weight", piece("final_norm.weight"), replica_id=rank
        ),
        **COMMON,
    }


def write_megatron_rank(rank: int, world: int, path: str) -> list[str]:
    """A rank of :func:`write_megatron` (run by ``shardspec.testing.run_world``)."""
    from megatron.core import dist_checkpointing

    from shardspec.testing.peers import megatron_cpu_patch

    megatron_cpu_patch()
    dist_checkpointing.save(megatron_state(rank), path)
    return sorted(os.listdir(path))


def write_megatron(path: str | Path) -> list[str]:
    """Write the Megatron checkpoint into the empty folder ``path`` on 2 gloo ranks."""
    from shardspec.testing import run_world

    here = str(Path(__file__).parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [here, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    )
    Path(path).mkdir(parents=True, exist_ok=True)
    out = run_world("peer_checkpoints:write_megatron_rank", MEGATRON_WORLD, str(path))
    bad = {r: v for r, (kind, v) in out.items() if kind != "ok"}
    if bad:
        raise RuntimeError(f"the Megatron save failed: {bad}")
    return list(out[0][1])


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "megatron":
        sys.exit("usage: python peer_checkpoints.py megatron DIR")
    print("\n".join(write_megatron(sys.argv[2])))
