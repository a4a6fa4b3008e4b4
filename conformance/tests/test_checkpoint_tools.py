"""The checkpoint command's tools on real checkpoints (spec/09-checkpoint.md): a checkpoint
saved on one world size and rewritten offline by ``shardspec reshard`` into another job's
chunk layout holds exactly the target's boxes, each in the file of its lowest rank, and loads
with plain ``dcp.load`` (DCP's own planner and reader) on the target world to the reference
slices, bit for bit (CKPT-17); ``shardspec diff A B --values`` of two checkpoints of one
tensor in two chunk layouts that cross reports exactly the elements whose values differ, with
the global index and both values, and exits 1 exactly when anything differs (CKPT-10,
CKPT-7). Both are compared with the global tensors, materialised."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings

from conformance import reference
from conformance.assertions import assert_equal, assert_tensor_bitwise, describe_layout
from conformance.cases import case
from conformance.codec import placement_repr
from conformance.impls import Impl
from conformance.strategies.checkpoint import changed, diff_cases, offline_cases
from shardspec.metadata import Box, Layout, Shard


def _bits(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 7) -> torch.Tensor:
    """Arbitrary bits of ``dtype`` (NaN payloads, infinities, -0.0 among them)."""
    gen = torch.Generator().manual_seed(seed)
    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n,), generator=gen, dtype=torch.uint8)
    if dtype == torch.bool:
        return (raw[: math.prod(shape)] & 1).bool().reshape(shape)
    return raw.view(dtype).reshape(shape)


def _layout(shape: tuple[int, ...], *cells: tuple[tuple[int, ...], tuple[int, ...], int]) -> Layout:
    return Layout(shape, [Shard(Box(o, s), r) for o, s, r in cells])


# Rows saved on 2 ranks, columns loaded on 3: every target chunk is filled from 3 saved chunks.
ROWS = _layout((6, 5), ((0, 0), (2, 5), 0), ((2, 0), (2, 5), 1), ((4, 0), (2, 5), 0))
COLUMNS = _layout((6, 5), ((0, 0), (6, 2), 0), ((0, 2), (6, 2), 1), ((0, 4), (6, 1), 2))
ROWS_TO_COLUMNS = {
    "save_world": 2,
    "load_world": 3,
    "saved": ROWS,
    "target": {"kind": "sharded", "layout": COLUMNS},
    "how": "layouts",
    "tensor": _bits((6, 5), torch.bfloat16),
}
# One dim cut at shifted boundaries, an empty target chunk at the end, the target given by a
# checkpoint the target job saved (--like).
SHIFTED_LIKE = {
    "save_world": 2,
    "load_world": 3,
    "saved": _layout((7,), ((0,), (3,), 1), ((3,), (4,), 0)),
    "target": {
        "kind": "sharded",
        "layout": _layout((7,), ((0,), (2,), 0), ((2,), (3,), 1), ((5,), (2,), 0), ((7,), (0,), 2)),
    },
    "how": "like",
    "tensor": _bits((7,), torch.float64),
}
# Blocks saved on 3 ranks into a DTensor on a 2x2 mesh, rows uneven (5 over 2) and each box
# on two ranks (Replicate): each box is written once, to the lower rank's file.
BLOCKS_TO_DTENSOR = {
    "save_world": 3,
    "load_world": 4,
    "saved": _layout(
        (5, 6), ((0, 0), (2, 3), 2), ((0, 3), (2, 3), 0), ((2, 0), (3, 4), 1), ((2, 4), (3, 2), 2)
    ),
    "target": {"kind": "dtensor", "mesh": [2, 2], "placements": [["R"], ["S", 0]]},
    "how": "layouts",
    "tensor": _bits((5, 6), torch.int64),
}


def _describe_target(target: dict[str, Any]) -> str:
    if target["kind"] == "sharded":
        return f"ShardedTensor {describe_layout(target['layout'])}"
    pl = ", ".join(placement_repr(p) for p in target["placements"])
    return f"DTensor on mesh {tuple(target['mesh'])} [{pl}]"


def _target_boxes(target: dict[str, Any], shape: tuple[int, ...]) -> dict[Box, int]:
    """Each distinct box of the target and the lowest rank holding it: the layout's, or for
    a DTensor each mesh coordinate's chunk of every sharded dim (CHUNK-1, CHUNK-2)."""
    owner: dict[Box, int] = {}
    if target["kind"] == "sharded":
        pairs = [(s.box, s.rank) for s in target["layout"].shards]
    else:
        mesh = tuple(target["mesh"])
        pairs = []
        for rank, coord in enumerate(reference.mesh_coordinates(mesh)):
            span = [(0, n) for n in shape]
            for m, p in enumerate(target["placements"]):
                if p[0] == "S":
                    span[p[1]] = reference.chunk_intervals(shape[p[1]], mesh[m])[coord[m]]
            pairs.append((Box([a for a, _ in span], [b - a for a, b in span]), rank))
    for box, rank in pairs:
        owner[box] = min(owner.get(box, rank), rank)
    # a checkpoint holds no empty chunk where a non-empty one starts (CKPT-1)
    starts = {b.offsets for b in owner if not b.is_empty}
    return {b: r for b, r in owner.items() if not (b.is_empty and b.offsets in starts)}


