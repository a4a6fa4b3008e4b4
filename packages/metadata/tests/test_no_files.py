"""shardspec.metadata is the layout model: it opens no file and installs no command (reading and
writing checkpoints is shardspec.checkpoint's). Checked on the source, so that a new module that
reaches for the file system fails here, not in a user's sandbox."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import tomllib

PACKAGE = Path(__file__).resolve().parents[1]
SOURCES = sorted((PACKAGE / "src" / "shardspec" / "metadata").glob("*.py"))
# modules whose only purpose is files, processes or a command line
FILE_MODULES = {"pathlib", "shutil", "tempfile", "mmap", "glob", "argparse", "subprocess", "io"}
FILE_CALLS = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "fdopen"}
LOADERS = {"torch", "pickle", "json", "numpy", "np"}  # X.load(file)


def _file_uses(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in FILE_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in FILE_MODULES:
                found.append(node.module)
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in FILE_CALLS:
                found.append(f"{f.id}() at line {node.lineno}")
            elif isinstance(f, ast.Attribute) and f.attr in FILE_CALLS:
                found.append(f".{f.attr}() at line {node.lineno}")
            elif (
                isinstance(f, ast.Attribute)
                and f.attr == "load"
                and isinstance(f.value, ast.Name)
                and f.value.id in LOADERS
            ):
                found.append(f"{f.value.id}.load() at line {node.lineno}")
    return found


@pytest.mark.rule("CONVERT-12")
def test_the_sources_are_found() -> None:
    names = {p.stem for p in SOURCES}
    assert {"box", "layout", "validate", "dcp"} <= names, names


@pytest.mark.rule("CONVERT-12")
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_no_module_of_metadata_opens_a_file(source: Path) -> None:
    uses = _file_uses(ast.parse(source.read_text(), str(source)))
    assert uses == [], f"{source.name} reaches for files or a command line: {uses}"


@pytest.mark.rule("CONVERT-12")
def test_the_check_sees_a_file_read() -> None:
    # the check itself can fail: each way of reading a file is caught
    for code in (
        "open('x')",
        "from pathlib import Path",
        "import io",
        "p.read_text()",
        "torch.load(f)",
    ):
        assert _file_uses(ast.parse(code)), code


@pytest.mark.rule("CONVERT-12")
def test_the_distribution_installs_no_command() -> None:
    project = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]
    assert "scripts" not in project and "entry-points" not in project, project.keys()
