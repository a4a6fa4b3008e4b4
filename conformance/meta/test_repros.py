"""The standalone repros and the report built from them (CONF-6, CONF-7)."""

from __future__ import annotations

import ast
import json
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conformance.report import repro_run
from conformance.report.draw import layout_svg, render_html
from conformance.report.entries import build_entries
from conformance.report.repro_run import all_repros, read_defect, run_repro
from conformance.report.write import read_rules

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = re.compile(r"^(pytorch|torchrec)( PR)? ?#\d+$")


def _test_functions() -> set[str]:
    names = set()
    for path in (ROOT / "conformance" / "tests").glob("test_*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                names.add(f"{path.name}::{node.name}")
    return names


@pytest.mark.rule("CONF-6")
@pytest.mark.parametrize("path", all_repros(), ids=lambda p: p.stem)
def test_every_repro_states_its_defect(path: Path) -> None:
    defect = read_defect(path)  # raises on a missing field or a wrong id
    assert defect["rule"] in read_rules(), f"{path.name}: rule {defect['rule']} is not in spec/"
    up = defect["upstream"]
    assert up is None or UPSTREAM.match(up), f"{path.name}: upstream {up!r} is not 'pytorch#N'"
    unknown = set(defect.get("tests", [])) - _test_functions()
    assert not unknown, f"{path.name}: names tests that do not exist: {sorted(unknown)}"
    assert "shardspec" not in path.read_text(), f"{path.name}: a repro is plain torch"
    assert 1 <= int(defect["nproc"]) <= 8


@pytest.mark.rule("CONF-6", "CONF-13")
@pytest.mark.parametrize(
    "path", [p for p in all_repros() if read_defect(p).get("needs")], ids=lambda p: p.stem
)
def test_a_repro_whose_package_does_not_load_says_skipped(path: Path) -> None:
    """A package installed beside another torch fails to load with OSError (fbgemm-gpu-cpu
    1.9.0 on torch 2.15.0: undefined symbol), not ImportError: the repro must say SKIPPED,
    or the report reads "different failure" for a library that never ran."""
    tree = ast.parse(path.read_text())
    guards = [
        h
        for node in ast.walk(tree)
        if isinstance(node, ast.Try)
        for h in node.handlers
        if any(isinstance(s, ast.Expr) and "SKIPPED" in ast.unparse(s) for s in h.body)
    ]
    assert guards, f"{path.name}: needs {read_defect(path)['needs']} but has no SKIPPED guard"
    caught = {n.id for h in guards for n in ast.walk(h.type) if isinstance(n, ast.Name)}
    assert {"ImportError", "OSError"} <= caught, f"{path.name}: its guard catches {caught}"


def _known_torch_defects() -> set[str]:
    """Every conformance test marked ``known_defect("torch", ...)``, read from the source: on
    the function, or on one of its parameters (``pytest.param(..., marks=...)``)."""
    names = set()
    for path in (ROOT / "conformance" / "tests").glob("test_*.py"):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef):
                continue
            for call in (c for dec in node.decorator_list for c in ast.walk(dec)):
                if (
                    isinstance(call, ast.Call)
                    and ast.unparse(call.func).endswith("mark.known_defect")
                    and call.args
                    and isinstance(call.args[0], ast.Constant)
                    and call.args[0].value == "torch"
                ):
                    names.add(f"{path.name}::{node.name}")
    return names


@pytest.mark.rule("CONF-6", "CONF-7")
def test_every_known_torch_defect_has_a_repro() -> None:
    """A suite test that shows a known torch defect names the repro of that defect, so the
    report folds its findings into that entry instead of an entry without a repro."""
    named = {t for path in all_repros() for t in read_defect(path).get("tests", [])}
    known = _known_torch_defects()
    assert len(known) > 20  # the reader finds the markers
    missing = sorted(known - named)
    assert not missing, f"known torch defects named by no repro's DEFECT['tests']: {missing}"


def _fake(tmp: Path, name: str, body: str, nproc: int = 1) -> Path:
    path = tmp / f"{name}.py"
    defect = {
        "id": name,
        "title": name,
        "area": "chunk",
        "rule": "CHUNK-2",
        "upstream": "pytorch#1",
        "nproc": nproc,
        "torch_does": "x",
        "spec_says": "y",
        "tests": [],
    }
    path.write_text(f"import os, sys, time\nDEFECT = {defect!r}\n{body}\n")
    return path


