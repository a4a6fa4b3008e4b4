"""One upstream report over several torch releases: ``python -m conformance.report.matrix``.

``nox -s report_matrix -- --torch=2.13.0,2.14.1,2.15.0`` runs ``nox -s conformance_upstream``
once per release (the suite against torch, every repro, the probes; each in that release's
own venv) into ``DIR/torch-<release>/`` and then merges the ``report.json`` files with this
module into ``DIR/matrix.md`` and ``DIR/matrix.json``: one row per known defect (every repro
of ``conformance/repros``, and every divergence the suite found without one) and one verdict
per release:

- ``reproduced``: the repro printed DIVERGES, or a known-defect test failed as it expects;
- ``fixed``: the repro exited 0 on every rank and no test of the defect failed (a strict
  xfail that passes is a fix, not a red run);
- ``not reproduced``: the same, for a claim that was checked and never reproduced (a repro
  whose ``DEFECT["checked"]`` says so): there was nothing to fix;
- ``different failure``: the repro failed without diverging (crashed, timed out), or a test
  of the defect failed in a way its known-defect mark does not expect;
- ``skipped``: the repro said it cannot run on that release (a package that does not load);
- ``not run``: neither the repro nor a test of it ran on that release.

The last column names the first release whose verdict differs from the one before it. Each
repro is copied to ``DIR/repro/`` with a header naming the releases it was run on and what it
did on each. Standard library only: the merge runs outside any torch venv.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERDICTS = ("reproduced", "different failure", "fixed", "not reproduced", "skipped", "not run")
REPROS = Path(__file__).resolve().parents[1] / "repros"


def release_key(release: str) -> tuple[int, ...]:
    """``2.14.1+cu130`` -> (2, 14, 1): releases sort by number, not as text."""
    return tuple(int(p) for p in re.findall(r"\d+", release.split("+")[0])[:3])


def defect_verdict(entry: dict[str, Any], cases: dict[str, dict[str, Any]]) -> str:
    """One release's verdict on one report.json divergence entry. ``cases``: that report's
    test cases by node id (they say whether a failure was the expected, known one)."""
    outcome = entry.get("repro_outcome")
    tests = [cases.get(i["test"], {**i, "known": False}) for i in entry.get("instances", [])]
    expected = any(c["outcome"] == "diverged" and c.get("known") for c in tests)
    unexpected = any(
        c["outcome"] == "error" or (c["outcome"] == "diverged" and not c.get("known"))
        for c in tests
    )
    if outcome == "reproduced" or expected:
        return "reproduced"
    if outcome in ("broken", "timeout") or unexpected:
        return "different failure"
    if outcome == "fixed" or any(c["outcome"] == "passed" for c in tests):
        return "not reproduced" if entry.get("checked") else "fixed"
    if outcome == "skipped" or any(c["outcome"] in ("skipped", "unsupported") for c in tests):
        return "skipped"
    return "not run"


@dataclass
class Release:
    name: str  # torch.__version__ as the report's header states it
    folder: Path
    report: dict[str, Any]

    @property
    def verdicts(self) -> dict[str, str]:
        """Defect id -> verdict. Entries the report did not show (``fixed``) come from the
        ``verdicts`` map that report.py writes beside them."""
        cases = {c["test"]: c for c in self.report.get("cases", [])}
        out = dict(self.report.get("verdicts", {}))
        for fid in self.report.get("fixed", []):
            out.setdefault(fid, "fixed")
        for entry in self.report.get("divergences", []):
            out[entry["id"]] = defect_verdict(entry, cases)
        return out


def read_release(folder: Path) -> Release:
    path = folder / "report.json"
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        raise SystemExit(
            f"report_matrix: {path} is missing (did that release's run finish?)"
        ) from None
    except json.JSONDecodeError as e:
        raise SystemExit(f"report_matrix: {path} is not JSON: {e}") from None
    if report.get("impl") != "torch":
        raise SystemExit(f"report_matrix: {path} is a report on {report.get('impl')!r}, not torch")
    torch_version = report.get("environment", {}).get("torch", "")
    if not torch_version or torch_version == "not installed":
        raise SystemExit(f"report_matrix: {path} does not say which torch it ran on")
    return Release(torch_version, folder, report)


def first_change(row: list[str]) -> int | None:
    """Index of the first release whose verdict differs from the release before it."""
    for i in range(1, len(row)):
        if row[i] != row[i - 1]:
            return i
    return None


def build(releases: list[Release]) -> dict[str, Any]:
    releases = sorted(releases, key=lambda r: release_key(r.name))
    names = [r.name for r in releases]
    if len(set(names)) != len(names):
        raise SystemExit(f"report_matrix: two reports on the same torch: {names}")
    verdicts = [r.verdicts for r in releases]
    titles: dict[str, dict[str, Any]] = {}
    for r in releases:
        for e in r.report.get("divergences", []):
            titles.setdefault(e["id"], {k: e.get(k) for k in ("title", "area", "rule", "upstream")})
        for e in r.report.get("defects", []):
            titles.setdefault(e["id"], {k: e.get(k) for k in ("title", "area", "rule", "upstream")})
    ids = sorted(set().union(*verdicts) if verdicts else set())
    rows = []
    for did in ids:
        row = [v.get(did, "not run") for v in verdicts]
        changed = first_change(row)
        rows.append(
            {
                "id": did,
                **titles.get(did, {}),
                "verdicts": dict(zip(names, row)),
                "changed_in": None if changed is None else names[changed],
            }
        )
    return {
        "releases": [
            {
                "torch": r.name,
                "folder": str(r.folder),
                "environment": r.report.get("environment", {}),
                "pytest_exit_code": r.report.get("pytest_exit_code"),
                "seconds": r.report.get("seconds"),
            }
            for r in releases
        ],
        "defects": rows,
    }


def render(matrix: dict[str, Any]) -> str:
    names = [r["torch"] for r in matrix["releases"]]
    out = ["# Conformance report against torch, per release", ""]
    out += [
        "| torch | torchrec | fbgemm-gpu | suite exit | seconds | report |",
        "|---|---|---|---|---|---|",
    ]
    for r in matrix["releases"]:
        env = r["environment"]
        out.append(
            f"| {r['torch']} | {env.get('torchrec', '?')} | {env.get('fbgemm-gpu', '?')} | "
            f"{r['pytest_exit_code']} | {r['seconds']} | [{Path(r['folder']).name}/report.md]"
            f"({Path(r['folder']).name}/report.md) |"
        )
    counts = {n: dict.fromkeys(VERDICTS, 0) for n in names}
    for d in matrix["defects"]:
        for n, v in d["verdicts"].items():
            counts[n][v] += 1
    out += ["", "| verdict | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for v in VERDICTS:
        out.append(f"| {v} | " + " | ".join(str(counts[n][v]) for n in names) + " |")
    out += [
        "",
        "## Every defect, per release",
        "",
        "`changed in` names the first release whose verdict differs from the release before "
        "it. Each release's own report (entries, shrunk examples, repro output) is linked "
        "above.",
        "",
        "| defect | rule | upstream | " + " | ".join(names) + " | changed in |",
        "|---|---|---|" + "---|" * len(names) + "---|",
    ]
    for d in matrix["defects"]:
        cells = " | ".join(_cell(d["verdicts"][n]) for n in names)
        out.append(
            f"| `{d['id']}` | {d.get('rule') or '-'} | {d.get('upstream') or 'not reported'} | "
            f"{cells} | {d['changed_in'] or '-'} |"
        )
    return "\n".join(out) + "\n"


def _cell(verdict: str) -> str:
    return f"**{verdict}**" if verdict in ("fixed", "different failure") else verdict


def stamp_repros(matrix: dict[str, Any], out: Path) -> None:
    """Copy each repro with a header saying which releases it ran on and what it did."""
    (out / "repro").mkdir(parents=True, exist_ok=True)
    by_id = {d["id"]: d for d in matrix["defects"]}
    for path in sorted(REPROS.glob("*.py")):
        if path.name.startswith("_"):
            continue
        d = by_id.get(path.stem)
        ran = "" if d is None else ", ".join(f"{n}: {v}" for n, v in d["verdicts"].items())
        head = f"# shardspec report matrix: run on torch {ran or 'no release'}\n"
        (out / "repro" / path.name).write_text(head + path.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="one report folder per release")
    parser.add_argument("--out", type=Path, default=Path("report-matrix"))
    args = parser.parse_args(argv)
    matrix = build([read_release(f) for f in args.folders])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "matrix.json").write_text(json.dumps(matrix, indent=2))
    (args.out / "matrix.md").write_text(render(matrix))
    stamp_repros(matrix, args.out)
    changed = [d["id"] for d in matrix["defects"] if d["changed_in"]]
    print(
        f"report matrix: {args.out}/matrix.md over torch "
        f"{', '.join(r['torch'] for r in matrix['releases'])}: {len(matrix['defects'])} defects"
        + (f", changed: {', '.join(changed)}" if changed else ", no verdict changed")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
