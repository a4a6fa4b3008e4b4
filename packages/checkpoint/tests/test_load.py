"""``shardspec.checkpoint.load`` on real gloo ranks (spec/09-checkpoint.md, CKPT-23 to
CKPT-27): the checkpoints of test_dcp_load (DTensors even, uneven, on 2-D meshes, nested and
replicated; ShardedTensor grids and several shards per rank; plain tensors; a nested
non-tensor value) saved on 4 or 2 ranks and loaded on 2 and 4 in other layouts with every
``reads`` mode: each rank's bytes are the reference slices of the saved tensor. What each rank
read from storage is counted: with ``reads="once"`` the job reads every needed byte once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dcp_load_cases import load, load_failing, save
from test_dcp_load import ON_2, ON_4, entries, grid, two_per_rank

from shardspec.metadata import chunk_layout
from shardspec.testing import RankPool, get_pool

torch = pytest.importorskip("torch")

MODES = ("load-own", "load-once", "load-auto")


@pytest.fixture
def pools() -> dict[int, RankPool]:
    return {w: get_pool(w, timeout=180) for w in (4, 2)}


def check(pool: RankPool, path: Path, ents: list[Any], mode: str) -> list[dict[str, Any]]:
    results = pool.call(load, str(path), ents, mode)
    failures = [f for r in results for f in r["failures"]]
    assert not failures, (mode, failures)
    stats = [r["stats"] for r in results]
    assert len({s["reads"] for s in stats}) == 1, stats
    if not mode.startswith("load-auto"):
        assert stats[0]["reads"] == mode[len("load-") :]
    return stats


def saved_data_bytes(ents: list[Any]) -> int:
    """Every saved tensor's bytes (each saved once: DCP dedups replicas) and nothing else."""
    total = 0
    for (_, shape, dt), _ in ents:
        total += torch.Size(shape).numel() * getattr(torch, dt).itemsize
    return total


@pytest.mark.rule("CKPT-23", "CKPT-24", "CKPT-25")
@pytest.mark.parametrize("mode", MODES)
def test_saved_on_4_loaded_on_2_and_4(
    pools: dict[int, RankPool], tmp_path: Path, mode: str
) -> None:
    pools[4].call(save, str(tmp_path), entries(ON_4, 1), True)
    for world, col in ((2, 2), (4, 3)):
        stats = check(pools[world], tmp_path, entries(ON_4, col), mode)
        if stats[0]["reads"] == "once":
            # Each tensor byte read by exactly one rank; and each value once per job.
            assert sum(s["data_bytes"] for s in stats) == saved_data_bytes(entries(ON_4, col))
            assert sum(bool(s["value_bytes"]) for s in stats) == 2  # "step.epoch", "step.note"


@pytest.mark.rule("CKPT-23", "CKPT-24")
@pytest.mark.parametrize("mode", MODES)
def test_saved_on_2_loaded_on_4(pools: dict[int, RankPool], tmp_path: Path, mode: str) -> None:
    pools[2].call(save, str(tmp_path), entries(ON_2, 1), True)
    check(pools[4], tmp_path, entries(ON_2, 2), mode)
    check(pools[2], tmp_path, entries(ON_2, 1), mode)


# Chunks above the reader's whole-read size (256 KiB) beside small ones: reads="own" reads the
# small ones by their spans of file (chunk_spans) and the large ones with the reader; and a
# tensor of 100 small chunks.
LARGE_AND_SMALL = [
    (
        ("dt.large", (600, 256), "float32"),  # 300 KiB a saved chunk
        ("dt", (2,), [("S", 0)]),
        ("dt", (4,), [("S", 1)]),
    ),
    (
        ("st.small", (13, 2), "uint8"),
        ("st", chunk_layout((13, 2), 0, [1, 0])),
        ("st", grid((13, 2), 2, 2, [0, 1, 2, 3])),
    ),
    (  # 100 saved chunks against a rank's boxes: the planner finds the pieces
        ("st.cells", (20, 30), "int16"),
        ("st", grid((20, 30), 10, 10, [i % 2 for i in range(100)])),
        ("st", grid((20, 30), 3, 3, [i % 4 for i in range(9)])),
    ),
]


