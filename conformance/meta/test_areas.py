"""Every chapter of spec/ has a conformance area: some test in ``conformance/tests`` cites one
of its rules and runs the implementation under test through the adapter (the ``impl``
fixture). A chapter the suite never reaches is a class of bug no implementation is checked
for, which is how the serialization and flattening rules went unchecked."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Chapters about the suite itself: their rules are checked by conformance/meta.
SUITE_CHAPTERS = {"05-conformance.md"}


def _trace() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spec_trace", ROOT / "spec" / "trace.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TRACE = _trace()
RULES: dict[str, tuple[str, str]] = TRACE.read_rules()
CITES: dict[str, list[str]] = TRACE.read_citations()
CHAPTERS = sorted({chapter for chapter, _ in RULES.values()} - SUITE_CHAPTERS)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_chapter_has_a_conformance_area(chapter: str) -> None:
    cited = {
        test: [r for r in rules if RULES.get(r, ("",))[0] == chapter]
        for test, rules in CITES.items()
        if test.startswith("conformance/tests/")
    }
    tests = [t for t, rules in cited.items() if rules]
    assert tests, (
        f"no test in conformance/tests cites a rule of spec/{chapter}: add an area "
        f"(conformance/tests/test_<area>.py) that runs the implementation through the adapter"
    )


def _test_functions(path: Path) -> list[ast.FunctionDef]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test")
    ]


@pytest.mark.parametrize(
    "path", sorted((ROOT / "conformance" / "tests").glob("test_*.py")), ids=lambda p: p.name
)
def test_every_conformance_test_runs_the_implementation_under_test(path: Path) -> None:
    lazy = [f.name for f in _test_functions(path) if "impl" not in {a.arg for a in f.args.args}]
    assert not lazy, f"{path.name}: {lazy} do not take the impl fixture"


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


# The suite's operation modules (conformance/ops/) and each peer's (peers/<name>/*ops.py).
OPS_MODULES = sorted(
    [
        *(p for p in (ROOT / "conformance" / "ops").glob("*.py") if p.name != "__init__.py"),
        *(ROOT / "conformance" / "peers").glob("*/*ops.py"),
    ]
)
SHARED = "conformance.ops.shared"


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def test_the_operation_modules_are_found() -> None:
    names = {_module(p) for p in OPS_MODULES}
    assert {"conformance.ops.pool", "conformance.ops.checkpoint", SHARED} <= names
    assert {"conformance.peers.megatron.ops", "conformance.peers.megatron.refit_ops"} <= names


@pytest.mark.parametrize("path", OPS_MODULES, ids=_module)
def test_operation_modules_import_no_area_but_the_shared_one(path: Path) -> None:
    """Areas register their operations themselves and share only ``conformance.ops.shared``:
    an area importing another (or ``ops/pool.py`` importing the areas) is the circle of issue
    22."""
    areas = {_module(p) for p in OPS_MODULES} - {SHARED}
    wrong = sorted((_imported_modules(path) & areas) - {_module(path)})
    assert not wrong, f"{path.name} imports {wrong}; share through {SHARED}"


def test_every_operation_module_is_imported_by_the_pools() -> None:
    from conformance import OPS
    from conformance.impls import BUILTINS

    areas = {_module(p) for p in OPS_MODULES} - {SHARED}
    # a peer's operations are its adapter's rank_ops, imported only while it is under test
    peers = set()
    for target in BUILTINS.values():
        module, _, cls = target.partition(":")
        peers |= set(getattr(importlib.import_module(module), cls).rank_ops)
    assert areas == set(OPS) | peers, f"conformance.OPS {OPS} is not the operation modules {areas}"
    # a peer's operations import its package, which the default environment lacks
    assert not peers & set(OPS), f"{sorted(peers & set(OPS))} are imported by every pool"