@pytest.mark.rule("CONF-6")
def test_runner_tells_reproduced_from_fixed_broken_and_hung(tmp_path: Path) -> None:
    rank = "int(os.environ['RANK'])"
    diverging = _fake(
        tmp_path,
        "diverging",
        f"r = {rank}\n"
        "assert os.environ['MASTER_ADDR'] == '127.0.0.1'\n"
        'print(\'BOXES\', \'{"rank": %d, "shape": [4], "spec": [], "torch": []}\' % r)\n'
        "if r == 1:\n    print('DIVERGES rank 1: offset 2, the spec says 3'); sys.exit(1)",
        nproc=2,
    )
    res = run_repro(diverging)
    assert res.outcome == "reproduced", res.output
    assert res.divergences == ["DIVERGES rank 1: offset 2, the spec says 3"]
    assert sorted(b["rank"] for b in res.boxes) == [0, 1]
    assert run_repro(_fake(tmp_path, "fixed", "print('ok')")).outcome == "fixed"
    assert run_repro(_fake(tmp_path, "broken", "raise ImportError('x')")).outcome == "broken"
    hung = run_repro(_fake(tmp_path, "hung", "time.sleep(60)"), timeout=3)
    assert hung.outcome == "timeout" and hung.exit_codes == [None]


@pytest.mark.rule("CONF-6")
def test_a_checked_claim_that_agrees_reads_not_reproduced(tmp_path: Path) -> None:
    from conformance.report.repro_run import shown_outcome

    plain = _fake(tmp_path, "plain", "print('ok')")
    claim = tmp_path / "claim.py"
    claim.write_text(
        plain.read_text()
        .replace("'tests': []", "'tests': [], 'checked': 'agrees on 2.13'")
        .replace("'plain'", "'claim'")
    )
    assert read_defect(claim)["checked"] == "agrees on 2.13"
    res = run_repro(claim)
    assert res.outcome == "fixed"  # the runner's outcome; only its reading differs
    assert shown_outcome(claim, res) == "not reproduced (a checked claim)"
    assert shown_outcome(plain, run_repro(plain)) == "fixed"


@pytest.mark.rule("CONF-6")
def test_runner_listens_on_loopback_only(tmp_path: Path) -> None:
    from shardspec.testing.loopback import listeners

    probe = _fake(
        tmp_path,
        "probe",
        "from shardspec.testing.loopback import listeners\n"
        "bad = [str(x.address) for x in listeners([os.getpid(), os.getppid()]) if not x.loopback]"
        "\nprint('LISTENING', bad)",
    )
    res = run_repro(probe)
    assert res.outcome == "fixed", res.output
    assert "LISTENING []" in res.output[0], res.output[0]
    assert all(x.loopback for x in listeners([os.getpid()])), "the driver's store"


def _case(test: str, outcome: str, message: str | None, rules: list[str]) -> Any:
    return SimpleNamespace(
        test=test,
        area="chunk",
        rules=rules,
        outcome=outcome,
        message=message,
        example=None,
        known=False,
        reason=None,
        issue=None,
    )


@pytest.mark.rule("CONF-7")
def test_one_entry_per_defect_with_its_world_sizes_and_the_rule_broken() -> None:
    t = "conformance/tests/test_chunk.py::test_rows"
    cases = [_case(f"{t}[{w}]", "diverged", f"off [world={w}]", ["CHUNK-1"]) for w in (1, 2, 4)]
    tagged = "boxes_of(1)=[2], but should be [3] [ex] (breaks CHUNK-2)"
    cases.append(
        _case("conformance/tests/test_x.py::test_y", "diverged", tagged, ["A-1", "CHUNK-2"])
    )
    cases.append(_case("conformance/tests/test_x.py::test_ok", "passed", None, ["A-1"]))
    defect = {
        "id": "rows-off",
        "title": "rows",
        "area": "chunk",
        "rule": "CHUNK-1",
        "upstream": "pytorch#5",
        "nproc": 3,
        "torch_does": "x",
        "spec_says": "y",
        "tests": ["test_chunk.py::test_rows"],
    }
    repro = SimpleNamespace(reproduced=True, nproc=3, outcome="reproduced", divergences=["D"])
    repro.boxes, repro.perf = [], []
    entries = build_entries(cases, [defect], {"rows-off": repro})
    assert [e.id for e in entries] == ["rows-off", "suite-y"]
    rows, new = entries
    assert rows.world_sizes == [1, 2, 3, 4] and len(rows.instances) == 3 and rows.reproduced
    assert new.rule == "CHUNK-2", "the failing assertion's tag names the rule, not the cited list"
    assert new.upstream is None and tagged in (new.issue_text or "")
    required = {"id", "area", "rule", "upstream", "world_sizes", "repro", "reproduced"}
    assert required <= set(rows.as_json()) and json.dumps(rows.as_json())


@pytest.mark.rule("CONF-7")
def test_layout_divergence_drawn_rank_by_rank() -> None:
    boxes = [
        {"rank": 0, "shape": [5], "spec": [[[0], [3]]], "torch": [[[0], [3]]]},
        {"rank": 1, "shape": [5], "spec": [[[3], [2]]], "torch": [[[2], [2]]]},
    ]
    svg = layout_svg(boxes)
    assert svg.count("<rect") == 2 + 4, "two tensor outlines and four boxes"
    assert "rank 1: offsets [2], sizes [2]" in svg and "rank 1: offsets [3], sizes [2]" in svg
    entry = SimpleNamespace(
        id="e", title="t", rule="CHUNK-1", rules_cited=[], upstream=None, world_sizes=[2],
        repro="repro/e.py", reproduced=True, repro_outcome="reproduced", torch_does="a",
        spec_says="b", divergences=[], boxes=boxes, instances=[],
    )  # fmt: skip
    page = render_html("r", [("torch", "2.13.0")], [entry])  # type: ignore[list-item]
    assert page.count('<tr class="diff">') == 1, "only rank 1's boxes differ"
    assert "<b>torch does</b>: a" in page