@pytest.mark.rule("CKPT-24")
@pytest.mark.parametrize("mode", MODES)
def test_large_and_small_chunks_load_together(
    pools: dict[int, RankPool], tmp_path: Path, mode: str
) -> None:
    pools[2].call(save, str(tmp_path), entries(LARGE_AND_SMALL, 1), True)
    stats = check(pools[4], tmp_path, entries(LARGE_AND_SMALL, 2), mode)
    if stats[0]["reads"] == "own":  # each rank reads its columns of both large chunks
        large = 600 * 256 * 4
        assert all(s["data_bytes"] >= large // 4 for s in stats), stats


# Tensors of one geometry (a model's layers): reads="once" reads and moves each geometry's as
# one stack (CKPT-24), cut across its members into runs of several, beside a tensor of another
# geometry and a replicated one.
STACKED = (
    [
        (
            (f"dt.layers.{i}.w", (12, 10), "float32"),
            ("dt", (4,), [("S", 0)]),
            ("dt", (2,), [("S", 1)]),
            ("dt", (2, 2), [("S", 1), ("S", 0)]),
        )
        for i in range(12)
    ]
    + [
        (
            (f"st.layers.{i}.b", (13, 2), "bfloat16"),
            ("st", two_per_rank((13, 2), 4)),
            ("st", chunk_layout((13, 2), 1, [1, 0])),
            ("st", grid((13, 2), 2, 2, [3, 2, 1, 0])),
        )
        for i in range(5)
    ]
    + [
        (
            ("dt.other", (12, 10), "float16"),
            ("dt", (4,), [("S", 0)]),
            ("dt", (2,), [("S", 1)]),
            ("dt", (4,), [("S", 1)]),
        ),
        (
            ("dt.norm", (10,), "float32"),
            ("dt", (4,), [("S", 0)]),
            ("dt", (2,), [("R",)]),
            ("dt", (4,), [("R",)]),
        ),
    ]
)


@pytest.mark.rule("CKPT-24")
@pytest.mark.parametrize("mode", MODES)
def test_tensors_of_one_geometry_load_as_a_stack(
    pools: dict[int, RankPool], tmp_path: Path, mode: str
) -> None:
    pools[4].call(save, str(tmp_path), entries(STACKED, 1), True)
    for world, col in ((2, 2), (4, 3)):
        stats = check(pools[world], tmp_path, entries(STACKED, col), mode)
        if stats[0]["reads"] == "once":
            assert sum(s["data_bytes"] for s in stats) == saved_data_bytes(entries(STACKED, col))


def same_error_everywhere(answers: list[str]) -> str:
    assert all(a.startswith("LoadError: ") for a in answers), answers
    assert len(set(answers)) == 1, answers
    return answers[0]


@pytest.mark.rule("CKPT-26")
@pytest.mark.parametrize("reads", ["own", "once"])
@pytest.mark.parametrize(
    ("tweak", "words"),
    [
        ("shape", ["rank 1", "'dt.rows' has shape (1, 1) in the state dict, (10, 6)"]),
        ("dtype", ["rank 1", "'dt.rows' has dtype torch.complex128", "float32"]),
        ("key", ["rank 1", "'not.saved' of the state dict is not in the checkpoint"]),
        ("kind", ["rank 1", "'dt.rows' is a int in the state dict but a tensor of shape (10, 6)"]),
        ("missing", ["ranks 0, 1", "'not.saved' of the state dict is not in the checkpoint"]),
        ("plain", ["the ranks disagree on the keys, the destination layouts", "rank 0 vs rank 1"]),
    ],
)
def test_a_state_dict_that_does_not_match_fails_on_every_rank(
    pools: dict[int, RankPool], tmp_path: Path, reads: str, tweak: str, words: list[str]
) -> None:
    pools[4].call(save, str(tmp_path), entries(ON_4, 1), True)
    answers = pools[2].call(load_failing, str(tmp_path), entries(ON_4, 2), reads, tweak)
    error = same_error_everywhere(answers)
    assert "no data was read" in error, error
    for w in words:
        assert w in error, (w, error)


def _truncate(path: Path) -> str:
    f = path / "__2_0.distcp"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return "__2_0.distcp"


def _remove(path: Path) -> str:
    (path / "__1_0.distcp").unlink()
    return "__1_0.distcp"


def _garble_metadata(path: Path) -> str:
    (path / ".metadata").write_bytes(b"not a pickle at all")
    return ".metadata"


def _no_metadata(path: Path) -> str:
    (path / ".metadata").unlink()
    return ".metadata"


@pytest.mark.rule("CKPT-26")
@pytest.mark.parametrize("reads", ["own", "once"])
@pytest.mark.parametrize("spoil", [_truncate, _remove, _garble_metadata, _no_metadata])
@pytest.mark.parametrize("world", [2, 4])  # 4: the metadata travels as columns (CKPT-23)
def test_a_damaged_checkpoint_fails_on_every_rank_naming_the_file(
    pools: dict[int, RankPool], tmp_path: Path, reads: str, spoil: Any, world: int
) -> None:
    pools[4].call(save, str(tmp_path), entries(ON_4, 1), True)
    name = spoil(tmp_path)
    # loaded on 4 as saved, on 2 as its second layouts
    answers = pools[world].call(
        load_failing, str(tmp_path), entries(ON_4, 1 if world == 4 else 2), reads
    )
    error = same_error_everywhere(answers)
    assert name in error, error
    if name != ".metadata":
        # the tensor and the chunk's offsets are named too
        assert "tensor '" in error and "chunk at offsets" in error, error


HF = [
    ("model.embed.weight", (10, 6), "bfloat16"),
    ("model.layers.0.mlp.weight", (7, 5), "float32"),
    ("model.layers.0.mlp.bias", (7,), "float16"),
    ("model.norm.scale", (), "float64"),
    ("model.empty", (0, 3), "int8"),
]


def _write_hf(path: Path, sharded: bool) -> None:
    """A Hugging Face checkpoint of HF's tensors: two files and their index, or one file."""
    import json

    from dcp_load_cases import full_tensor
    from safetensors.torch import save_file

    tensors = {n: full_tensor(n, s, d) for n, s, d in HF}
    if not sharded:
        save_file(tensors, str(path))
        return
    path.mkdir()
    names = sorted(tensors)
    parts = [names[::2], names[1::2]]
    weight_map = {}
    for k, part in enumerate(parts, 1):
        fname = f"model-{k:05d}-of-{len(parts):05d}.safetensors"
        save_file({n: tensors[n] for n in part}, str(path / fname))
        weight_map.update(dict.fromkeys(part, fname))
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
    )


