"""A checkpoint library's own API (spec/09-checkpoint.md, CKPT-19, CKPT-20): what it writes is
read by our tools to the values it was given; a model with its optimizer state saved on one
mesh loads on another to the saved values bit for bit; a damaged checkpoint is refused on
every rank; extra state comes back; which torch releases it runs on is decided by number.

Answered by the peers (``SHARDSPEC_IMPL=bytecheckpoint``, ``nox -s peers_bytecheckpoint``);
shardspec and torch have no checkpoint API of their own beyond DCP, whose round trips are
``test_checkpoint.py`` and ``test_checkpoint_load.py``, so they report these unsupported."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings, strategies as st
from packaging.version import Version

from conformance.assertions import assert_equal, assert_tensor_bitwise, describe_layout
from conformance.cases import case
from conformance.codec import layout_from_json, layout_to_json
from conformance.impls import Impl
from conformance.strategies import (
    dtypes,
    factorizations,
    placement_lists,
    shapes,
    tensors,
    valid_layouts,
    world_sizes,
)
from shardspec.checkpoint.chunks import storable
from shardspec.metadata import Layout, Shard
from shardspec.testing import device_type

CPU_ONLY = pytest.mark.skipif(
    device_type() != "cpu",
    reason="the model runs build CPU meshes on fresh gloo ranks whatever the suite's backend",
)

# (saved under, on mesh) -> (loaded under, on mesh): fewer ranks, HSDP, no sharding, more
# ranks (the last of the 3 output rows then has an empty shard), FSDP1 to one rank, and a
# replicated (HSDP) save
MODEL_CASES = [
    ({"kind": "fsdp2", "mesh": [2]}, {"kind": "fsdp2", "mesh": [1]}),
    ({"kind": "fsdp2", "mesh": [2]}, {"kind": "fsdp2", "mesh": [2, 1]}),
    ({"kind": "fsdp2", "mesh": [2]}, {"kind": "plain", "mesh": [1]}),
    ({"kind": "fsdp2", "mesh": [2]}, {"kind": "fsdp2", "mesh": [4]}),
    ({"kind": "fsdp1", "mesh": [2]}, {"kind": "fsdp1", "mesh": [1]}),
    # HSDP (replicate 2 x shard 1): every value saved by both ranks, written once
    ({"kind": "fsdp2", "mesh": [2, 1]}, {"kind": "fsdp2", "mesh": [2]}),
]


def _describe(c: dict[str, Any]) -> str:
    return f"{c['kind']} on mesh {tuple(c['mesh'])}"


@pytest.mark.rule("CKPT-20", "CONF-1")
@CPU_ONLY
@pytest.mark.parametrize(
    ("save", "load"),
    MODEL_CASES,
    ids=[f"{s['kind']}{s['mesh']}-{d['kind']}{d['mesh']}" for s, d in MODEL_CASES],
)
def test_a_model_and_its_optimizer_state_load_on_another_mesh(
    impl: Impl, save: dict[str, Any], load: dict[str, Any]
) -> None:
    ex = (
        f"the uneven MLP after one Adam step saved under {_describe(save)}, loaded under "
        f"{_describe(load)}"
    )
    with case():
        results = impl.checkpoint_model_round_trip(save, load, ex)["load"]
        problems = [f"rank {r}: {p}" for r, ps in sorted(results.items()) for p in ps]
        assert not problems, f"loaded values differ from the saved ones [{ex}]:\n" + "\n".join(
            problems
        )


def _save_changes(impl: Impl, kind: str) -> None:
    save, load = next((s, d) for s, d in MODEL_CASES if s["kind"] == kind)
    ex = f"the uneven MLP after one Adam step saved under {_describe(save)}"
    with case():
        results = impl.checkpoint_model_round_trip(save, load, ex)["save"]
        problems = [f"rank {r}: {p}" for r, ps in sorted(results.items()) for p in ps]
        assert not problems, f"full state dicts after the save differ [{ex}]:\n" + "\n".join(
            problems
        )


@pytest.mark.rule("CKPT-20")
@CPU_ONLY
def test_an_fsdp2_save_leaves_the_full_state_dicts_as_they_were(impl: Impl) -> None:
    _save_changes(impl, "fsdp2")


@pytest.mark.rule("CKPT-20")
@CPU_ONLY
@pytest.mark.known_defect(
    "bytecheckpoint",
    "after its FSDP1 save (framework 'fsdp', SHARDED_STATE_DICT with offload_to_cpu), DCP's "
    "full optimizer state dict of the same FSDP1 model reads each parameter's exp_avg_sq as "
    "its exp_avg; the optimizer's own state and the checkpoint are right (repro "
    "bytecheckpoint-fsdp1-save-breaks-full-optim-state-dict)",
    raises=AssertionError,
    match=r"^full state dicts after the save differ[^\n]*(\n *rank \d: [\w.]+\.exp_avg: the "
    r"full state dict reads other values after the save)+\n *assert not",
)
def test_an_fsdp1_save_leaves_the_full_state_dicts_as_they_were(impl: Impl) -> None:
    _save_changes(impl, "fsdp1")


def _damaged(impl: Impl, pools: Any, damage: str) -> None:
    ex = f"a float32 (7,) saved on 2 ranks (4/3), {damage}, loaded on 2 ranks as Shard(0)"
    with case():
        got = impl.checkpoint_damaged_load(pools(2), pools(2), damage, ex)
        for r, verdict in sorted(got.items()):
            if not verdict.startswith("refused"):
                raise AssertionError(f"rank{r}.load={verdict!r}, but should be refused [{ex}]")


@pytest.mark.rule("CKPT-20", "CKPT-16")
@pytest.mark.pool
def test_a_checkpoint_without_its_metadata_is_refused_on_every_rank(impl: Impl, pools: Any) -> None:
    _damaged(impl, pools, "no .metadata")


@pytest.mark.rule("CKPT-20", "CKPT-16")
@pytest.mark.pool
@pytest.mark.known_defect(
    "bytecheckpoint",
    "a rank whose data file is missing raises, and the ranks that need no byte of it wait in "
    "the load's closing dist.barrier() until the process group's timeout (repro "
    "bytecheckpoint-missing-file-leaves-ranks-waiting)",
    raises=AssertionError,
    match=r"^rank\d\.load='left waiting', but should be refused",
)
def test_a_checkpoint_missing_a_data_file_is_refused_on_every_rank(impl: Impl, pools: Any) -> None:
    _damaged(impl, pools, "missing data file")


@pytest.mark.rule("CKPT-20", "CKPT-16")
@pytest.mark.pool
@pytest.mark.known_defect(
    "bytecheckpoint",
    "a chunk whose bytes the file lacks loads without an error: the load reads what is left "
    "of the range and builds the tensor on that short buffer, so the missing elements hold "
    "whatever the storage holds (repro bytecheckpoint-truncated-file-loads-silently)",
    raises=AssertionError,
    match=r"^rank\d\.load='loaded', but should be refused",
)
def test_a_truncated_data_file_is_refused_on_every_rank(impl: Impl, pools: Any) -> None:
    _damaged(impl, pools, "truncated data file")


@pytest.mark.rule("CKPT-20")
@pytest.mark.known_defect(
    "bytecheckpoint",
    "extra_state is saved with torch.save(pickle_protocol=4) and loaded with torch.load's "
    "default, which since torch 2.6 is weights_only=True, whose unpickler rejects protocol "
    "4's FRAME opcode ('Unsupported operand 149'): no extra_state loads back unless "
    "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 (repro bytecheckpoint-extra-state-weights-only)",
    raises=AssertionError,
    match=r"^extra_state=.*Weights only load failed",
)
def test_extra_state_loads_back(impl: Impl) -> None:
    ex = "extra_state {'step': 3, 'torch_rng': Generator().manual_seed(0).get_state()}, 1 rank"
    with case():
        got = impl.checkpoint_extra_state(ex)
        assert got.get("loaded") is True, f"extra_state={got}, but should load back equal [{ex}]"


def _release(parts: tuple[int, int, int]) -> str:
    return ".".join(map(str, parts))


@pytest.mark.rule("CKPT-20")
@pytest.mark.known_defect(
    "bytecheckpoint",
    "its torch check compares torch.__version__ as a string ('2.1.0' <= v < '2.6.0'): 2.10 "
    "and later sort before '2.6.0' and pass, although its stated range is 2.1 to 2.5 (it pins "
    "torch<=2.5.0); 2.6 to 2.9 are refused, as that range says (repro "
    "bytecheckpoint-torch-version-string-compare)",
    raises=AssertionError,
    match=r"^accepts_torch\(2\.\d\d+\.\d+\)=True, but should be False",
)
@settings(max_examples=30)
@given(st.tuples(st.integers(2, 3), st.integers(0, 20), st.integers(0, 3)))
@example((2, 10, 0))
def test_the_torch_release_check_goes_by_number(impl: Impl, parts: tuple[int, int, int]) -> None:
    release = _release(parts)
    with case():
        got = impl.checkpoint_accepts_torch(release)
        want = Version("2.1") <= Version(release) < Version("2.6")
        assert_equal(f"accepts_torch({release})", got, want, "its stated range 2.1 to 2.5")


@st.composite
def written(draw: st.DrawFn) -> dict[str, Any]:
    world = draw(world_sizes())
    shape = draw(shapes(min_dims=1, max_dims=3, max_side=6))
    layout = draw(valid_layouts(st.just(shape), replicas=False))
    return {
        "world": world,
        "layout": _savable(layout, world),
        "tensor": draw(tensors(shape, dtypes())),
    }


def _savable(layout: Layout, world: int) -> Layout:
    """``layout`` on ``world`` ranks, each box once, without the empty chunks that start where
    another chunk does: those fail the save or lose a chunk's data (CKPT-1; the known defect
    of test_checkpoint.py's round trips, repro bytecheckpoint-empty-chunk-at-another-chunks-
    offset), so the drawn checks here reach everything else."""
    layout = Layout(layout.shape, [Shard(s.box, s.rank % world) for s in layout.shards])
    first = {s.box: s for s in reversed(layout.shards)}
    return storable(Layout(layout.shape, [s for s in layout.shards if first[s.box] is s]))


@st.composite
def own_round_trips(draw: st.DrawFn) -> dict[str, Any]:
    """A savable layout (uneven, 1-3 dims, several chunks a rank, ranks holding nothing, every
    dtype) saved on one world size and loaded on another, as a ShardedTensor or as a DTensor on
    a mesh of the load world (up to 3-D, nested and uneven Shard, Replicate)."""
    save_world, load_world = draw(world_sizes()), draw(world_sizes())
    shape = draw(shapes(min_dims=1, max_dims=3, max_side=6))
    saved = _savable(draw(valid_layouts(st.just(shape), replicas=False)), save_world)
    if draw(st.booleans()):
        dst = _savable(draw(valid_layouts(st.just(shape), replicas=False)), load_world)
        load: dict[str, Any] = {"kind": "sharded", "layout": layout_to_json(dst)}
    else:
        mesh = draw(factorizations(load_world, max_dims=3))
        placements = draw(placement_lists(len(shape), len(mesh)))
        placements = [["S", p[1] % len(shape)] if p[0] != "R" else p for p in placements]
        load = {"kind": "dtensor", "mesh": list(mesh), "placements": placements}
    return {"save_world": save_world, "load_world": load_world, "saved": saved, "load": load,
            "tensor": draw(tensors(shape, dtypes()))}  # fmt: skip


@pytest.mark.rule("CKPT-20", "CONF-1")
@pytest.mark.pool
@settings(max_examples=20)
@given(own_round_trips())
def test_a_savable_checkpoint_loads_on_another_world_through_its_own_load(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    """test_checkpoint.py's round trip, through the implementation's own save and load, on
    the layouts its known defect leaves out: the drawn examples there stop at that defect's
    explicit example."""
    from conformance import reference

    saved, load, t = c["saved"], c["load"], c["tensor"]
    ex = f"saved on {c['save_world']} ranks: {describe_layout(saved)}, dtype={t.dtype}; {load}"
    with case():
        results = impl.checkpoint_round_trip(
            pools(c["save_world"]), pools(c["load_world"]), saved, t, load, ex
        )
        for r in results:
            if load["kind"] == "sharded":
                boxes = layout_from_json(load["layout"]).boxes_of(r.rank)
                assert_equal(f"rank{r.rank}.local shards", len(r.tensors), len(boxes), ex)
                for i, (got, b) in enumerate(zip(r.tensors, boxes)):
                    want = t[b.slices()].contiguous()
                    assert_tensor_bitwise(f"rank{r.rank}.loaded[{i}] {b}", got, want, ex)
                continue
            mesh = tuple(load["mesh"])
            coord = reference.mesh_coordinates(mesh)[r.rank]
            want = reference.gather(
                t, reference.dtensor_indices(t.shape, mesh, load["placements"], coord)
            )
            assert_tensor_bitwise(f"rank{r.rank}.loaded DTensor at {coord}", r.tensors[0], want, ex)


@pytest.mark.rule("CKPT-19", "CONF-1")
@pytest.mark.pool
@settings(max_examples=15)
@given(written())
def test_what_it_writes_our_tools_inspect_verify_and_load(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    from shardspec.checkpoint.dcp_metadata import read_metadata
    from shardspec.checkpoint.report import tensor_reports
    from shardspec.checkpoint.saved_chunks import check_files, read_saved_chunk

    layout, t = c["layout"], c["tensor"]
    ex = f"saved on {c['world']} ranks: {describe_layout(layout)}, dtype={t.dtype}"
    with case(), tempfile.TemporaryDirectory(prefix="shardspec-written-") as tmp:
        root = Path(impl.checkpoint_written(pools(c["world"]), layout, t, tmp, ex))
        md = read_metadata(root)
        (report,) = [r for r in tensor_reports(md) if r.fqn == "t"]
        assert report.error is None, f"inspect's verdict={report.error} [{ex}]"
        assert_equal("inspect.shape", report.shape, tuple(t.shape), ex)
        assert_equal("inspect.dtype", report.dtype, str(t.dtype).removeprefix("torch."), ex)
        files, unlisted = check_files(root, [report], [])
        assert all(f.ok for f in files) and not unlisted, f"files={files} [{ex}]"
        for i, chunk in enumerate(report.chunks):
            got = read_saved_chunk(root, report, i)
            assert_tensor_bitwise(f"verify.chunk[{i}] {chunk.box}", got, t[chunk.box.slices()], ex)
        _load_whole(root, t, ex)


def _load_whole(root: Path, t: Any, ex: str) -> None:
    """Our ``FileSystemReader`` and ``LoadPlanner`` (one process) into the whole tensor."""
    import warnings

    import torch.distributed.checkpoint as dcp

    from shardspec.checkpoint.dcp import FileSystemReader, LoadPlanner

    for whole in (1 << 18, 0):
        out = torch.full_like(t, 1) if t.dtype != torch.bool else torch.zeros_like(t)
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(
                {"t": out},
                storage_reader=FileSystemReader(root, whole_item_bytes=whole),
                planner=LoadPlanner(),
                no_dist=True,
            )
        assert_tensor_bitwise(f"FileSystemReader(whole_item_bytes={whole}).t", out, t, ex)


@pytest.mark.rule("CKPT-19", "CONF-1")
def test_the_committed_checkpoint_is_what_it_writes(impl: Impl) -> None:
    """packages/checkpoint/tests/data holds a small checkpoint the implementation wrote; a
    fresh one from the same generator holds the same values (so the package tests, which read
    it without the implementation, test what it really writes)."""
    from shardspec.checkpoint.cli import main

    with case(), tempfile.TemporaryDirectory(prefix="shardspec-fresh-") as tmp:
        fresh, committed = impl.write_test_checkpoint(str(Path(tmp) / "fresh"))
        for part in ("model", "optimizer"):
            rc = main(["diff", str(Path(committed) / part), str(Path(fresh) / part), "--values"])
            assert_equal(f"diff --values {part} (exit status)", rc, 0, f"{committed} vs {fresh}")
