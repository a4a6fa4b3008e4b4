"""The coverage audit on hand-made sources and a hand-made `coverage json` report: which
function owns an uncovered line, what counts as public, which allow-list entry gives the
reason, that a missing reason fails and a stale entry is listed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.coverage_audit import (
    audit,
    compress,
    function_spans,
    main,
    package_totals,
    parse_allow,
)

MOD = "packages/demo/src/shardspec/demo/mod.py"
PRIV = "packages/demo/src/shardspec/demo/_impl.py"
OTHER = "packages/other/src/shardspec/other/run.py"

# Line numbers matter: the report below names them.
MOD_SRC = """\
import functools


@functools.cache
def public(x, default=[
    1,
]):
    if x:
        return 1

    def inner():
        if x > 2:
            return 3
        return 4

    return inner()


def _private(x):
    if x:
        return 1
    return 2


class Box:
    def __init__(self, n):
        if n < 0:
            raise ValueError(n)
        self.n = n

    def size(self):
        return self.n

    def _hidden(self):
        return 0


class _Secret:
    def run(self):
        return 1
"""
# public: body lines 8-16 (5-7 are the signature's defaults, run at definition time);
# inner (12-14) is part of public; _private 20-22; Box.__init__ 27-29; Box.size 32;
# Box._hidden 35; _Secret.run 40.

PRIV_SRC = "def helper(x):\n    if x:\n        return 1\n    return 2\n"
OTHER_SRC = "def go():\n    return 1\n"


def summary(lines: int, stmts: int, branches: int = 0, covered_branches: int = 0) -> dict[str, int]:
    return {
        "covered_lines": lines,
        "num_statements": stmts,
        "num_branches": branches,
        "covered_branches": covered_branches,
    }


def report() -> dict[str, object]:
    return {
        "files": {
            MOD: {
                "missing_lines": [6, 9, 13, 21, 28, 32, 35, 40],
                "missing_branches": [[8, 9], [12, 13], [20, 21], [27, 28], [12, -11]],
                "summary": summary(20, 28, 10, 5),
            },
            PRIV: {
                "missing_lines": [3],
                "missing_branches": [[2, 3]],
                "summary": summary(3, 4, 2, 1),
            },
            OTHER: {
                "missing_lines": [1, 2],
                "missing_branches": [],
                "summary": summary(0, 2),
            },
        }
    }


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for path, src in ((MOD, MOD_SRC), (PRIV, PRIV_SRC), (OTHER, OTHER_SRC)):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(src)
    return tmp_path


def test_spans_start_at_the_body_and_nested_code_belongs_to_the_outer_function() -> None:
    spans = {(a, b, name) for a, b, name in function_spans(MOD_SRC)}
    assert (8, 16, "public") in spans
    assert (12, 14, "public") in spans  # inner, owned by public
    assert (27, 29, "Box.__init__") in spans
    assert (40, 40, "_Secret.run") in spans


def test_each_uncovered_public_line_and_branch_is_found_once(root: Path) -> None:
    result = audit(report(), [], root)
    got = {(u.path, u.func): (sorted(u.lines), sorted(u.branches)) for u in result.missing}
    assert got == {
        (MOD, "public"): ([9, 13], [(8, 9), (12, -11), (12, 13)]),
        (MOD, "Box.__init__"): ([28], [(27, 28)]),
        (MOD, "Box.size"): ([32], []),
        (OTHER, "go"): ([2], []),
    }
    # line 6 (a default), _private's 21 and 20->21, _hidden's 35, _Secret.run's 40, the
    # private module's 3 and 2->3, and run.py's def line 1
    assert result.elsewhere == 8
    assert not result.ok


def test_a_function_entry_wins_over_a_module_entry_and_globs_match(root: Path) -> None:
    entries = parse_allow(
        "# comment\n\n"
        f"{MOD}: the whole module\n"
        f"{MOD}:Box.*: methods checked by test_box.py::test_sizes\n"
        "packages/other/src/**: not run by the suite\n"
    )
    result = audit(report(), entries, root)
    reasons = {(u.func, e.reason) for u, e in result.reasons}
    assert reasons == {
        ("public", "the whole module"),
        ("Box.__init__", "methods checked by test_box.py::test_sizes"),
        ("Box.size", "methods checked by test_box.py::test_sizes"),
        ("go", "not run by the suite"),
    }
    assert result.ok


def test_a_missing_reason_fails_and_a_stale_entry_is_listed_by_name(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (root / "allow.txt").write_text(
        f"{MOD}:public: error path checked by test_demo.py::test_public\n"
        f"{MOD}:Box.size: covered now\n"
        f"{MOD}:Box.gone: renamed away\n"
        f"{OTHER}: not run\n"
    )
    (root / "cov.json").write_text(json.dumps(report()))
    rc = main([str(root / "cov.json"), "--allow", str(root / "allow.txt"), "--root", str(root)])
    out = capsys.readouterr().out
    assert rc == 1
    missing, stale = out.split("FAIL: uncovered")[1].split("STALE: allow-list")
    # public and Box.size have reasons: only Box.__init__ has none
    assert [ln for ln in missing.splitlines() if ln.startswith("  ")] == [
        f"  {MOD}:Box.__init__ (lines 28; branches 27->28)"
    ]
    # Box.size is still uncovered in this report, so its entry is used, not stale
    assert [ln for ln in stale.splitlines() if ln.startswith("  ")] == [f"  line 3: {MOD}:Box.gone"]
    assert f"{MOD}:public (lines 9, 13; branches 8->9, 12->exit, 12->13): error path" in out


def test_the_audit_passes_when_every_item_has_a_used_reason(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (root / "allow.txt").write_text(f"{MOD}: r1\n{OTHER}:go: r2\n")
    (root / "cov.json").write_text(json.dumps(report()))
    rc = main([str(root / "cov.json"), "--allow", str(root / "allow.txt"), "--root", str(root)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "FAIL" not in out
    assert f"{MOD}: 3 functions, 8 lines/branches: r1" in out


def test_package_figures_count_lines_and_branches_together() -> None:
    # demo: (20 + 5 + 3 + 1) / (28 + 10 + 4 + 2) = 29 / 44; other: 0 / 2
    got = {pkg: (cov, total) for pkg, _, cov, total in package_totals(report())}
    assert got == {"demo": (29, 44), "other": (0, 2)}


def test_an_entry_without_a_reason_is_refused() -> None:
    with pytest.raises(ValueError, match="line 2"):
        parse_allow("# ok\npackages/x/src/a.py\n")


def test_compress_writes_runs() -> None:
    assert compress([9, 3, 4, 5, 11]) == "3-5, 9, 11"
    assert compress([]) == ""


def test_a_stale_entry_alone_is_listed_but_does_not_fail(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (root / "allow.txt").write_text(f"{MOD}: r1\n{OTHER}:go: r2\n{MOD}:Box.gone: renamed\n")
    (root / "cov.json").write_text(json.dumps(report()))
    rc = main([str(root / "cov.json"), "--allow", str(root / "allow.txt"), "--root", str(root)])
    out = capsys.readouterr().out
    assert rc == 0 and "FAIL" not in out
    assert f"  line 3: {MOD}:Box.gone" in out.split("STALE: allow-list")[1]