@pytest.mark.rule("CKPT-22", "CKPT-23", "CKPT-24")
@pytest.mark.parametrize("reads", ["own", "once"])
@pytest.mark.parametrize("sharded", [True, False], ids=["index", "one-file"])
def test_a_safetensors_checkpoint_loads_as_tp_shards_and_whole(
    pools: dict[int, RankPool], tmp_path: Path, reads: str, sharded: bool
) -> None:
    from dcp_load_cases import load_safetensors

    path = tmp_path / ("hf" if sharded else "model.safetensors")
    _write_hf(path, sharded)
    layouts = [
        ("dt", (2,), [("S", 0)]),  # column-parallel rows
        ("dt", (2,), [("S", 1)]),  # row-parallel columns
        ("plain",),
        ("dt", (2,), [("R",)]),
        ("dt", (2,), [("S", 1)]),
    ]
    ents = [((n, s, d), how) for (n, s, d), how in zip(HF, layouts)]
    results = pools[2].call(load_safetensors, str(path), ents, reads)
    failures = [f for r in results for f in r["failures"]]
    assert not failures, failures
    stats = [r["stats"] for r in results]
    assert {s["reads"] for s in stats} == {reads}
    if reads == "once":
        total = sum(torch.Size(s).numel() * getattr(torch, d).itemsize for _, s, d in HF)
        assert sum(s["data_bytes"] for s in stats) == total


@pytest.mark.rule("CKPT-23", "CKPT-24")
@pytest.mark.parametrize("reads", ["own", "once"])
def test_two_subgroups_load_side_by_side(
    pools: dict[int, RankPool], tmp_path: Path, reads: str
) -> None:
    from dcp_load_cases import load_on_subgroups

    pools[2].call(save, str(tmp_path), entries(ON_2, 1), True)
    results = pools[4].call(load_on_subgroups, str(tmp_path), entries(ON_2, 1), reads)
    failures = [f for r in results for f in r["failures"]]
    assert not failures, failures
    if reads == "once":
        # each group of 2 reads every tensor byte once: the job, twice
        tensor_bytes = saved_data_bytes(entries(ON_2, 1))
        for group in ((0, 2), (1, 3)):
            assert sum(results[r]["stats"]["data_bytes"] for r in group) == tensor_bytes


# FSDP2 + TP's _StridedShard on the FSDP mesh dim, against DCP's own load of the same
STRIDED = [
    (
        ("dt.strided", (12, 5), "float32"),
        ("dt", (4,), [("S", 0)]),
        ("dt", (2, 2), [("SS", 0, 2), ("S", 0)]),
    ),
    (
        ("dt.strided.uneven", (7, 3), "int32"),
        ("dt", (2, 2), [("S", 1), ("S", 0)]),
        ("dt", (2, 2), [("SS", 0, 2), ("S", 0)]),
    ),
]


