"""shardspec's DCP ``FileSystemReader`` on real gloo ranks (spec/09-checkpoint.md, CKPT-13 to
CKPT-16): checkpoints written by a real ``dcp.save`` on 4 or 2 ranks, in drawn layouts
(uneven, empty chunks, grids, several chunks per rank, every dtype), loaded by a real
``dcp.load`` on 2 or 4 ranks into other drawn layouts with our reader + planner and with
DCP's default reader + planner: both must load the same bits, which are the reference slices
of the saved tensor; our reader reads no byte twice and holds at most one saved chunk per
thread. Damaged checkpoints fail on every rank, naming file, tensor and chunk; what the reader
cannot read in place goes through DCP's own path."""

from __future__ import annotations

import io
import itertools
import os
from pathlib import Path
from typing import Any

import pytest
from dcp_reader_cases import load_both, load_expecting_error, load_gzip, save_sharded
from hypothesis import HealthCheck, example, given, settings, strategies as st
from hypothesis.errors import UnsatisfiedAssumption

from shardspec.checkpoint.chunks import storable
from shardspec.metadata import Box, Layout, Shard, chunk_layout
from shardspec.metadata.strategies import shapes, valid_layouts
from shardspec.reshard.reference import same_bits
from shardspec.testing import RankPool, get_pool
from shardspec.testing.tensors import random_tensor

torch = pytest.importorskip("torch")

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "int64", "uint8", "bool",
          "complex64"]  # fmt: skip


@pytest.fixture
def pools() -> dict[int, RankPool]:
    return {w: get_pool(w, timeout=180) for w in (4, 2)}


def _fold(layout: Layout, world: int) -> Layout:
    """``layout`` on ``range(world)`` (a rank may get several shards), each box once, and one
    empty box per offset: DCP files chunks by offset, and torch's ShardedTensor refuses two
    empty boxes at one offset as an overlap (repro validation-identical-empty-boxes-need-a-
    third), so neither can hold more."""
    seen: set[Box] = set()
    empty_at: set[tuple[int, ...]] = set()
    shards = []
    for s in layout.shards:
        if s.box in seen or (s.box.is_empty and tuple(s.box.offsets) in empty_at):
            continue
        seen.add(s.box)
        if s.box.is_empty:
            empty_at.add(tuple(s.box.offsets))
        shards.append(Shard(s.box, s.rank % world))
    return storable(Layout(layout.shape, shards))


def _torch_holds(layout: Layout) -> bool:
    from shardspec.metadata import ConversionError
    from shardspec.reshard.frontends import _check_torch_holds

    try:
        _check_torch_holds(layout, torch.float32)
    except ConversionError:
        return False
    return True


def _torch_storable(layout: Layout) -> Layout:
    """``layout`` without the empty boxes torch's ShardedTensor calls an overlap (its check
    compares boxes only along the dims where they differ, so an empty box inside another
    one's span there collides: repro validation-empty-shard-inside-another). An empty box
    holds nothing, so what is left is the same valid layout as far as data goes; the saved
    side is built as a ShardedTensor, which refused 0.3% of the draws (a random failure), and
    the destination's assume threw as many away."""
    kept = [s for s in layout.shards if not s.box.is_empty]
    for s in layout.shards:
        if s.box.is_empty and _torch_holds(Layout(layout.shape, [*kept, s])):
            kept.append(s)
    keep = set(map(id, kept))
    return Layout(layout.shape, [s for s in layout.shards if id(s) in keep])


@st.composite
def reader_cases(draw: st.DrawFn) -> dict[str, Any]:
    shape = draw(shapes(max_dims=3, max_side=7))
    save_world, load_world = draw(st.sampled_from([4, 2])), draw(st.sampled_from([2, 4]))
    saved = _torch_storable(_fold(draw(valid_layouts(st.just(shape), replicas=False)), save_world))
    if shape and draw(st.booleans()):
        nd = draw(st.sampled_from([1, 2] if load_world == 4 else [1]))
        mesh = (load_world,) if nd == 1 else (2, 2)
        pl = [
            ("R",) if draw(st.booleans()) else ("S", draw(st.integers(0, len(shape) - 1)))
            for _ in mesh
        ]
        how: tuple[Any, ...] = ("dt", mesh, pl)
    else:
        dst = _fold(draw(valid_layouts(st.just(shape), replicas=False)), load_world)
        how = ("st", _torch_storable(dst))
    return {
        "shape": shape,
        "dtype": draw(st.sampled_from(DTYPES)),
        "seed": draw(st.integers(0, 2**16)),
        "save_world": save_world,
        "load_world": load_world,
        "saved": saved,
        "how": how,
        # 0: every chunk goes through the partial-read path; the default reads small ones whole
        "reader": {
            "whole_item_bytes": draw(st.sampled_from([0, 1 << 18])),
            "thread_count": draw(st.sampled_from([1, 3])),
            # 1: a thread per byte, so that small test files use the pool too
            "bytes_per_thread": draw(st.sampled_from([1, 2**24])),
        },
    }


