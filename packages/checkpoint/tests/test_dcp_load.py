"""The DCP planners on real gloo ranks (spec/09-checkpoint.md): checkpoints of DTensors (even,
uneven, 2-D meshes, empty shards), ShardedTensors (grids, several shards per rank), plain
tensors and a non-tensor value, saved on 4 and 2 ranks and loaded on fewer, the same and more
ranks in other layouts, with our planners and with DCP's defaults. Every rank's loaded bytes
are compared with the reference slice of the global tensor, so both planners load the same
bytes; a damaged checkpoint is refused on every rank before anything is read."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from dcp_load_cases import load, load_expecting_error, save

from shardspec.checkpoint.cli import main
from shardspec.metadata import Box, Layout, Shard, chunk_layout
from shardspec.testing import RankPool, get_pool

torch = pytest.importorskip("torch")


@pytest.fixture
def pools() -> dict[int, RankPool]:
    # the session's pools of 4 and 2 ranks
    return {w: get_pool(w, timeout=180) for w in (4, 2)}


def grid(shape: tuple[int, int], rows: int, cols: int, ranks: list[int]) -> Layout:
    rb = chunk_layout(shape, 0, list(range(rows)))
    cb = chunk_layout(shape, 1, list(range(cols)))
    shards = []
    for i, r in enumerate(rb.shards):
        for j, c in enumerate(cb.shards):
            box = Box((r.box.offsets[0], c.box.offsets[1]), (r.box.sizes[0], c.box.sizes[1]))
            shards.append(Shard(box, ranks[i * cols + j]))
    return Layout(shape, shards)


def two_per_rank(shape: tuple[int, ...], world: int) -> Layout:
    rows = chunk_layout(shape, 0, list(range(2 * world)))
    return Layout(shape, [Shard(s.box, i % world) for i, s in enumerate(rows.shards)])


# name, shape, dtype -> layout when saved on 4 ranks, loaded on 2, loaded on 4
ON_4 = [
    (
        ("dt.rows", (10, 6), "float32"),
        ("dt", (4,), [("S", 0)]),
        ("dt", (2,), [("S", 1)]),
        ("dt", (2, 2), [("S", 1), ("S", 0)]),
    ),
    (
        ("dt.uneven", (3, 5), "bfloat16"),
        ("dt", (4,), [("S", 0)]),
        ("dt", (2,), [("S", 1)]),
        ("dt", (4,), [("R",)]),
    ),
    (
        ("dt.mesh2d", (7, 9), "int32"),
        ("dt", (2, 2), [("S", 0), ("S", 1)]),
        ("dt", (2,), [("S", 0)]),
        ("dt", (4,), [("S", 1)]),
    ),
    (
        ("dt.nested", (9, 3), "float64"),
        ("dt", (2, 2), [("S", 0), ("S", 0)]),
        ("dt", (2,), [("R",)]),
        ("dt", (2, 2), [("R",), ("S", 1)]),
    ),
    (
        ("dt.scalar", (), "float64"),
        ("dt", (4,), [("R",)]),
        ("dt", (2,), [("R",)]),
        ("dt", (4,), [("R",)]),
    ),
    (
        ("dt.vec", (5,), "complex64"),
        ("dt", (4,), [("S", 0)]),
        ("dt", (2,), [("R",)]),
        ("dt", (4,), [("S", 0)]),
    ),
    (
        ("dt.zero", (0, 4), "float32"),
        ("dt", (4,), [("S", 1)]),
        ("dt", (2,), [("S", 0)]),
        ("dt", (4,), [("S", 0)]),
    ),
    (
        ("st.grid", (8, 6), "bool"),
        ("st", grid((8, 6), 2, 2, [0, 1, 2, 3])),
        ("st", chunk_layout((8, 6), 1, [0, 1])),
        ("st", chunk_layout((8, 6), 0, [3, 2, 1, 0])),
    ),
    (
        ("st.multi", (9, 4), "float16"),
        ("st", two_per_rank((9, 4), 4)),
        ("st", two_per_rank((9, 4), 2)),
        ("st", grid((9, 4), 2, 2, [1, 0, 3, 2])),
    ),
    (("plain", (4, 3), "int64"), ("plain",), ("plain",), ("plain",)),
]

# saved on 2 ranks, loaded on 4
ON_2 = [
    (
        ("dt.cols", (6, 11), "float32"),
        ("dt", (2,), [("S", 1)]),
        ("dt", (2, 2), [("S", 0), ("S", 1)]),
    ),
    (
        ("st.rows", (13, 2), "uint8"),
        ("st", chunk_layout((13, 2), 0, [1, 0])),
        ("st", grid((13, 2), 2, 2, [0, 1, 2, 3])),
    ),
    (("dt.short", (3,), "bool"), ("dt", (2,), [("S", 0)]), ("dt", (4,), [("S", 0)])),
]


def entries(table: list[Any], col: int) -> list[Any]:
    return [(row[0], row[col]) for row in table]


def check_load(pool: RankPool, path: Path, ents: list[Any]) -> None:
    for planner in ("ours", "default"):
        results = pool.call(load, str(path), ents, planner)
        failures = [f for r in results for f in r["failures"]]
        assert not failures, failures
        # Every element of every tensor landed somewhere: the loads were not vacuous.
        for (name, shape, _), how in ents:
            got = sum(sum(r["bytes"][name]) for r in results)
            assert got >= (torch.Size(shape).numel() if how[0] != "plain" else 0), name


@pytest.mark.rule("CKPT-3", "CKPT-4")
@pytest.mark.parametrize("ours_save", [True, False], ids=["our-save", "default-save"])
def test_saved_on_4_loaded_on_2_and_4(
    pools: dict[int, RankPool], tmp_path: Path, ours_save: bool
) -> None:
    pools[4].call(save, str(tmp_path), entries(ON_4, 1), ours_save)
    check_load(pools[2], tmp_path, entries(ON_4, 2))
    check_load(pools[4], tmp_path, entries(ON_4, 3))


# Rank 1's empty shard starts where rank 0's second shard does, and rank 0's plan is the
# larger when DCP's dedup meets the pair (its first shard comes first): hand-worked from
# dedup_save_plans, DCP keeps the empty chunk and drops rows 0-1.
SHADOW = Layout(
    (4, 3),
    [
        Shard(Box((2, 0), (2, 3)), 0),
        Shard(Box((0, 0), (2, 3)), 0),
        Shard(Box((0, 0), (0, 3)), 1),
    ],
)
ON_4_SHADOW = [
    (("st.shadow", (4, 3), "int16"), ("st", SHADOW), ("st", chunk_layout((4, 3), 1, [1, 0])))
]


@pytest.mark.rule("CKPT-1", "CKPT-3")
def test_an_empty_shard_at_another_shards_offset_loses_nothing(
    pools: dict[int, RankPool], tmp_path: Path
) -> None:
    pools[4].call(save, str(tmp_path), entries(ON_4_SHADOW, 1), True)
    check_load(pools[2], tmp_path, entries(ON_4_SHADOW, 2))
    # DCP's own save planner refuses the same state dict (its dedup dropped rows 0-1).
    with pytest.raises(Exception, match="Failed to validate global plan"):
        pools[4].call(save, str(tmp_path / "default"), entries(ON_4_SHADOW, 1), False)


@pytest.mark.rule("CKPT-6")
def test_inspect_reads_a_checkpoint_written_on_4_ranks(
    pools: dict[int, RankPool], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pools[4].call(save, str(tmp_path), entries(ON_4, 1), True)
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True
    got = {
        t["fqn"]: {(tuple(c["offsets"]), tuple(c["sizes"]), c["file"]) for c in t["chunks"]}
        for t in doc["tensors"]
    }
    assert set(got) == {e[0][0] for e in ON_4}
    # Hand-worked: 10 rows over 4 ranks are 3, 3, 3, 1, rank r writing __r_0.distcp; 3 rows
    # over 4 leave rank 3 an empty chunk at row 3; the ShardedTensor grid is 2 x 2 blocks.
    rows = [(0, 3), (3, 3), (6, 3), (9, 1)]
    assert got["dt.rows"] == {((o, 0), (n, 6), f"__{r}_0.distcp") for r, (o, n) in enumerate(rows)}
    assert got["dt.uneven"] == {
        ((r, 0), (1 if r < 3 else 0, 5), f"__{r}_0.distcp") for r in range(4)
    }
    blocks = [((0, 0), 0), ((0, 3), 1), ((4, 0), 2), ((4, 3), 3)]
    assert got["st.grid"] == {(o, (4, 3), f"__{r}_0.distcp") for o, r in blocks}
    assert [o["fqn"] for o in doc["objects"]] == ["step.epoch", "step.note"]


@pytest.mark.rule("CKPT-3")
def test_saved_on_2_loaded_on_4(pools: dict[int, RankPool], tmp_path: Path) -> None:
    pools[2].call(save, str(tmp_path), entries(ON_2, 1), True)
    check_load(pools[4], tmp_path, entries(ON_2, 2))
    check_load(pools[2], tmp_path, entries(ON_2, 1))


def damage(path: Path, fqn: str, drop: int) -> None:
    """Remove chunk ``drop`` of tensor ``fqn`` from a checkpoint we wrote ourselves (trusted,
    so the plain unpickler is fine here)."""
    meta = path / ".metadata"
    md = pickle.loads(meta.read_bytes())
    del md.state_dict_metadata[fqn].chunks[drop]
    meta.write_bytes(pickle.dumps(md))


@pytest.mark.rule("CKPT-1")
def test_a_checkpoint_with_a_chunk_removed_is_refused_on_every_rank(
    pools: dict[int, RankPool], tmp_path: Path
) -> None:
    ents = entries(ON_4, 1)[:2]
    pools[4].call(save, str(tmp_path), ents, True)
    damage(tmp_path, "dt.rows", 2)  # rows [6, 9) of 10
    answers = pools[2].call(load_expecting_error, str(tmp_path), entries(ON_4, 2)[:2])
    for a in answers:
        assert "'dt.rows'" in a and "gap" in a and "(6, 0)" in a, a
        assert "untouched=True" in a, a
        # DCP's CheckpointException reaches every rank; our ChunkError is inside it.
        assert a.startswith("CheckpointException") and "chunk_error=gap 'dt.rows'" in a, a


@pytest.mark.rule("CKPT-6")
def test_inspect_flags_a_checkpoint_with_a_chunk_removed(
    pools: dict[int, RankPool], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pools[4].call(save, str(tmp_path), entries(ON_4, 1)[:2], True)
    damage(tmp_path, "dt.rows", 2)
    assert main(["inspect", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "dt.rows  shape (10, 6)  float32  240 B  3 chunks  INVALID (gap)" in out
    assert "checkpoint tensor 'dt.rows': gap: 18 of 60 elements are in no chunk" in out
    assert "the first at (6, 0)" in out
    assert "dt.uneven  shape (3, 5)  bfloat16  30 B  4 chunks  OK" in out
