"""The per-release upstream report (CONF-13): hand-made report.json files in, verdicts out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conformance.report import matrix as report_matrix
from conformance.report.matrix import build, defect_verdict, read_release, release_key, render

pytestmark = pytest.mark.rule("CONF-13")

CASE = "conformance/tests/test_fsdp.py::test_chunk_tensor_states_the_rows_it_holds"


def _case(outcome: str, known: bool = False) -> dict[str, Any]:
    return {"test": CASE, "outcome": outcome, "known": known}


def _entry(did: str, repro_outcome: str | None, *cases: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": did,
        "title": f"{did} title",
        "area": "fsdp",
        "rule": "CHUNK-1",
        "upstream": "pytorch #1",
        "repro_outcome": repro_outcome,
        "instances": [{"test": c["test"], "outcome": c["outcome"]} for c in cases],
    }


def _report(folder: Path, torch: str, entries: list[dict[str, Any]], **extra: Any) -> Path:
    cases = [c for e in entries for c in e.pop("_cases", [])]
    folder.mkdir(parents=True)
    body = {
        "impl": "torch",
        "environment": {"torch": torch, "torchrec": "1.8.0", "fbgemm-gpu": "1.8.0"},
        "pytest_exit_code": 1,
        "seconds": 1.0,
        "divergences": entries,
        "fixed": [],
        "cases": cases,
        **extra,
    }
    (folder / "report.json").write_text(json.dumps(body))
    return folder


@pytest.mark.parametrize(
    ("repro", "cases", "verdict"),
    [
        ("reproduced", [], "reproduced"),
        (None, [_case("diverged", known=True)], "reproduced"),  # the expected known failure
        ("fixed", [_case("passed")], "fixed"),  # a strict xfail that passes is a fix
        (None, [_case("passed")], "fixed"),
        ("broken", [], "different failure"),
        ("timeout", [], "different failure"),
        ("fixed", [_case("diverged", known=False)], "different failure"),  # not the mark's
        ("fixed", [_case("error")], "different failure"),
        ("skipped", [], "skipped"),
        (None, [_case("skipped")], "skipped"),
        (None, [], "not run"),
    ],
)
def test_one_release_verdict_of_a_defect(
    repro: str | None, cases: list[dict[str, Any]], verdict: str
) -> None:
    entry = _entry("d", repro, *cases)
    assert defect_verdict(entry, {c["test"]: c for c in cases}) == verdict


def test_a_checked_claim_that_agrees_is_not_reproduced_rather_than_fixed() -> None:
    claim = {**_entry("claim", "fixed"), "checked": "not reproduced on 2.13.0"}
    assert defect_verdict(claim, {}) == "not reproduced"
    assert defect_verdict({**claim, "repro_outcome": "reproduced"}, {}) == "reproduced"
    assert defect_verdict({**claim, "repro_outcome": "broken"}, {}) == "different failure"


def test_releases_order_by_number_not_text() -> None:
    names = ["2.15.0+cu130", "2.9.1", "2.14.1", "2.13.0"]
    assert sorted(names, key=release_key) == ["2.9.1", "2.13.0", "2.14.1", "2.15.0+cu130"]


def test_matrix_names_the_release_where_a_verdict_changed(tmp_path: Path) -> None:
    old = _entry("still-there", "reproduced")
    gone = _entry("gone-in-2.15", "reproduced")
    gone_new = _entry("gone-in-2.15", "fixed", _case("passed"))
    gone_new["_cases"] = [_case("passed")]
    broke = _entry("crashes-in-2.15", "broken")
    a = _report(tmp_path / "a", "2.13.0", [old, gone], verdicts={"crashes-in-2.15": "reproduced"})
    b = _report(
        tmp_path / "b",
        "2.15.0+cu130",
        [_entry("still-there", "reproduced"), gone_new, broke],
    )
    c = _report(tmp_path / "c", "2.14.1", [_entry("still-there", "reproduced")], fixed=["x"])
    # given out of order: the matrix sorts by release
    matrix = build([read_release(p) for p in (b, a, c)])
    assert [r["torch"] for r in matrix["releases"]] == ["2.13.0", "2.14.1", "2.15.0+cu130"]
    rows = {d["id"]: d for d in matrix["defects"]}
    assert rows["still-there"]["changed_in"] is None
    assert list(rows["still-there"]["verdicts"].values()) == ["reproduced"] * 3
    assert rows["gone-in-2.15"]["verdicts"] == {
        "2.13.0": "reproduced",
        "2.14.1": "not run",
        "2.15.0+cu130": "fixed",
    }
    assert rows["gone-in-2.15"]["changed_in"] == "2.14.1"
    assert rows["crashes-in-2.15"]["verdicts"]["2.15.0+cu130"] == "different failure"
    assert rows["x"]["verdicts"]["2.14.1"] == "fixed"
    text = render(matrix)
    assert "| `gone-in-2.15` |" in text and "**fixed**" in text


def test_matrix_refuses_reports_it_cannot_place(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="missing"):
        read_release(tmp_path / "nothing")
    ours = _report(tmp_path / "ours", "2.13.0", [])
    body = json.loads((ours / "report.json").read_text())
    (ours / "report.json").write_text(json.dumps({**body, "impl": "shardspec"}))
    with pytest.raises(SystemExit, match="not torch"):
        read_release(ours)
    a = _report(tmp_path / "a", "2.13.0", [])
    b = _report(tmp_path / "b", "2.13.0", [])
    with pytest.raises(SystemExit, match="same torch"):
        build([read_release(a), read_release(b)])


def test_each_repro_is_stamped_with_the_releases_it_ran_on(tmp_path: Path) -> None:
    repro = sorted(report_matrix.REPROS.glob("*.py"))[0]
    a = _report(tmp_path / "a", "2.13.0", [_entry(repro.stem, "reproduced")])
    b = _report(tmp_path / "b", "2.14.1", [], fixed=[repro.stem])
    out = tmp_path / "out"
    assert report_matrix.main([str(a), str(b), "--out", str(out)]) == 0
    head = (out / "repro" / repro.name).read_text().splitlines()[0]
    assert head == "# shardspec report matrix: run on torch 2.13.0: reproduced, 2.14.1: fixed"
    assert json.loads((out / "matrix.json").read_text())["defects"]
