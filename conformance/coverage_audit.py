"""The audit `nox -s coverage` runs after `coverage json`: every line and branch of a public
function in packages/*/src that the conformance suite leaves uncovered must have a reason in
conformance/coverage-allow.txt; entries that match nothing are listed as stale.

Allow-list lines read `KEY: reason` (`#` starts a comment). KEY is a path glob (a whole
module the suite does not run by design) or `path-glob:Qualified.name` (one public function
or method, all its uncovered lines and branches; the name may be a glob too). Entries are
keyed by name, not by line number, so they survive edits; a function entry wins over a
module entry for the same code, and an entry that no uncovered code picks is stale.

Public: a function whose qualified name (classes, then the outermost function: code in a
nested function counts as its enclosing function's) has no component with a leading
underscore (dunders such as `__init__` are public), in a module whose own path has none.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Entry:
    path: str
    func: str | None  # None: the whole module
    reason: str
    lineno: int

    @property
    def key(self) -> str:
        return self.path if self.func is None else f"{self.path}:{self.func}"


@dataclass
class Uncovered:
    """What one public function leaves uncovered."""

    path: str
    func: str
    lines: list[int] = field(default_factory=list)
    branches: list[tuple[int, int]] = field(default_factory=list)

    def describe(self) -> str:
        parts = []
        if self.lines:
            parts.append("lines " + compress(self.lines))
        if self.branches:
            arcs = [f"{a}->{'exit' if b < 0 else b}" for a, b in sorted(self.branches)]
            parts.append("branches " + ", ".join(arcs))
        return f"{self.path}:{self.func} ({'; '.join(parts)})"


def compress(lines: Iterable[int]) -> str:
    """`3-5, 9` for [3, 4, 5, 9]: ranges of consecutive numbers."""
    out: list[str] = []
    run: list[int] = []
    for n in sorted(lines):
        if run and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [n]
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ", ".join(out)


def parse_allow(text: str) -> list[Entry]:
    entries = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, reason = line.partition(": ")
        if not sep or not reason.strip():
            raise ValueError(f"allow list line {lineno}: `KEY: reason` expected, got {raw!r}")
        path, colon, func = key.strip().partition(":")
        entries.append(Entry(path, func if colon else None, reason.strip(), lineno))
    return entries


def is_public_name(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def is_public_module(path: str) -> bool:
    """Only the parts below `src/` count: `packages/x/src/shardspec/x/_impl.py` is private."""
    parts = Path(path).with_suffix("").parts
    below = parts[parts.index("src") + 1 :] if "src" in parts else parts
    return all(is_public_name(p) for p in below)


def function_spans(source: str) -> list[tuple[int, int, str]]:
    """(first body line, last line, owner) of every function, where owner is the qualified
    name up to the outermost function. Default values and decorators run at definition
    time, so they belong to the enclosing scope, not to the function."""
    spans: list[tuple[int, int, str]] = []

    def visit(nodes: Iterable[ast.stmt], prefix: list[str], owner: str | None) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = owner or ".".join([*prefix, node.name])
                end = node.end_lineno or node.body[-1].lineno
                spans.append((node.body[0].lineno, end, name))
                visit(node.body, [*prefix, node.name], name)
            elif isinstance(node, ast.ClassDef):
                visit(node.body, [*prefix, node.name], owner)
            else:
                # compound statements (if/try/with at module level) may hold definitions
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.stmt):
                        visit([child], prefix, owner)

    visit(ast.parse(source).body, [], None)
    return spans


def owner_of(line: int, spans: list[tuple[int, int, str]]) -> str | None:
    """The innermost span holding the line; owners nest, so its owner is the outermost
    function's."""
    best: tuple[int, int, str] | None = None
    for span in spans:
        if span[0] <= line <= span[1] and (best is None or span[0] >= best[0]):
            best = span
    return best[2] if best else None


def uncovered_public(report: dict[str, object], root: Path) -> tuple[list[Uncovered], int]:
    """Per public function, its uncovered lines and branches; and how many uncovered lines
    and branches lie outside any public function (private code, module and class bodies)."""
    files = report["files"]
    assert isinstance(files, dict)
    found: dict[tuple[str, str], Uncovered] = {}
    elsewhere = 0
    for path, data in sorted(files.items()):
        missing_lines: list[int] = data.get("missing_lines", [])
        missing_branches = [(a, b) for a, b in data.get("missing_branches", [])]
        if not missing_lines and not missing_branches:
            continue
        spans = function_spans((root / path).read_text()) if is_public_module(path) else []
        points: list[tuple[int, tuple[int, int] | None]] = [(n, None) for n in missing_lines]
        points += [(a, (a, b)) for a, b in missing_branches]
        for line, branch in points:
            owner = owner_of(line, spans)
            if owner is None or not all(is_public_name(p) for p in owner.split(".")):
                elsewhere += 1
                continue
            got = found.setdefault((path, owner), Uncovered(path, owner))
            if branch is None:
                got.lines.append(line)
            else:
                got.branches.append(branch)
    return list(found.values()), elsewhere


