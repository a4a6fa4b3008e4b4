"""shardspec's DCP planners and `shardspec inspect` on TorchRec checkpoints
(spec/09-checkpoint.md, CKPT-3, CKPT-6): a sharded EmbeddingBagCollection (tables 11x8, 7x16,
5x8: rows divide by neither 2 nor 4) saved under one plan and loaded under another on fewer,
the same and more gloo ranks, with our LoadPlanner, DCP's default and the collective
``shardspec.checkpoint.load`` (CKPT-23), each rank's bytes the reference's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shardspec.testing.optional import import_or_skip

import_or_skip("torchrec", "nox -s torchrec installs it")
import_or_skip("fbgemm_gpu", "nox -s torchrec installs fbgemm-gpu-cpu")

import torchrec_cases as cases  # noqa: E402
from torchrec_dcp_cases import load_ebc, save_ebc  # noqa: E402

from shardspec.checkpoint.cli import main  # noqa: E402

pytestmark = pytest.mark.torchrec


def S(stype: str, *args: Any) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    return (stype, args, {})


ROW_WISE_4 = {t: S("row_wise", 4) for t in cases.TABLES}
ROW_WISE_2 = {t: S("row_wise", 2) for t in cases.TABLES}
COLUMN_WISE_2 = {
    "t0": S("column_wise", [0, 1]),
    "t1": S("column_wise", [1, 0, 1, 0]),
    "t2": S("column_wise", [1]),
}
COLUMN_WISE_4 = {
    "t0": S("column_wise", [3, 2, 1, 0]),
    "t1": S("column_wise", [0, 1, 2, 3]),
    "t2": S("column_wise", [2]),
}
TABLE_WISE_4 = {"t0": S("table_wise", 3), "t1": S("table_wise", 2), "t2": S("table_wise", 0)}


@pytest.mark.rule("CKPT-3", "CKPT-23")
def test_torchrec_checkpoint_saved_on_4_loads_on_2_and_4(
    ranks2: Any, ranks4: Any, tmp_path: Path
) -> None:
    ranks4.call(save_ebc, str(tmp_path), ROW_WISE_4)
    for pool, spec in ((ranks2, COLUMN_WISE_2), (ranks4, TABLE_WISE_4), (ranks4, COLUMN_WISE_4)):
        bad = [m for r in pool.call(load_ebc, str(tmp_path), spec) for m in r]
        assert not bad, bad


@pytest.mark.rule("CKPT-3", "CKPT-23")
def test_torchrec_checkpoint_saved_on_2_loads_on_4(
    ranks2: Any, ranks4: Any, tmp_path: Path
) -> None:
    ranks2.call(save_ebc, str(tmp_path), ROW_WISE_2)
    bad = [m for r in ranks4.call(load_ebc, str(tmp_path), COLUMN_WISE_4) for m in r]
    assert not bad, bad


@pytest.mark.rule("CKPT-6")
def test_torchrec_checkpoint_inspected(
    ranks4: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ranks4.call(save_ebc, str(tmp_path), ROW_WISE_4)
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    got = {t["fqn"]: t for t in doc["tensors"]}
    assert set(got) == {cases.key(t) for t in cases.TABLES}
    for table, (rows, cols) in cases.TABLES.items():
        t = got[cases.key(table)]
        assert t["shape"] == [rows, cols] and t["verdict"] == {"ok": True}
        # Hand-worked row_wise over 4: blocks of ceil(rows / 4), the last one short.
        block = -(-rows // 4)
        want = {((o, 0), (min(block, rows - o), cols)) for o in range(0, rows, block)}
        got_boxes = {(tuple(c["offsets"]), tuple(c["sizes"])) for c in t["chunks"]}
        assert {b for b in got_boxes if b[1][0] > 0} == want, table
