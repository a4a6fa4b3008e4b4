"""The report's divergence entries: suite failures folded per defect, joined with the repros.

One entry per defect, never one per world size or per parametrization: the suite's failing
cases are grouped first by the repro whose ``DEFECT["tests"]`` names their test, then (for
divergences no repro explains) by test function. Each entry names the one rule it breaks: the
repro's, or the rule tag of the failing assertion (``... [example] (breaks RULE-N)``), or the
test's rule when it cites a single one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RULE_TAG = re.compile(r"\(breaks ([A-Z][A-Z0-9]*-\d+)\)")
WORLD = re.compile(r"\bworld(?:_size)?\s*[=:]\s*(\d+)")
PARAM = re.compile(r"\[(.+)\]$")


@dataclass
class Instance:
    """One failing (or passing, for a known defect that no longer shows) suite case."""

    test: str
    outcome: str
    message: str | None
    example: str | None
    world_sizes: list[int]


@dataclass
class Entry:
    id: str
    area: str
    rule: str | None
    rules_cited: list[str]
    title: str
    upstream: str | None
    world_sizes: list[int]
    repro: str | None
    reproduced: bool
    repro_outcome: str | None = None
    torch_does: str | None = None
    spec_says: str | None = None
    issue_text: str | None = None
    divergences: list[str] = field(default_factory=list)
    boxes: list[dict[str, Any]] = field(default_factory=list)
    instances: list[Instance] = field(default_factory=list)
    known: bool = False
    kind: str = "correctness"
    probe: str | None = None
    perf: list[dict[str, Any]] = field(default_factory=list)
    checked: str | None = None  # a claim checked and found to agree (DEFECT["checked"])

    def as_json(self) -> dict[str, Any]:
        """The report.json object: the fields a script reads first, then the detail."""
        return {
            "id": self.id,
            "area": self.area,
            "rule": self.rule,
            "upstream": self.upstream,
            "world_sizes": self.world_sizes,
            "repro": self.repro,
            "reproduced": self.reproduced,
            "repro_outcome": self.repro_outcome,
            "title": self.title,
            "torch_does": self.torch_does,
            "spec_says": self.spec_says,
            "known": self.known,
            "kind": self.kind,
            "checked": self.checked,
            "issue_text": self.issue_text,
            "divergences": self.divergences,
            "boxes": self.boxes,
            "instances": [vars(i) for i in self.instances],
        }


def function_of(nodeid: str) -> str:
    """``conformance/tests/test_x.py::test_y[2]`` -> ``test_x.py::test_y``."""
    path, _, name = nodeid.partition("::")
    return f"{Path(path).name}::{PARAM.sub('', name)}"


def world_sizes_of(nodeid: str, example: str | None, message: str | None) -> list[int]:
    found = {int(w) for text in (example, message) if text for w in WORLD.findall(text)}
    param = PARAM.search(nodeid.partition("::")[2])
    if param and param.group(1).isdigit() and "world" in nodeid:
        found.add(int(param.group(1)))
    return sorted(found)


def violated_rule(message: str | None, cited: list[str]) -> str | None:
    """The rule of the failing assertion, else the one rule the test cites, else None."""
    tags = RULE_TAG.findall(message or "")
    if tags:
        return str(tags[0])
    return cited[0] if len(cited) == 1 else None


def _instance(case: Any) -> Instance:
    return Instance(
        case.test,
        case.outcome,
        case.message,
        case.example,
        world_sizes_of(case.test, case.example, case.message),
    )


def build_entries(
    cases: list[Any], defects: list[dict[str, Any]], repro_results: dict[str, Any]
) -> list[Entry]:
    """``cases``: the suite's Case records; ``defects``: every repro's DEFECT literal;
    ``repro_results``: ReproResult by id (missing when the repros were not run)."""
    owner = {t: d["id"] for d in defects for t in d.get("tests", [])}
    by_defect: dict[str, list[Any]] = {d["id"]: [] for d in defects}
    unexplained: dict[str, list[Any]] = {}
    for c in cases:
        fn = function_of(c.test)
        if fn in owner:
            by_defect[owner[fn]].append(c)
        elif c.outcome in ("diverged", "error"):
            unexplained.setdefault(fn, []).append(c)

    entries: list[Entry] = []
    for d in defects:
        res = repro_results.get(d["id"])
        found = [c for c in by_defect[d["id"]] if c.outcome in ("diverged", "error")]
        worlds = {w for c in found for w in world_sizes_of(c.test, c.example, c.message)}
        if res is not None and res.reproduced:
            worlds.add(res.nproc)
        entries.append(
            Entry(
                id=d["id"],
                area=d["area"],
                rule=d["rule"],
                rules_cited=sorted({r for c in found for r in c.rules} | {d["rule"]}),
                title=d["title"],
                upstream=d["upstream"],
                world_sizes=sorted(worlds) or [int(d["nproc"])],
                repro=f"repro/{d['id']}.py",
                reproduced=bool(res is not None and res.reproduced),
                repro_outcome=None if res is None else res.outcome,
                torch_does=d["torch_does"],
                spec_says=d["spec_says"],
                issue_text=d.get("issue_text"),
                divergences=[] if res is None else list(res.divergences),
                boxes=[] if res is None else list(res.boxes),
                instances=[_instance(c) for c in by_defect[d["id"]]],
                known=True,
                kind=d.get("kind", "correctness"),
                probe=d.get("probe"),
                perf=[] if res is None else list(res.perf),
                checked=d.get("checked"),
            )
        )
    for fn, cs in sorted(unexplained.items()):
        first = cs[0]
        worlds = sorted({w for c in cs for w in world_sizes_of(c.test, c.example, c.message)})
        rule = violated_rule(first.message, first.rules)
        entry = Entry(
            id="suite-" + fn.split("::")[1].removeprefix("test_").replace("_", "-"),
            area=first.area,
            rule=rule,
            rules_cited=sorted({r for c in cs for r in c.rules}),
            title=f"{fn} diverges" + (f" ({first.reason})" if first.reason else ""),
            upstream=_issue_ref(first.issue),
            world_sizes=worlds,
            repro=None,
            reproduced=False,
            instances=[_instance(c) for c in cs],
            known=bool(first.known),
        )
        if entry.upstream is None:
            entry.issue_text = draft_issue(entry)
        entries.append(entry)
    return entries


def _issue_ref(issue: str | None) -> str | None:
    if not issue:
        return None
    return issue if issue.startswith(("pytorch", "torchrec")) else f"pytorch {issue}"


def draft_issue(entry: Entry) -> str:
    """A ready-to-file issue body for a divergence no upstream issue covers yet."""
    inst = entry.instances[0]
    lines = [
        f"### {entry.title}",
        "",
        f"Found by the shardspec conformance suite (`{inst.test}`), which checks the rule "
        f"{entry.rule or ', '.join(entry.rules_cited)}.",
        "",
        "**What torch did**",
        "",
        "```",
        (inst.message or "").strip(),
        "```",
    ]
    if inst.example:
        lines += ["", "**Minimal example (shrunk by Hypothesis)**", "", "```", inst.example, "```"]
    if entry.world_sizes:
        lines += ["", f"Seen at world sizes {', '.join(map(str, entry.world_sizes))}."]
    return "\n".join(lines)
