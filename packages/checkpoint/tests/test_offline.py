"""``shardspec reshard SRC DST`` (spec/09-checkpoint.md, CKPT-17): a checkpoint saved on 4 gloo
ranks, rewritten offline into the layouts of a 2-rank job (given by a checkpoint that job
saved, or by the ``--layouts`` file ``layouts_of`` writes on it), passes ``shardspec inspect``
and loads with plain ``dcp.load`` (DCP's reader and planner) on 2 ranks to the reference
values; each target rank's own chunks sit in its own file; mismatches are refused before
anything is written."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from dcp_load_cases import load, save
from dcp_reader_cases import load_traced, target_layouts
from test_dcp_load import ON_4, entries

from shardspec.checkpoint.cli import main
from shardspec.checkpoint.dcp_metadata import read_metadata
from shardspec.testing import RankPool, get_pool

torch = pytest.importorskip("torch")


@pytest.fixture
def pools() -> dict[int, RankPool]:
    return {w: get_pool(w, timeout=180) for w in (4, 2)}


def _loads_like_the_source(pool: RankPool, path: Path, ents: list) -> None:
    results = pool.call(load, str(path), ents, "default")
    failures = [f for r in results for f in r["failures"]]
    assert not failures, failures


def _own_files(dst: Path, layouts: dict) -> None:
    """Every chunk of a tensor sharded without replicas lies in its rank's file."""
    md = read_metadata(dst)
    files = {(k.fqn, tuple(k.offset or ())): v.relative_path for k, v in md.storage_data.items()}
    for fqn, lay in layouts.items():
        boxes = {}
        for s in lay["shards"]:
            boxes.setdefault(tuple(s["offsets"]), []).append(s["rank"])
        for offsets, ranks in boxes.items():
            assert files[(fqn, offsets)] == f"__{min(ranks)}_0.distcp", (fqn, offsets)


@pytest.mark.rule("CKPT-17")
def test_reshard_with_layouts_then_plain_load_on_the_target_world(
    pools: dict[int, RankPool], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    pools[4].call(save, str(src), entries(ON_4, 1), True)
    layouts = json.loads(pools[2].call(target_layouts, entries(ON_4, 2))[0])
    (tmp_path / "layouts.json").write_text(json.dumps({**layouts, "plain": _whole("plain")}))
    assert main(["reshard", str(src), str(dst), "--layouts", str(tmp_path / "layouts.json")]) == 0
    assert main(["inspect", str(dst), "--no-layout"]) == 0
    assert "valid (metadata and file sizes)" in capsys.readouterr().out
    assert main(["verify", str(dst), "--progress", "never"]) == 0  # every chunk reads back
    assert capsys.readouterr().out.splitlines()[0].endswith("all valid")
    _own_files(dst, layouts)
    _loads_like_the_source(pools[2], dst, entries(ON_4, 2))
    # A rank whose tensors are all sharded without replicas reads its own file only.
    sharded = [e for e in entries(ON_4, 2) if e[0][0] in ("dt.rows", "dt.mesh2d", "st.multi")]
    assert pools[2].call(load_traced, str(dst), sharded) == [["__0_0.distcp"], ["__1_0.distcp"]]


def _whole(name: str) -> dict:
    shape = next(e[0][1] for e in ON_4 if e[0][0] == name)
    return {"format": "shardspec.layout", "version": 1, "shape": list(shape),
            "shards": [{"rank": 0, "offsets": [0] * len(shape), "sizes": list(shape)}]}  # fmt: skip


@pytest.mark.rule("CKPT-17")
def test_reshard_like_a_checkpoint_of_the_target_job(
    pools: dict[int, RankPool], tmp_path: Path
) -> None:
    src, like, dst = tmp_path / "src", tmp_path / "like", tmp_path / "dst"
    pools[4].call(save, str(src), entries(ON_4, 1), True)
    pools[2].call(save, str(like), entries(ON_4, 2), True)  # the new job's step-0 save
    assert main(["reshard", str(src), str(dst), "--like", str(like)]) == 0
    want = read_metadata(like)
    got = read_metadata(dst)
    for fqn, smd in want.state_dict_metadata.items():
        if hasattr(smd, "chunks"):
            boxes = lambda m: {(tuple(c.offsets), tuple(c.sizes)) for c in m.chunks}  # noqa: E731
            assert boxes(got.state_dict_metadata[fqn]) == boxes(smd), fqn
    _loads_like_the_source(pools[2], dst, entries(ON_4, 2))


@pytest.mark.rule("CKPT-17")
def test_reshard_refuses_a_mismatch_before_writing(
    pools: dict[int, RankPool], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    pools[4].call(save, str(src), entries(ON_4, 1)[:1], True)  # dt.rows, (10, 6)
    bad = {"dt.rows": {"format": "shardspec.layout", "version": 1, "shape": [10, 7],
                       "shards": [{"rank": 0, "offsets": [0, 0], "sizes": [10, 7]}]}}  # fmt: skip
    (tmp_path / "l.json").write_text(json.dumps(bad))
    assert main(["reshard", str(src), str(dst), "--layouts", str(tmp_path / "l.json")]) == 2
    err = capsys.readouterr().err
    assert "'dt.rows'" in err and "(10, 6)" in err and "(10, 7)" in err, err
    # Nothing written: no DST, no temporary directory left beside it.
    assert {p.name for p in tmp_path.iterdir()} == {"src", "l.json"}
    # A target whose chunks leave a gap is refused too (CKPT-1), naming the tensor.
    gap = {"dt.rows": {**bad["dt.rows"], "shape": [10, 6],
                       "shards": [{"rank": 0, "offsets": [0, 0], "sizes": [9, 6]}]}}  # fmt: skip
    (tmp_path / "l.json").write_text(json.dumps(gap))
    assert main(["reshard", str(src), str(dst), "--layouts", str(tmp_path / "l.json")]) == 2
    assert "gap" in capsys.readouterr().err and not dst.exists()
    md = pickle.loads((src / ".metadata").read_bytes())  # untouched
    assert "dt.rows" in md.state_dict_metadata