def choose(item: Uncovered, entries: list[Entry]) -> Entry | None:
    """A function entry first, then a module entry; the first in the file of its kind."""
    in_module = [e for e in entries if fnmatch.fnmatchcase(item.path, e.path)]
    for e in in_module:
        if e.func is not None and fnmatch.fnmatchcase(item.func, e.func):
            return e
    return next((e for e in in_module if e.func is None), None)


@dataclass
class Audit:
    reasons: list[tuple[Uncovered, Entry]]
    missing: list[Uncovered]
    stale: list[Entry]
    elsewhere: int

    @property
    def ok(self) -> bool:
        # A stale entry is listed, not failed: which error paths a run happens to reach (a
        # pool restarted after a timeout on a slow machine) differs from machine to machine,
        # and an unneeded reason hides no uncovered code.
        return not self.missing


def audit(report: dict[str, object], entries: list[Entry], root: Path) -> Audit:
    items, elsewhere = uncovered_public(report, root)
    reasons, missing, used = [], [], set()
    for it in items:
        entry = choose(it, entries)
        if entry is None:
            missing.append(it)
        else:
            reasons.append((it, entry))
            used.add(entry)
    stale = [e for e in entries if e not in used]
    return Audit(reasons, missing, stale, elsewhere)


def package_totals(report: dict[str, object]) -> Iterator[tuple[str, float, int, int]]:
    """(package, percent, covered, total) with coverage's own formula: covered lines and
    branches over statements and branches."""
    sums: dict[str, list[int]] = {}
    files = report["files"]
    assert isinstance(files, dict)
    for path, data in files.items():
        parts = Path(path).parts
        pkg = parts[1] if parts[0] == "packages" and len(parts) > 1 else parts[0]
        s = data["summary"]
        acc = sums.setdefault(pkg, [0, 0])
        acc[0] += s["covered_lines"] + s.get("covered_branches", 0)
        acc[1] += s["num_statements"] + s.get("num_branches", 0)
    for pkg, (cov, total) in sorted(sums.items()):
        yield pkg, 100.0 * cov / total if total else 100.0, cov, total


def render(result: Audit, report: dict[str, object]) -> str:
    out = ["Branch coverage by package (covered lines+branches / statements+branches):"]
    for pkg, pct, cov, total in package_totals(report):
        out.append(f"  {pkg:<10} {pct:5.1f}%  {cov}/{total}")
    by_entry: dict[Entry, list[Uncovered]] = {}
    for it, e in result.reasons:
        by_entry.setdefault(e, []).append(it)
    out.append("Uncovered code of public functions, with the reason (coverage-allow.txt):")
    for e, its in sorted(by_entry.items(), key=lambda kv: kv[0].lineno):
        if e.func is None:
            n = sum(len(i.lines) + len(i.branches) for i in its)
            out.append(f"  {e.key}: {len(its)} functions, {n} lines/branches: {e.reason}")
        else:
            out.extend(f"  {it.describe()}: {e.reason}" for it in its)
    out.append(f"  ({result.elsewhere} uncovered lines/branches outside public functions)")
    if result.missing:
        out.append("FAIL: uncovered code of public functions with no reason; add a conformance")
        out.append("case or a `path:Function: reason` line to conformance/coverage-allow.txt:")
        out.extend(f"  {it.describe()}" for it in result.missing)
    if result.stale:
        out.append("STALE: allow-list entries that match no uncovered code in this run; remove")
        out.append("them unless another machine's run needs them:")
        out.extend(f"  line {e.lineno}: {e.key}" for e in result.stale)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("report", type=Path, help="the output of `coverage json`")
    ap.add_argument("--allow", type=Path, default=Path("conformance/coverage-allow.txt"))
    ap.add_argument("--root", type=Path, default=Path("."))
    args = ap.parse_args(argv)
    report = json.loads(args.report.read_text())
    result = audit(report, parse_allow(args.allow.read_text()), args.root)
    print(render(result, report))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