# Three rows of a chunk of 12 rows read into a ShardedTensor's shard, and into a DTensor that
# cuts the columns (destination views not contiguous: the buffered path).
ROWS = {
    "shape": (12, 5),
    "dtype": "float32",
    "seed": 1,
    "save_world": 2,
    "load_world": 4,
    "saved": chunk_layout((12, 5), 0, [0, 1]),
    "how": ("st", Layout((12, 5), [Shard(Box((4 * r, 0), (4, 5)), r) for r in range(3)]
                         + [Shard(Box((12, 0), (0, 5)), 3)])),
    "reader": {"whole_item_bytes": 0, "thread_count": 1},
}  # fmt: skip
COLS = {**ROWS, "how": ("dt", (2, 2), [("S", 1), ("S", 0)]), "dtype": "bfloat16"}


def test_reader_cases_draw_nothing_torch_refuses() -> None:
    """Meta: 200 draws, none thrown away, both ShardedTensor layouts (the saved one, and the
    destination when it is one) held by torch and valid, empty boxes still among them."""
    empties = 0

    @settings(max_examples=200, database=None, deadline=None)
    @given(st.data())
    def prop(data: st.DataObject) -> None:
        nonlocal empties
        try:
            c = data.draw(reader_cases())
        except UnsatisfiedAssumption:
            raise AssertionError("reader_cases threw a draw away") from None
        layouts = [c["saved"]] + ([c["how"][1]] if c["how"][0] == "st" else [])
        for layout in layouts:
            assert layout.is_valid() and _torch_holds(layout), layout
            empties += any(s.box.is_empty for s in layout.shards)

    prop()
    assert empties, "no empty box in 200 draws"
    # A drawn saved layout torch refused: rows 4-6 of an empty (0, 6) tensor inside rows 0-6.
    refused = Layout(
        (0, 6),
        [
            Shard(Box((0, 4), (0, 2)), 0),
            Shard(Box((0, 0), (0, 6)), 1),
            Shard(Box((0, 6), (0, 0)), 1),
        ],
    )
    assert not _torch_holds(refused)
    fixed = _torch_storable(refused)
    assert fixed.is_valid() and _torch_holds(fixed) and set(fixed.shards) < set(refused.shards)


@pytest.mark.rule("CKPT-13", "CKPT-14", "CKPT-15")
@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reader_cases())
@example(ROWS)
@example(COLS)
def test_reader_loads_the_bits_dcp_loads(
    pools: dict[int, RankPool], tmp_path_factory: pytest.TempPathFactory, c: dict[str, Any]
) -> None:
    path = str(tmp_path_factory.mktemp("ckpt"))
    full = random_tensor(c["shape"], getattr(torch, c["dtype"]), c["seed"])
    pools[c["save_world"]].call(save_sharded, path, full, c["saved"])
    results = pools[c["load_world"]].call(load_both, path, full, c["how"], c["reader"])
    ex = f"saved {c['saved']}, loaded as {c['how']}, {c['dtype']}, reader {c['reader']}"
    chunk_bytes = _largest_chunk_bytes(path)
    for rank, r in enumerate(results):
        assert len(r["ours"]) == len(r["want"]) == len(r["dcp"]), ex
        for i, (o, d, w) in enumerate(zip(r["ours"], r["dcp"], r["want"])):
            assert same_bits(d, w), f"rank {rank} [{i}]: DCP's reader differs from the slice; {ex}"
            assert same_bits(o, w), f"rank {rank} [{i}]: ours differs from DCP's; {ex}"
        # The non-tensor value (a BYTE_IO item) took DCP's own path.
        assert r["extra"] == {"step": 7} and r["extra_fallback_items"] == 1, ex
        # CKPT-13: no byte of any file read twice by one rank in one load.
        spans = sorted(r["ranges"])
        for (f1, _, e1), (f2, s2, _) in itertools.pairwise(spans):
            assert f1 != f2 or s2 >= e1, f"rank {rank} read bytes twice: {spans}; {ex}"
        # CKPT-15: at most one saved chunk of buffer per reading thread, and one thread per
        # bytes_per_thread to read (these files are far below 16 MiB).
        assert r["buffer_peak"] <= r["threads"] * chunk_bytes, (r, chunk_bytes, ex)
        if c["reader"].get("bytes_per_thread", 2**24) >= 2**24:
            assert r["threads"] <= 1, (r["threads"], ex)
        # CKPT-18: in both loads the read items stayed on the rank; DCP's plan exchange
        # carried none.
        assert len(r["sent_items"]) == 2 and not any(r["sent_items"]), (r["sent_items"], ex)