@pytest.mark.rule("CKPT-23")
@pytest.mark.parametrize("mode", [*MODES, "default"])
def test_strided_shards_of_fsdp2_with_tp_load(
    pools: dict[int, RankPool], tmp_path: Path, mode: str
) -> None:
    pools[4].call(save, str(tmp_path), entries(STRIDED, 1), True)
    results = pools[4].call(load, str(tmp_path), entries(STRIDED, 2), mode)
    failures = [f for r in results for f in r["failures"]]
    assert not failures, failures


# Saved on 4, loaded on 4 into DTensors on meshes of part of the world: the mesh of dim 0 of a
# 2x2 mesh for each coordinate of dim 1 (FSDP2 + TP's modules outside the TP plan: ranks 0, 2
# and 1, 3), the mesh of dim 1 (ranks 0, 1 and 2, 3), and four meshes of one rank each (every
# rank holds the whole tensor: replicas, so "auto" reads once).
SUBMESHES = [
    (("sub.rows", (7, 3), "float32"), ("dt", (4,), [("S", 1)]), ("dt", (2, 2), [("S", 0)], 0)),
    (
        ("sub.cols", (5, 6), "bfloat16"),
        ("dt", (4,), [("S", 0)]),
        ("dt", (2, 2), [("S", 1)], 1),
    ),
    (
        ("sub.alone", (3, 4), "int32"),
        ("dt", (2, 2), [("S", 0), ("S", 1)]),
        ("dt", (4, 1), [("S", 0)], 1),
    ),
]


@pytest.mark.rule("CKPT-23", "CKPT-24", "CKPT-25")
@pytest.mark.parametrize("mode", [*MODES, "load-auto-shared", "load-auto-local"])
def test_dtensors_on_meshes_of_part_of_the_group_load(
    pools: dict[int, RankPool], tmp_path: Path, mode: str
) -> None:
    pools[4].call(save, str(tmp_path), entries(SUBMESHES, 1), True)
    stats = check(pools[4], tmp_path, entries(SUBMESHES, 2), mode)
    if mode in ("load-once", "load-auto-shared"):
        # every rank wants what its mesh's siblings want too: read once, moved to each (auto
        # on shared storage: CKPT-25)
        assert stats[0]["reads"] == "once", stats
        assert sum(s["data_bytes"] for s in stats) == saved_data_bytes(entries(SUBMESHES, 2))
    if mode == "load-auto-local":
        # small replicated tensors on local storage: reading them again is cheaper than
        # moving them (CKPT-25)
        assert stats[0]["reads"] == "own", stats
    if mode.startswith("load-auto-"):
        assert stats[0]["storage"] == mode[len("load-auto-") :], stats


@pytest.mark.rule("CKPT-23", "CKPT-26")
@pytest.mark.parametrize(
    ("tweak", "words"),
    [
        # rank 3 replicates on the mesh of ranks 1 and 3, where rank 1 shards
        ("submesh", ["ranks 0-3: ValueError: 'sub.rows': ranks 3 and 1 hold it on one mesh"]),
        # rank 1 fails before the exchange of meshes the others go into: no hang, one error
        ("key", ["rank 1: ValueError: 'not.saved' of the state dict is not in the checkpoint"]),
        ("missing", ["ranks 0-3: ValueError: 'not.saved' of the state dict is not in"]),
    ],
)
def test_ranks_that_do_not_agree_on_sub_meshes_fail_alike(
    pools: dict[int, RankPool], tmp_path: Path, tweak: str, words: list[str]
) -> None:
    pools[4].call(save, str(tmp_path), entries(SUBMESHES, 1), True)
    answers = pools[4].call(load_failing, str(tmp_path), entries(SUBMESHES, 2), "auto", tweak)
    error = same_error_everywhere(answers)
    assert "no data was read" in error, error
    for w in words:
        assert w in error, (w, error)


@pytest.mark.rule("CKPT-23", "CKPT-26")
@pytest.mark.parametrize(
    ("case", "want"),
    [
        ("ok", "[((0,), (4,), 0), ((0,), (4,), 1)]"),
        ("shared", "ValueError: 'x': rank 1 is in two of its meshes (led by ranks 0 and 1); "
                   "the meshes a DTensor is on must not share ranks"),
        ("unreportable", "ValueError: a DTensor's mesh could not be reported: rank 1: "
                         "RuntimeError: no ranks here"),
    ],
)  # fmt: skip
def test_the_whole_layout_of_sub_meshes_is_the_same_on_every_rank_or_fails_on_all(
    case: str, want: str
) -> None:
    from dcp_load_cases import whole_layouts_of

    answers = get_pool(2, timeout=180).call(whole_layouts_of, case)
    assert answers == [want, want], answers
