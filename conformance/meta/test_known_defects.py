"""Every known-defect mark of the suite names the failure it expects (CONF-14): a mark without
``raises=`` and ``match=`` would let any exception (a library that did not load, a pool
timeout, a typo in the harness) count as the defect reproduced."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parents[1] / "tests"
# failures no known defect is: each mark's pattern must refuse them
UNRELATED = [
    ImportError("No module named 'torchrec'"),
    OSError("libfbgemm.so: undefined symbol: _ZN3c1015report_overflowEPKc"),
    TypeError("fsdp_tp_chunks() missing 1 required positional argument: 'hook'"),
    AssertionError(
        "rank(s) [0, 1] did not answer within 10 s (SHARDSPEC_POOL_TIMEOUT) in a pool of 2 "
        "[reshard(...)]; the pool was torn down and restarts on the next call"
    ),
]


def _module(path: Path) -> ModuleType:
    # by its package name, as pytest imports it: a test module imports its siblings relatively
    return importlib.import_module(f"conformance.tests.{path.stem}")


def _marks_in(module: ModuleType) -> list[Any]:
    """The known_defect marks of a test module's functions, those of its parameters too; a
    mark written once and put on several tests (a module's shared mark) counts once."""
    found: dict[int, Any] = {}
    for fn in vars(module).values():
        for mark in getattr(fn, "pytestmark", []) if callable(fn) else []:
            if mark.name == "known_defect":
                found[id(mark)] = mark
            if mark.name == "parametrize":
                for param in mark.args[1]:
                    for m in getattr(param, "marks", ()):
                        if m.name == "known_defect":
                            found[id(m)] = m
    return list(found.values())


def _written(path: Path) -> int:
    """How many ``known_defect(...)`` calls the source has: the import must find them all."""
    tree = ast.parse(path.read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    return sum(ast.unparse(c.func).endswith("known_defect") for c in calls)


FILES = sorted(p for p in TESTS.glob("test_*.py") if _written(p))


@pytest.mark.rule("CONF-14")
def test_the_reader_finds_the_marks() -> None:
    # the suite has over 30 known defects; a reader that finds none would pass everything
    assert sum(_written(p) for p in FILES) > 30


@pytest.mark.rule("CONF-14")
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_known_defect_states_its_failure(path: Path) -> None:
    marks = _marks_in(_module(path))
    assert len(marks) == _written(path), f"{path.name}: found {len(marks)} of the marks"
    for mark in marks:
        reason = mark.args[1][:60] if len(mark.args) > 1 else mark.kwargs.get("reason")
        where = f"{path.name}: known_defect({reason!r}...)"
        missing = [k for k in ("raises", "match") if k not in mark.kwargs]
        assert not missing, f"{where} has no {' and no '.join(missing)}="
        raises, pattern = mark.kwargs["raises"], mark.kwargs["match"]
        kinds = raises if isinstance(raises, tuple) else (raises,)
        assert kinds and all(isinstance(k, type) and issubclass(k, BaseException) for k in kinds)
        assert isinstance(pattern, str) and pattern.strip(), f"{where}: match= is not a pattern"
        for error in UNRELATED:
            assert not re.search(pattern, str(error)), f"{where}: match= accepts {error!r}"