def _storage_of(path: str, fqn: str, offsets: tuple[int, ...]) -> Any:
    from shardspec.checkpoint.dcp_metadata import read_metadata

    md = read_metadata(path)
    return next(
        v for k, v in md.storage_data.items() if k.fqn == fqn and tuple(k.offset or ()) == offsets
    )


def _largest_chunk_bytes(path: str) -> int:
    from shardspec.checkpoint.dcp_metadata import read_metadata

    md = read_metadata(path)
    return max((s.length for s in md.storage_data.values()), default=0)


@pytest.mark.rule("CKPT-14", "CKPT-15")
def test_a_few_rows_of_a_large_chunk_read_only_those_rows(
    pools: dict[int, RankPool], tmp_path: Path
) -> None:
    # 4,000 rows of 64 float32 (1 MB) saved on 2 ranks; 4 ranks load rows [0, 3), [3, 2000),
    # [2000, 2003), [2003, 4000): ranks 0 and 2 need 3 rows (768 bytes) of a 512 KB chunk.
    shape = (4000, 64)
    full = random_tensor(shape, torch.float32, 5)
    pools[2].call(save_sharded, str(tmp_path), full, chunk_layout(shape, 0, [0, 1]))
    cuts = [0, 3, 2000, 2003, 4000]
    dst = Layout(
        shape,
        [Shard(Box((a, 0), (b - a, 64)), r) for r, (a, b) in enumerate(itertools.pairwise(cuts))],
    )
    results = pools[4].call(load_both, str(tmp_path), full, ("st", dst), {})
    for rank in (0, 2):
        r = results[rank]
        assert same_bits(r["ours"][0], r["want"][0])
        read = sum(e - s for _, s, e in r["ranges"])
        # The rows themselves (3 * 64 * 4 bytes), read straight into the destination, plus
        # the archive's directory, pickle and entry headers (a few KiB): never the chunk.
        assert 3 * 64 * 4 <= read <= 3 * 64 * 4 + 8192, (rank, r["ranges"])
        assert r["buffer_peak"] == 0, r["buffer_peak"]  # nothing staged: read in place


@pytest.mark.rule("CKPT-16")
@pytest.mark.parametrize("damage", ["missing", "truncated", "wrong-shape", "not-a-tensor"])
def test_a_damaged_checkpoint_fails_on_every_rank_naming_file_tensor_and_chunk(
    pools: dict[int, RankPool], tmp_path: Path, damage: str
) -> None:
    shape = (8, 3)
    full = random_tensor(shape, torch.int32, 2)
    pools[4].call(save_sharded, str(tmp_path), full, chunk_layout(shape, 0, [0, 1, 2, 3]))
    info = _storage_of(str(tmp_path), "t", (4, 0))  # rank 2 wrote rows [4, 6)
    victim = tmp_path / info.relative_path
    assert victim.name == "__2_0.distcp"
    if damage == "missing":
        victim.unlink()
        what = "cannot open the file"
    elif damage == "truncated":
        os.truncate(victim, info.offset + info.length - 100)
        what = "truncated"
    else:
        # Another archive in the chunk's place, padded to length: a (1, 3) int32 tensor, or
        # no tensor at all (which DCP's own reader, tried next, fails on deep inside).
        buf = io.BytesIO()
        if damage == "wrong-shape":
            torch.save(torch.zeros((1, 3), dtype=torch.int32), buf)
            what = "tensor of size (1, 3), the metadata says torch.int32 of size (2, 3)"
        else:
            torch.save({"step": 3}, buf)
            what = "the item holds a dict, not a tensor"
        assert len(buf.getvalue()) <= info.length
        with open(victim, "r+b") as f:
            f.seek(info.offset)
            f.write(buf.getvalue().ljust(info.length, b"\0"))
    # Rank 0 of 2 needs rows [0, 4) only, rank 1 rows [4, 8): both must fail.
    answers = pools[2].call(
        load_expecting_error, str(tmp_path), full, ("st", chunk_layout(shape, 0, [0, 1]))
    )
    for a in answers:
        assert "CheckpointException" in a, a
        assert "__2_0.distcp" in a and "tensor 't'" in a and "(4, 0)" in a, a
        assert what in a, a
        # read_error() digs our error out of DCP's BaseException, on every rank
        ours = a.split("\nread_error: ", 1)[1]
        assert "__2_0.distcp" in ours and what in ours, a


