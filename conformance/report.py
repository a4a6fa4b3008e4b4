"""Run the conformance suite and write a report: ``python -m conformance.report --out NAME``.

Writes ``NAME.md`` (readable on its own: a table per area, then every divergence with its
shrunk example, the rule it breaks, what the spec says, what the implementation did and the
upstream issue when known) and ``NAME.json``. Extra arguments go to pytest. Exits 0 when the
suite ran, whatever it found: this is a report, not a gate.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
RULE_HEADING = re.compile(r"^###\s+([A-Z][A-Z0-9]*-\d+)\s*[:—-]\s*(.+?)\s*$")


def read_rules() -> dict[str, str]:
    rules: dict[str, str] = {}
    for path in sorted((ROOT / "spec").glob("*.md")):
        for line in path.read_text().splitlines():
            m = RULE_HEADING.match(line)
            if m:
                rules[m.group(1)] = f"{m.group(2)} ({path.name})"
    return rules


@dataclass
class Case:
    test: str
    area: str
    rules: list[str]
    outcome: str  # passed | diverged | unsupported | skipped | error
    known: bool = False
    issue: str | None = None
    reason: str | None = None
    message: str | None = None
    example: str | None = None
    unsupported_examples: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def _area(nodeid: str) -> str:
    stem = Path(nodeid.split("::")[0]).stem
    return stem.removeprefix("test_")


def _example(exc: BaseException | None) -> str | None:
    if exc is None:
        return None
    notes = list(getattr(exc, "__notes__", []))
    for sub in getattr(exc, "exceptions", []):  # several distinct failures
        notes += list(getattr(sub, "__notes__", []))
    keep = [
        n
        for n in notes
        if not n.lstrip().startswith(("Explanation", "You can reproduce", "These lines were"))
    ]
    text = "\n".join(keep).strip()
    text = re.sub(r"\n\s*(Explanation:|These lines were always).*", "", text, flags=re.S)
    return _tidy_example(text) or None


# Lines of Hypothesis's falsifying-example note that say nothing about the case: the fixtures
# (adapter object, pool getter) and the source locations it lists.
_NOISE = re.compile(r"^\s*(impl=<.*>,|pools=\w+,|/\S+\.py:\d+)\s*$")


def _tidy_example(text: str) -> str:
    lines = [ln.replace("  # or any other generated value", "") for ln in text.splitlines()]
    return "\n".join(ln for ln in lines if not _NOISE.match(ln)).strip()


def _rank_errors(text: str) -> str | None:
    """A RankError's per-rank tracebacks, each reduced to the exception line; ranks that raised
    the same thing are listed together."""
    parts = re.split(r"^--- rank (\d+) \((\w+)\) ---$", text, flags=re.M)
    if len(parts) < 4:
        return None
    by_error: dict[str, list[str]] = {}
    for i in range(1, len(parts) - 2, 3):
        rank, phase, body = parts[i], parts[i + 1], parts[i + 2]
        lines = [ln for ln in body.strip().splitlines() if ln.strip()]
        last = next(
            (ln for ln in reversed(lines) if re.match(r"^[\w.]+(Error|Exception)\b", ln)),
            lines[-1] if lines else "",
        )
        by_error.setdefault(f"({phase}) {last.strip()}", []).append(rank)
    head = parts[0].strip().splitlines()[0]
    out = [head] + [
        f"  {'rank' if len(rs) == 1 else 'ranks'} {', '.join(rs)} {err}"
        for err, rs in by_error.items()
    ]
    return "\n".join(out)


def _message(exc: BaseException | None) -> str | None:
    if exc is None:
        return None
    excs = list(getattr(exc, "exceptions", [])) or [exc]
    lines = []
    for e in excs:
        ranks = _rank_errors(str(e)) if type(e).__name__ == "RankError" else None
        if ranks is not None:
            lines.append(f"RankError: {ranks}")
            continue
        first = str(e).strip().splitlines()
        head = first[0] if first else ""
        if len(first) > 1 and not re.search(r"=.*but should be", head):
            head = "\n".join(first[:12])  # a rank's traceback: keep its tail readable
        lines.append(f"{type(e).__name__}: {head}")
    return "\n".join(lines)


class Collector:
    def __init__(self) -> None:
        self.cases: dict[str, Case] = {}

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Iterator[Any]:
        rep = yield
        rules = [r for m in item.iter_markers("rule") for r in m.args]
        known = next(iter(item.iter_markers("known_defect")), None)
        case = self.cases.get(item.nodeid)
        if case is None:
            case = self.cases[item.nodeid] = Case(item.nodeid, _area(item.nodeid), rules, "passed")
        if rep.when == "call":
            case.seconds = rep.duration
            for key, value in item.user_properties:
                if key == "unsupported":
                    case.unsupported_examples = value
        exc = call.excinfo.value if call.excinfo is not None else None
        if rep.skipped and not hasattr(rep, "wasxfail"):
            reason = str(rep.longrepr[2]) if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
            reason = reason.removeprefix("Skipped: ")
            case.outcome = "unsupported" if "unsupported by" in reason else "skipped"
            case.reason = reason
        elif hasattr(rep, "wasxfail") and rep.skipped:  # a known defect reproduced
            case.outcome = "diverged"
            case.known = True
            case.reason = rep.wasxfail
            case.issue = known.kwargs.get("issue") if known else None
            case.message, case.example = _message(exc), _example(exc)
        elif rep.failed:
            if rep.when == "call":
                case.outcome = "diverged"
                case.message, case.example = _message(exc), _example(exc)
                if hasattr(rep, "wasxfail") or "XPASS" in str(rep.longrepr):
                    case.outcome = "passed"
                    case.reason = "known defect no longer reproduces (strict xfail passed)"
            else:
                case.outcome = "error"
                case.message = _message(exc) or str(rep.longrepr)[-2000:]
        return rep


def render(impl: str, cases: list[Case], seconds: float) -> str:
    rules = read_rules()
    areas: dict[str, list[Case]] = {}
    for c in cases:
        areas.setdefault(c.area, []).append(c)
    out = [
        f"# Conformance report: `{impl}`",
        "",
        f"The shardspec conformance suite run against `{impl}` "
        f"({len(cases)} tests, {seconds:.0f} s). Each test is a property checked on up to "
        "the Hypothesis profile's number of examples; a divergence is a test that found a case "
        "where the implementation breaks a rule of the spec, shrunk to a minimal example.",
        "",
        "| area | passed | diverged | of which known | unsupported | other |",
        "|---|---|---|---|---|---|",
    ]
    for area, cs in sorted(areas.items()):
        n = {k: sum(c.outcome == k for c in cs) for k in ("passed", "diverged", "unsupported")}
        known = sum(c.known for c in cs)
        other = len(cs) - sum(n.values())
        out.append(
            f"| {area} | {n['passed']} | {n['diverged']} | {known} | {n['unsupported']} | {other} |"
        )
    for area, cs in sorted(areas.items()):
        out += ["", f"## {area}", "", "| test | rules | outcome |", "|---|---|---|"]
        for c in cs:
            name = c.test.split("::", 1)[1]
            what = c.outcome + (" (known)" if c.known else "")
            if c.outcome in ("unsupported", "skipped") and c.reason:
                what += f": {c.reason}"
            if c.unsupported_examples and c.outcome != "unsupported":
                total = sum(c.unsupported_examples.values())
                what += f"; {total} example(s) unsupported: " + "; ".join(c.unsupported_examples)
            out.append(f"| `{name}` | {', '.join(c.rules)} | {what} |")
    divergences = [c for c in cases if c.outcome in ("diverged", "error")]
    if divergences:
        out += [
            "",
            "## Summary of divergences",
            "",
            "| # | test | rules | known defect | upstream issue/PR |",
            "|---|---|---|---|---|",
        ]
        for i, c in enumerate(divergences, 1):
            name = c.test.split("::", 1)[1]
            kind = "yes" if c.known else ("error" if c.outcome == "error" else "new")
            out.append(
                f"| [{i}](#{i}) | `{name}` | {', '.join(c.rules)} | {kind} | {c.issue or '-'} |"
            )
    out += ["", "## Divergences", ""]
    if not divergences:
        out.append("None.")
    for i, c in enumerate(divergences, 1):
        out += [f'<a id="{i}"></a>', f"### {i}. `{c.test}`", ""]
        for r in c.rules:
            out.append(f"- **Breaks {r}**, which says: {rules.get(r, '(not in spec/)')}")
        if c.known:
            reason = (c.reason or "").removeprefix("upstream: ")
            out.append(f"- **Known upstream defect**: {reason}")
        out.append(f"- **Upstream issue/PR**: {c.issue or 'none known'}")
        out += ["", f"What `{impl}` did:", "", "```", (c.message or "").strip(), "```"]
        if c.example:
            out += ["", "Minimal (shrunk) example:", "", "```", c.example, "```"]
        out.append("")
    if impl == "torch":
        out += _performance_section(rules)
    return "\n".join(out).rstrip() + "\n"


# Upstream defects that are about cost, not correctness: tests never assert wall-clock, so
# they are measured by the benchmarks (`nox -s bench`) and listed here with where to look.
PERFORMANCE = [
    (
        "LAYOUT-4",
        "torch's N-D overlap check (`validate_non_overlapping_shards_metadata`) grows as "
        "n^1.5 on grid layouts: 3.1 s for a 316x316 grid when recorded",
        "packages/metadata/benchmarks/bench_validate.py",
    ),
    (
        "RESHARD-7",
        "DCP read planning (`create_read_items_for_chunk_list`) is O(n*m): 4.9 s and 0.8 GB "
        "for 1000 row chunks read as 1000 column chunks, 24 s and 3.2 GB at 2000 when recorded",
        "none yet: bench_reshard.py times our planner against a naive all-pairs one, not DCP's",
    ),
    (
        "RESHARD-2",
        "DTensor `Shard(0) -> Shard(1)` on CPU falls back to all-gather + chunk: peak memory "
        "twice the global tensor, 3-9x slower than one `all_to_all_single` when recorded",
        "packages/reshard/benchmarks/bench_reshard.py",
    ),
]


def _performance_section(rules: dict[str, str]) -> list[str]:
    out = [
        "## Performance divergences",
        "",
        "Not checked by the suite (no test asserts wall-clock time); the figures were measured "
        "when the defects were recorded (shared/DESIGN.md section 6), and `nox -s bench` "
        "measures them again as ratios against shardspec in the same run.",
        "",
        "| rule | what upstream does | benchmark |",
        "|---|---|---|",
    ]
    for rule, what, bench in PERFORMANCE:
        where = f"`{bench}`" if bench.endswith(".py") else bench
        out.append(f"| {rule}: {rules.get(rule, '')} | {what} | {where} |")
    return out + [""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="conformance-report", help="output path without suffix")
    args, rest = parser.parse_known_args(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from conformance.impls import impl_name

    collector = Collector()
    t0 = time.monotonic()
    code = pytest.main(
        [str(ROOT / "conformance" / "tests"), "-p", "no:cacheprovider", "-q", *rest],
        plugins=[collector],
    )
    seconds = time.monotonic() - t0
    cases = list(collector.cases.values())
    impl = impl_name()
    out = Path(args.out)
    out.with_suffix(".md").write_text(render(impl, cases, seconds))
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "impl": impl,
                "pytest_exit_code": int(code),
                "seconds": round(seconds, 1),
                "cases": [asdict(c) for c in cases],
            },
            indent=2,
        )
    )
    print(f"conformance report: {out.with_suffix('.md')} and {out.with_suffix('.json')}")
    ran = int(code) in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)
    return 0 if ran else int(code)


if __name__ == "__main__":
    sys.exit(main())