@pytest.mark.rule("CKPT-17", "CONF-1")
@pytest.mark.pool
# Each example saves (twice with --like), rewrites and loads through real files: a few drawn
# examples beside the explicit ones, each of which crosses layouts.
@settings(max_examples=6, deadline=None)
@given(offline_cases())
@example(ROWS_TO_COLUMNS)
@example(SHIFTED_LIKE)
@example(BLOCKS_TO_DTENSOR)
def test_a_checkpoint_rewritten_offline_loads_with_plain_dcp_on_the_target_world(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    saved, target, t = c["saved"], c["target"], c["tensor"]
    ex = (
        f"dcp.save on {c['save_world']} ranks of ShardedTensor {describe_layout(saved)}, "
        f"shardspec reshard --{c['how']} into {_describe_target(target)} on "
        f"{c['load_world']} ranks, plain dcp.load, dtype={t.dtype}"
    )
    with case():
        facts = impl.checkpoint_offline(
            pools(c["save_world"]), pools(c["load_world"]), saved, t, target, c["how"], ex
        )
        assert_equal(
            "shardspec reshard exit status",
            facts["rc"],
            0,
            f"{ex}; stderr {facts['stderr']!r}",
            rule="CKPT-17",
        )
        want = _target_boxes(target, tuple(t.shape))
        got = facts["chunks"]
        assert_equal("rewritten chunks", sorted(b for b, _ in got), sorted(want), ex, "CKPT-17")
        if c["how"] == "like":
            files = dict(facts["like_chunks"])
        else:
            files = {b: f"__{r}_0.distcp" for b, r in want.items()}
        # DCP files a chunk by its offset: of empty chunks that share one (CKPT-1 allows
        # them) one storage entry stands for all, and which file it names holds nothing
        shared = {b.offsets for b, _ in got if sum(o.offsets == b.offsets for o, _ in got) > 1}
        for box, file in got:
            if box.offsets not in shared:
                assert_equal(f"file of rewritten chunk {box}", file, files.get(box), ex, "CKPT-17")
        for r in facts["loaded"]:
            if target["kind"] == "sharded":
                boxes = target["layout"].boxes_of(r.rank)
                assert_equal(f"rank{r.rank}.local shards", len(r.tensors), len(boxes), ex)
                for i, (tensor, b) in enumerate(zip(r.tensors, boxes)):
                    want_t = t[b.slices()].contiguous()
                    assert_tensor_bitwise(f"rank{r.rank}.loaded[{i}] {b}", tensor, want_t, ex)
                continue
            mesh = tuple(target["mesh"])
            coord = reference.mesh_coordinates(mesh)[r.rank]
            want_t = reference.gather(
                t, reference.dtensor_indices(t.shape, mesh, target["placements"], coord)
            )
            assert_tensor_bitwise(
                f"rank{r.rank}.loaded DTensor at {coord}", r.tensors[0], want_t, ex
            )


def reference_value_diff(
    ta: torch.Tensor, tb: torch.Tensor, options: list[str]
) -> dict[str, Any] | None:
    """CKPT-10 on the global tensors: which elements differ (exact, NaN equal to NaN, or
    ``|a - b| <= atol + rtol * |b|`` with a tolerance, as ``torch.isclose``), and for the
    largest difference ``|a - b|`` (infinite where NaN meets a number) its index and both
    values; None when none differs. Integers and bools compare exactly without a
    tolerance."""
    tol = dict(zip(options[::2], map(float, options[1::2])))
    atol, rtol = tol.get("--atol", 0.0), tol.get("--rtol", 0.0)
    fa, fb = ta.contiguous().reshape(-1), tb.contiguous().reshape(-1)
    wide = torch.complex128 if ta.dtype.is_complex else torch.float64
    xa, xb = fa.to(wide), fb.to(wide)
    if ta.dtype.is_floating_point or ta.dtype.is_complex or atol or rtol:
        gap = (xa - xb).abs().to(torch.float64)
        within = torch.isfinite(gap) & (gap <= atol + rtol * xb.abs().to(torch.float64))
        same = (xa == xb) | (xa.isnan() & xb.isnan()) | within
    else:
        same = fa == fb
        gap = (xa - xb).abs().to(torch.float64)
    differs = [int(i) for i in (~same).nonzero().reshape(-1)]
    if not differs:
        return None
    gaps = [math.inf if math.isnan(float(gap[i])) else float(gap[i]) for i in differs]
    worst = differs[max(range(len(differs)), key=lambda k: (gaps[k], -k))]
    where, rest = [], worst
    for n in reversed(ta.shape):
        where.append(rest % n)
        rest //= n
    top = max(gaps)
    return {
        "count": len(differs),
        "numel": ta.numel(),
        "max_diff": top if math.isfinite(top) else str(top),
        "where": list(reversed(where)),
        "a": repr(fa[worst].item()),
        "b": repr(fb[worst].item()),
    }


def _diff_case(
    a: Layout,
    b: Layout,
    worlds: tuple[int, int],
    ta: torch.Tensor,
    kind: str,
    index: int,
    **kw: Any,
) -> dict[str, Any]:
    return {
        "world_a": worlds[0],
        "world_b": worlds[1],
        "a": a,
        "b": b,
        **changed(ta, kind, index, **kw),
    }


ROWS_4x6 = _layout((4, 6), ((0, 0), (1, 6), 0), ((1, 0), (2, 6), 1), ((3, 0), (1, 6), 0))
COLS_4x6 = _layout((4, 6), ((0, 0), (4, 2), 1), ((0, 2), (4, 3), 0), ((0, 5), (4, 1), 2))
BLOCKS_4x6 = _layout(
    (4, 6),
    ((0, 0), (2, 3), 0),
    ((0, 3), (2, 3), 1),
    ((2, 0), (2, 3), 1),
    ((2, 3), (2, 3), 0),
)
DIFF_EXAMPLES = [
    # rows against columns, the last element's high byte (float32)
    _diff_case(ROWS_4x6, COLS_4x6, (2, 3), _bits((4, 6), torch.float32), "high_byte", 23),
    # the same, B the side with fewer chunks: the first element, one low byte (bfloat16)
    _diff_case(
        BLOCKS_4x6, ROWS_4x6, (2, 2), _bits((4, 6), torch.bfloat16), "byte", 0, byte=0, mask=1
    ),
    # the last element of the region two middle chunks share (A's columns 2-4, B's rows
    # 1-2), every bit (int64)
    _diff_case(COLS_4x6, ROWS_4x6, (3, 2), _bits((4, 6), torch.int64), "all_bits", 2 * 6 + 4),
    # NaN payloads only, in the same layout: the same values, exit 0 (bfloat16)
    _diff_case(ROWS_4x6, ROWS_4x6, (2, 2), _bits((4, 6), torch.bfloat16), "nan_payload", 13),
    # 0.0 against -0.0 across layouts: only the layouts differ (float16)
    _diff_case(ROWS_4x6, BLOCKS_4x6, (2, 2), _bits((4, 6), torch.float16), "negative_zero", 9),
    # 1.5 against 2.0 with --atol 0.5: on the bound, the same (float32)
    _diff_case(
        COLS_4x6,
        BLOCKS_4x6,
        (3, 2),
        _bits((4, 6), torch.float32),
        "tolerance",
        17,
        tol=("--atol", 1.0),
    ),
    # ... with --rtol 0.125 (0.25 of |b| = 2.0): beyond it, different (float64)
    _diff_case(
        BLOCKS_4x6,
        COLS_4x6,
        (2, 3),
        _bits((4, 6), torch.float64),
        "tolerance",
        6,
        tol=("--rtol", 0.5),
    ),
    # a bool flipped in a tensor of one column per rank against one row
    _diff_case(
        _layout((3, 4), *[((0, j), (3, 1), j) for j in range(4)]),
        _layout((3, 4), ((0, 0), (1, 4), 0), ((1, 0), (2, 4), 1)),
        (4, 2),
        _bits((3, 4), torch.bool),
        "byte",
        7,
    ),
]


@pytest.mark.rule("CKPT-10", "CKPT-7")
@pytest.mark.pool
# Two real saves a drawn example: few drawn beside the explicit ones, which put the change at
# the tensor's first and last element, at a chunk's last element, in a NaN's payload, a sign
# of zero and on a tolerance's bound.
@settings(max_examples=8, deadline=None)
@given(diff_cases())
@example(DIFF_EXAMPLES[0])
@example(DIFF_EXAMPLES[1])
@example(DIFF_EXAMPLES[2])
@example(DIFF_EXAMPLES[3])
@example(DIFF_EXAMPLES[4])
@example(DIFF_EXAMPLES[5])
@example(DIFF_EXAMPLES[6])
@example(DIFF_EXAMPLES[7])
def test_diff_values_reports_exactly_the_changed_element_whatever_the_two_layouts(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    a, b, ta, tb, options = c["a"], c["b"], c["tensor_a"], c["tensor_b"], c["options"]
    change = c["change"]
    ex = (
        f"{' '.join(['diff --values', *options])} of A (saved on {c['world_a']} ranks, "
        f"{describe_layout(a)}) and B (on {c['world_b']} ranks, {describe_layout(b)}), "
        f"dtype={ta.dtype}, B changed by {change['kind']} at flat index {change['index']}"
    )
    with case():
        facts = impl.checkpoint_diff_values(
            pools(c["world_a"]), pools(c["world_b"]), a, ta, b, tb, options, ex
        )
        want = reference_value_diff(ta, tb, options)
        layouts_differ = {s.box for s in a.shards} != {s.box for s in b.shards}
        report = facts["json"]
        if report is None:
            raise AssertionError(f"diff --json printed nothing; stderr {facts['stderr']!r} [{ex}]")
        diffs = report["differences"]
        kinds = sorted(d["what"] for d in diffs)
        assert_equal(
            "differences (--json)",
            kinds,
            sorted(["layout"] * layouts_differ + ["values"] * (want is not None)),
            ex,
        )
        if want is not None:
            got = next(d for d in diffs if d["what"] == "values")
            assert_equal(
                "values difference (--json)", {k: got[k] for k in want}, want, ex, rule="CKPT-10"
            )
        status = 1 if diffs else 0
        assert_equal("exit status (--json)", facts["json_rc"], status, ex)
        assert_equal("exit status", facts["rc"], status, ex)
        lines = facts["out"].splitlines()
        assert_equal(
            "first line",
            lines[0].split(" of ")[0],
            "compared metadata and values (" + _tolerance(options),
            ex,
        )
        assert_equal(
            "last line", lines[-1], f"{len(diffs)} difference" + "s" * (len(diffs) != 1), ex
        )
        values = [x for x in lines if x.startswith("t: values differ")]
        if want is None:
            assert_equal("values lines", values, [], ex, rule="CKPT-10")
        else:
            line = values[0] if len(values) == 1 else values
            expected = (
                f"t: values differ in {want['count']} of {want['numel']} elements; largest "
                f"difference {want['max_diff']} at {tuple(want['where'])} "
                f"({want['a']} vs {want['b']})"
            )
            assert_equal("values line", line, expected, ex, rule="CKPT-10")


def _tolerance(options: list[str]) -> str:
    if not options:
        return "exactly)"
    tol = dict(zip(options[::2], map(float, options[1::2])))
    return f"atol={tol.get('--atol', 0.0)} rtol={tol.get('--rtol', 0.0)})"