@pytest.mark.rule("CKPT-13")
def test_what_the_reader_cannot_read_in_place_goes_through_dcp(
    pools: dict[int, RankPool], tmp_path: Path
) -> None:
    shape = (9, 4)
    full = random_tensor(shape, torch.float64, 3)
    pools[4].call(save_sharded, str(tmp_path), full, chunk_layout(shape, 1, [0, 1, 2, 3]), True)
    how = ("st", chunk_layout(shape, 0, [1, 0]))
    for r in pools[2].call(load_gzip, str(tmp_path), full, how):
        assert all(same_bits(g, w) for g, w in zip(r["got"], r["want"])), r
        # Every read item of a gzipped chunk took DCP's path; none was read in place.
        assert r["fallback_items"] == 4 and r["items"] == 0, r


@pytest.mark.rule("CKPT-13", "CKPT-14")
@pytest.mark.parametrize("whole", [0, 1 << 18], ids=["by-parts", "whole"])
def test_no_dist_load_with_the_default_planner(tmp_path: Path, whole: int) -> None:
    """One process (``no_dist=True``) and DCP's ``DefaultLoadPlanner``: plain tensors of
    every kind, a transposed one (saved with its strides), a 0-d and an empty one, and a
    non-tensor value, into destinations of which some are views with other strides."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner

    from shardspec.checkpoint.dcp import FileSystemReader

    sd = {
        name: random_tensor(shape, getattr(torch, dt), i)
        for i, (name, shape, dt) in enumerate(
            [("f", (7, 5), "float32"), ("b", (3, 4), "bool"), ("c", (6,), "complex64"),
             ("h", (2, 3, 4), "bfloat16"), ("s", (), "float64"), ("e", (0, 3), "int16")]
        )
    }  # fmt: skip
    sd["t"] = random_tensor((4, 6), torch.int32, 9).t()  # strides (1, 6)
    sd["obj"] = {"k": [1, 2]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(sd, checkpoint_id=tmp_path, no_dist=True)
        out: dict[str, Any] = {k: torch.ones_like(v) for k, v in sd.items() if k != "obj"}
        out["t"] = torch.ones(4, 6, dtype=torch.int32).t()  # a non-contiguous destination
        out["obj"] = {"k": []}
        reader = FileSystemReader(tmp_path, whole_item_bytes=whole, trace_reads=True)
        dcp.load(out, storage_reader=reader, planner=DefaultLoadPlanner(), no_dist=True)
    for k, v in sd.items():
        if k != "obj":
            assert same_bits(out[k], v), k
    assert out["obj"] == {"k": [1, 2]}
    # The object went through DCP's path; the empty tensor has no read item, the others one.
    assert reader.stats.fallback_items == 1 and reader.stats.items == 6


def _save_small(path: Path) -> dict[str, Any]:
    import warnings

    import torch.distributed.checkpoint as dcp

    sd = {f"w{i}": random_tensor((5, 3), torch.float32, i) for i in range(3)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(sd, checkpoint_id=path, no_dist=True)
    return sd


def _load_counting(path: Path, planner: Any) -> tuple[dict[str, Any], list[int], int]:
    """Load ``path`` with our reader and ``planner`` in one process: the values, the read
    items of each plan the global step saw, and the read items the reader filled."""
    import warnings

    import torch.distributed.checkpoint as dcp

    from shardspec.checkpoint.dcp import FileSystemReader

    seen: list[int] = []
    global_step = planner.create_global_plan

    def spy(plans: list[Any]) -> list[Any]:
        seen.extend(len(p.items) for p in plans)
        return global_step(plans)

    planner.create_global_plan = spy  # on the instance: the class's method stays as it is
    out = {f"w{i}": torch.zeros(5, 3) for i in range(3)}
    reader = FileSystemReader(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(out, storage_reader=reader, planner=planner, no_dist=True)
    return out, seen, reader.stats.items


@pytest.mark.rule("CKPT-18")
def test_our_planner_and_reader_keep_the_read_items_on_the_rank(tmp_path: Path) -> None:
    """With our LoadPlanner the global step sees plans without items, read_data gets them
    all back, and the values are the saved ones."""
    from shardspec.checkpoint.dcp import LoadPlanner

    sd = _save_small(tmp_path)
    out, seen, read = _load_counting(tmp_path, LoadPlanner())
    assert seen == [0] and read == 3, (seen, read)
    for k, v in sd.items():
        assert same_bits(out[k], v), k


@pytest.mark.rule("CKPT-18")
def test_a_planner_with_its_own_global_step_gets_every_read_item(tmp_path: Path) -> None:
    """A planner whose global step may look at the items (DCP's default, a subclass of ours
    that overrides create_global_plan) sees them all, as DCP sends them."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    from shardspec.checkpoint.dcp import LoadPlanner

    class Custom(LoadPlanner):  # type: ignore[misc]
        def create_global_plan(self, plans: list[Any]) -> list[Any]:
            return list(plans)

    sd = _save_small(tmp_path)
    for planner in (DefaultLoadPlanner(), Custom()):
        out, seen, read = _load_counting(tmp_path, planner)
        assert seen == [3] and read == 3, (type(planner).__name__, seen, read)
        for k, v in sd.items():
            assert same_bits(out[k], v), (type(planner).__name__, k)