@pytest.mark.rule("CONF-7")
def test_a_peers_report_says_what_that_peer_does() -> None:
    from conformance.report.entries import Entry
    from conformance.report.write import _entry_md

    entry = Entry(
        id="e", area="checkpoint_files", rule="CKPT-1", rules_cited=[], title="t",
        upstream=None, world_sizes=[2], repro="repro/e.py", reproduced=True,
        torch_does="loads on rank 0 only", spec_says="refused on every rank",
    )  # fmt: skip
    text = "\n".join(_entry_md(1, entry, {}, {}, "megatron"))
    assert "- **What megatron does**: loads on rank 0 only" in text
    assert "What torch" not in text
    page = render_html("r", [], [entry], impl="megatron")
    assert "<b>megatron does</b>: loads on rank 0 only" in page and "torch does" not in page


@pytest.mark.rule("CONF-7")
def test_report_writes_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conformance.report import write as report

    repros = tmp_path / "repros"
    repros.mkdir()
    _fake(repros, "one-defect", "print('DIVERGES: offset 6, the spec says 5'); sys.exit(1)")
    monkeypatch.setattr(repro_run, "REPROS", repros)
    monkeypatch.setenv("SHARDSPEC_IMPL", "torch")
    out = tmp_path / "rep"
    assert report.main(["--out", str(out), "--no-suite", "--no-probes"]) == 0
    data = json.loads((out / "report.json").read_text())
    (entry,) = data["divergences"]
    assert entry["id"] == "one-defect" and entry["reproduced"] is True
    assert entry["repro"] == "repro/one-defect.py" and (out / "repro" / "one-defect.py").exists()
    assert data["environment"]["torch"] and data["environment"]["Hypothesis profile"]
    assert "one-defect" in (out / "report.md").read_text()
    assert "one-defect" in (out / "report.html").read_text()
    assert sys.executable  # the fake repro ran with this interpreter


@pytest.mark.rule("CONF-7")
def test_a_failed_test_fails_the_report_only_under_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The upstream report lists failures as findings; a peer's session, whose defects are
    # strict expected failures, fails on one (--gate), after writing the report all the same.
    from conformance.report import write as report

    monkeypatch.setattr(repro_run, "REPROS", tmp_path / "none")
    monkeypatch.setenv("SHARDSPEC_IMPL", "torch")
    monkeypatch.setattr(report.pytest, "main", lambda *a, **k: pytest.ExitCode.TESTS_FAILED)
    base = ["--no-repros", "--no-probes"]
    assert report.main(["--out", str(tmp_path / "a"), *base]) == 0
    assert report.main(["--out", str(tmp_path / "b"), "--gate", *base]) == 1
    assert json.loads((tmp_path / "b" / "report.json").read_text())["pytest_exit_code"] == 1
    monkeypatch.setattr(report.pytest, "main", lambda *a, **k: pytest.ExitCode.OK)
    assert report.main(["--out", str(tmp_path / "c"), "--gate", *base]) == 0


@pytest.mark.rule("CONF-7")
def test_a_crash_reads_as_its_first_and_innermost_lines() -> None:
    from conformance.report.write import _message

    crash = RuntimeError(
        "rank 2 failed in redistribute\n  File 'a.py', line 1\n    f()\n"
        "RuntimeError: [gloo] Received data size doesn't match expected size (80 vs 60)\n"
    )
    assert _message(crash) == (
        "RuntimeError: rank 2 failed in redistribute ... RuntimeError: [gloo] Received data "
        "size doesn't match expected size (80 vs 60)"
    )
    fact = AssertionError("out.shape=(3,), but should be (4,) [chunk(shape=(7,), k=2)]")
    assert _message(fact) == f"AssertionError: {fact}"


@pytest.mark.rule("CONF-7")
def test_an_assertion_tagged_with_its_rule_names_it_in_the_report() -> None:
    from conformance.assertions import assert_equal
    from conformance.report.entries import violated_rule

    with pytest.raises(AssertionError) as info:
        assert_equal("offset", 2, 3, "5 rows on 2 ranks", rule="CHUNK-1")
    assert str(info.value).endswith("[5 rows on 2 ranks] (breaks CHUNK-1)")
    assert violated_rule(str(info.value), ["CHUNK-1", "FSDP-6"]) == "CHUNK-1"
    assert violated_rule("offset=2, but should be 3 [x]", ["CHUNK-1", "FSDP-6"]) is None
    assert violated_rule("offset=2, but should be 3 [x]", ["FSDP-6"]) == "FSDP-6"