@pytest.mark.rule("CKPT-18")
def test_a_kept_plan_read_without_its_items_is_an_error(tmp_path: Path) -> None:
    """read_data given a plan whose items stayed on another reader (or another load) raises,
    naming what is missing, instead of loading nothing."""
    from torch.distributed.checkpoint.planner import LoadPlan

    from shardspec.checkpoint.dcp import FileSystemReader, LoadPlanner
    from shardspec.checkpoint.dcp_reader import PLAN_STAYS_LOCAL, CheckpointReadError

    _save_small(tmp_path)

    keeper, other = FileSystemReader(tmp_path), FileSystemReader(tmp_path)
    kept = keeper.prepare_local_plan(LoadPlan([], planner_data=PLAN_STAYS_LOCAL))
    with pytest.raises(CheckpointReadError, match="without the read items this rank kept"):
        other.read_data(kept, LoadPlanner())


@pytest.mark.rule("CKPT-24", "CKPT-26")
def test_rows_of_a_chunk_mapped_in_place_hold_its_bytes_or_fail_naming_the_file(
    tmp_path: Path,
) -> None:
    """``map_rows`` (how reads="once" holds a large run): a row run of a saved chunk, as a
    tensor over the file's pages, the bytes counted; None for a box that is no dense range
    and for a value; a truncated file raises naming the file, the tensor and the chunk."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import MetadataIndex

    from shardspec.checkpoint.dcp import FileSystemReader
    from shardspec.checkpoint.dcp_reader import CheckpointReadError

    sd: dict[str, Any] = {"w": random_tensor((96, 40), torch.float32, 3), "obj": {"k": 1}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(sd, checkpoint_id=tmp_path, no_dist=True)
    reader = FileSystemReader(tmp_path)
    reader.set_up_storage_reader(reader.read_metadata(), True)
    index = MetadataIndex("w", (0, 0), 0)
    got = reader.map_rows(index, (10, 0), (50, 40))
    assert got is not None
    rows, nread, ranges = got
    assert same_bits(rows, sd["w"][10:60])
    # the header's reads and the 50 rows, every range counted
    assert nread == sum(b - a for _, a, b in ranges) > 50 * 40 * 4
    assert ranges[-1][2] - ranges[-1][1] == 50 * 40 * 4
    assert reader.map_rows(index, (10, 0), (50, 20)) is None  # columns: no dense range
    assert reader.map_rows(MetadataIndex("obj"), (), ()) is None  # a value is no tensor
    del rows, got  # the mapping goes with its tensor
    data = next(p for p in tmp_path.iterdir() if p.suffix == ".distcp")
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    with pytest.raises(CheckpointReadError, match=rf"{data.name}: tensor 'w' chunk at offsets "
                       r"\(0, 0\): the file is truncated"):  # fmt: skip
        reader.map_rows(index, (10, 0), (50, 40))
