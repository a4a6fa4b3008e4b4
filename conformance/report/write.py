"""Run the conformance suite and write a report: ``python -m conformance.report --out DIR``.

Against torch (``SHARDSPEC_IMPL=torch``) it runs the suite, every standalone repro
(``conformance/repros``, each on its own ranks, so one crash never hides another) and the
performance probes, and writes into ``DIR``:

- ``report.md``: an environment header, then one entry per divergence (one defect, however
  many tests and world sizes show it: the one rule it breaks, what torch does and what the spec
  says, the repro and whether it reproduced, the upstream issue or a ready-to-file issue text,
  the suite's shrunk examples), then every test by area;
- ``report.json``: one object per divergence (``id``, ``area``, ``rule``, ``upstream``,
  ``world_sizes``, ``repro``, ``reproduced``, ...), the probes, every test case;
- ``report.html``: the same divergences, each layout divergence drawn (spec beside torch);
- ``repro/<id>.py``: the repros, each runnable as
  ``torchrun --standalone --nproc-per-node N repro/<id>.py``.

Extra arguments go to pytest. Exits 0 when the suite ran, whatever it found: a report, not a
gate.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conformance.report import repro_run
from conformance.report.draw import render_html
from conformance.report.entries import Entry, build_entries
from conformance.report.matrix import defect_verdict
from conformance.report.probes import Probe, run_all as run_all_probes
from conformance.report.repro_run import (
    ReproResult,
    all_repros,
    read_defect,
    run_repro,
    shown_outcome,
)

ROOT = Path(__file__).resolve().parents[2]
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
    # how many examples of the property showed its known defect (every example runs, CONF-14)
    known_examples: int = 0
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


EXC_LINE = re.compile(r"^\s*([\w.]+(Error|Exception|Abort|Died)\b.*)$")


def _message(exc: BaseException | None) -> str | None:
    """What the implementation did, one line per failure: an assertion's own line (it names
    the fact, the value and the example), a rank error's exception line per group of ranks, or
    for a crash its first line and the innermost exception line, never a truncated traceback."""
    if exc is None:
        return None
    excs = list(getattr(exc, "exceptions", [])) or [exc]
    lines = []
    for e in excs:
        ranks = _rank_errors(str(e)) if type(e).__name__ == "RankError" else None
        if ranks is not None:
            lines.append(f"RankError: {ranks}")
            continue
        text = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        head = text[0] if text else ""
        inner = next((m.group(1) for ln in reversed(text[1:]) if (m := EXC_LINE.match(ln))), None)
        if inner and inner != head and not re.search(r"=.*but should be", head):
            head = f"{head} ... {inner}"
        lines.append(f"{type(e).__name__}: {head}")
    return "\n".join(lines)


def _mark_impl(mark: Any) -> str:
    return str(mark.args[0] if mark.args else mark.kwargs["impl"])


def _current() -> str:
    from conformance.impls import get_impl

    return get_impl().name


class Collector:
    def __init__(self) -> None:
        self.cases: dict[str, Case] = {}

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Iterator[Any]:
        rep = yield
        rules = [r for m in item.iter_markers("rule") for r in m.args]
        known = next(
            (m for m in item.iter_markers("known_defect") if _mark_impl(m) == _current()), None
        )
        case = self.cases.get(item.nodeid)
        if case is None:
            case = self.cases[item.nodeid] = Case(item.nodeid, _area(item.nodeid), rules, "passed")
        if rep.when == "call":
            case.seconds = rep.duration
            for key, value in item.user_properties:
                if key == "unsupported":
                    case.unsupported_examples = value
                elif key == "known_defect_examples":
                    case.known_examples = value
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


def _area_tables(cases: list[Case]) -> list[str]:
    areas: dict[str, list[Case]] = {}
    for c in cases:
        areas.setdefault(c.area, []).append(c)
    out = [
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
        out += ["", f"### {area}", "", "| test | rules | outcome |", "|---|---|---|"]
        for c in cs:
            name = c.test.split("::", 1)[1]
            what = c.outcome + (" (known)" if c.known else "")
            if c.known_examples:
                what += f", in {c.known_examples} example(s)"
            if c.outcome in ("unsupported", "skipped") and c.reason:
                what += f": {c.reason}"
            if c.unsupported_examples and c.outcome != "unsupported":
                total = sum(c.unsupported_examples.values())
                what += f"; {total} example(s) unsupported: " + "; ".join(c.unsupported_examples)
            out.append(f"| `{name}` | {', '.join(c.rules)} | {what} |")
    return out


def _entry_md(
    i: int, e: Entry, rules: dict[str, str], probes: dict[str, Probe], impl: str = "torch"
) -> list[str]:
    out = [f'<a id="{e.id}"></a>', f"### {i}. {e.id}: {e.title}", ""]
    rule = e.rule or ", ".join(e.rules_cited)
    out.append(f"- **Breaks {rule}**: {rules.get(e.rule or '', '(see the rules cited)')}")
    out.append(f"- **Upstream**: {e.upstream or 'not reported upstream (issue text below)'}")
    out.append(f"- **World sizes**: {', '.join(map(str, e.world_sizes)) or '-'}")
    if e.repro:
        state = "reproduces" if e.reproduced else f"**does not reproduce** ({e.repro_outcome})"
        out.append(
            f"- **Repro**: [`{e.repro}`]({e.repro}), "
            f"`torchrun --standalone --nproc-per-node {max(e.world_sizes)} {e.repro}`: {state}"
        )
    if e.torch_does:
        # a peer's repro states what that peer does (its DEFECT's torch_does field)
        out.append(f"- **What {impl} does**: {e.torch_does}")
    if e.spec_says:
        out.append(f"- **What the spec says**: {e.spec_says}")
    if e.divergences:
        out += ["", "The repro printed:", "", "```", *e.divergences[:8], "```"]
    probe = probes.get(e.probe or "")
    if probe is not None:
        theirs, ours = probe.growth()
        out += [
            "",
            f"Measured in this run ({probe.what}): "
            + ", ".join(
                f"n={n}: torch {_secs(t)}, ours {_secs(o)}, {r}"
                for n, t, o, r in zip(
                    probe.sizes, probe.torch_seconds, probe.ours_seconds, probe.ratios()
                )
            )
            + f"; growth torch n^{theirs}, ours n^{ours}.",
        ]
    if e.perf:
        worst = max(e.perf, key=lambda p: p.get("torch_s", 0) / max(p.get("a2a_s", 1e-9), 1e-9))
        out += ["", f"Measured in this run (slowest rank): `{json.dumps(worst)}`"]
    shown = [inst for inst in e.instances if inst.outcome in ("diverged", "error")]
    if shown:
        out += ["", f"Found by the suite ({len(shown)} test(s)):"]
    for inst in shown[:4]:
        out += ["", f"`{inst.test}`", "", "```", (inst.message or "").strip(), "```"]
        if inst.example:
            out += ["Shrunk example:", "```", inst.example, "```"]
    if e.issue_text:
        out += ["", "<details><summary>Ready-to-file issue text</summary>", "", e.issue_text]
        out += ["", "</details>"]
    return out + [""]


def _shown(e: Entry) -> bool:
    """A divergence to report: reproduced, found by the suite, or a repro that misbehaved
    (broken, timed out) rather than one that says upstream is fixed."""
    found = any(i.outcome in ("diverged", "error") for i in e.instances)
    return e.reproduced or found or e.repro_outcome not in (None, "fixed", "skipped")


def _secs(t: float | None) -> str:
    return "over the limit" if t is None else f"{t * 1e3:.2f} ms"


def render(
    impl: str,
    header: list[tuple[str, str]],
    cases: list[Case],
    entries: list[Entry],
    probes: list[Probe],
    seconds: float,
) -> str:
    rules = read_rules()
    by_probe = {p.id: p for p in probes}
    shown = [e for e in entries if _shown(e)]
    out = [f"# Conformance report: `{impl}`", "", "| | |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in header]
    out += [
        "",
        f"The shardspec conformance suite ({len(cases)} tests, {seconds:.0f} s in all) and "
        f"{sum(e.repro is not None for e in entries)} standalone repros run against `{impl}`. "
        "Each divergence below is one defect, whatever the number of tests or world sizes that "
        "show it, with the one rule it breaks, a repro a maintainer can run (`repro/`), and the "
        "upstream issue or a ready-to-file issue text. `report.html` draws every layout "
        "divergence; `report.json` has one object per divergence.",
        "",
        "## Divergences",
        "",
        "| # | id | area | rule | upstream | world sizes | repro |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, e in enumerate(shown, 1):
        repro = "-" if e.repro is None else ("reproduces" if e.reproduced else e.repro_outcome)
        worlds = ", ".join(map(str, e.world_sizes)) or "-"
        out.append(
            f"| {i} | [{e.id}](#{e.id}) | {e.area} | {e.rule or ', '.join(e.rules_cited)} | "
            f"{e.upstream or 'not reported'} | {worlds} | {repro} |"
        )
    out += [""]
    for i, e in enumerate(shown, 1):
        out += _entry_md(i, e, rules, by_probe, impl)
    fixed = [e for e in entries if e not in shown and not e.checked]
    if fixed:
        out += ["## Known defects that no longer reproduce", ""]
        out += [f"- `{e.id}` ({e.upstream or 'not reported'}): {e.title}" for e in fixed]
        out.append("")
    checked = [e for e in entries if e not in shown and e.checked]
    if checked:
        out += ["## Claims checked and not reproduced on this torch", ""]
        out += [
            f"- `{e.id}` ({e.upstream or 'not reported'}, repro [`{e.repro}`]({e.repro})): "
            f"{e.title}. {e.checked}"
            for e in checked
        ]
        out.append("")
    out += [
        "Claims checked once and kept without a repro: see `repro/README.md` (copied from "
        "`conformance/repros/README.md`).",
        "",
        "## Every test, by area",
        "",
        *_area_tables(cases),
    ]
    return "\n".join(out).rstrip() + "\n"


def environment(
    impl: str,
    seed: int | None,
    profile: str,
    worlds: str,
    impl_version: str = "unknown",
    areas: tuple[str, ...] | None = None,
) -> list[tuple[str, str]]:
    import platform
    from importlib import metadata

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return [
        ("implementation", impl),
        ("implementation version", impl_version),
        *_areas_header(areas),
        ("torch", version("torch")),
        ("torchrec", version("torchrec")),
        (
            "fbgemm-gpu",
            version("fbgemm-gpu-cpu")
            if version("fbgemm-gpu") == "not installed"
            else version("fbgemm-gpu"),
        ),
        # a peer under test: its own release (its package is named as the implementation)
        *(
            [(impl, version(impl))]
            if impl not in ("shardspec", "torch", "broken", "megatron")
            else []
        ),
        ("python", platform.python_version()),
        ("platform", platform.platform()),
        ("backend", os.environ.get("SHARDSPEC_BACKEND", "gloo")),
        ("world sizes", worlds),
        ("Hypothesis profile", profile),
        ("Hypothesis seed", "derandomized (reproducible)" if seed is None else str(seed)),
        *_peer_header(impl, version),
        ("shardspec commit", commit or "unknown"),
        ("date", time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())),
    ]


def _areas_header(areas: tuple[str, ...] | None) -> list[tuple[str, str]]:
    """The areas of the adapter interface the implementation takes part in, and the rest,
    whose every test is reported unsupported (conformance/interface/)."""
    if areas is None:
        return []
    from conformance.interface import AREAS

    rest = [a for a in AREAS if a not in areas]
    return [
        ("areas taken part in", ", ".join(a for a in AREAS if a in areas) or "none"),
        ("areas unsupported (no part taken)", ", ".join(rest) or "none"),
    ]


def _peer_header(impl: str, version: Any) -> list[tuple[str, str]]:
    """A peer's release, and what the suite changes of it to run it here."""
    if impl == "deepspeed":
        from conformance.peers.deepspeed.worlds import SHIM

        return [("patched for CPU", SHIM)]
    if impl != "megatron":
        return []
    import torch

    from shardspec.testing.peers import MEGATRON_CPU_PATCH

    patched = "none (CUDA present)" if torch.cuda.is_available() else MEGATRON_CPU_PATCH
    return [("megatron-core", version("megatron-core")), ("patched for CPU", patched)]


def run_repros(rank_slots: int = 8, impl: str = "torch") -> dict[str, ReproResult]:
    """Run every repro, several at once while their ranks fit in ``rank_slots`` processes
    (most of a repro's time is starting Python and importing torch on each rank)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    free = threading.Condition()
    slots = [rank_slots]

    def run(path: Path) -> ReproResult:
        need = min(int(read_defect(path)["nproc"]), rank_slots)
        with free:
            free.wait_for(lambda: slots[0] >= need)
            slots[0] -= need
        try:
            return run_repro(path)
        finally:
            with free:
                slots[0] += need
                free.notify_all()

    # the widest first, so the narrow ones fill the gaps they leave
    paths = sorted(all_repros(impl), key=lambda p: -int(read_defect(p)["nproc"]))
    results: dict[str, ReproResult] = {}
    with ThreadPoolExecutor(max_workers=rank_slots) as pool:
        for path, res in zip(paths, pool.map(run, paths)):
            results[path.stem] = res
            print(f"repro {res.id}: {shown_outcome(path, res)} ({res.seconds:.0f} s)", flush=True)
    return results


def _register_profiles() -> None:
    """The Hypothesis profiles of the root conftest (``short``, ``thorough``, ``ci``), which
    pytest loads only once the suite starts, registered now so that the header can read
    the one asked for."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_shardspec_profiles", ROOT / "conftest.py")
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="conformance-report", help="the report's folder")
    parser.add_argument("--seed", type=int, default=None, help="Hypothesis seed (default: drawn)")
    parser.add_argument("--no-suite", action="store_true", help="repros and probes only")
    parser.add_argument("--no-repros", action="store_true", help="skip the standalone repros")
    parser.add_argument("--no-probes", action="store_true", help="skip the performance probes")
    parser.add_argument(
        "--gate",
        action="store_true",
        help="exit 1 when a test failed, after writing the report (the peers' sessions: their "
        "known defects are strict expected failures, so a failure is the adapter's or the "
        "suite's); without it a failed test is a finding of the report",
    )
    args, rest = parser.parse_known_args(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from hypothesis import settings

    from conformance.impls import ImplError, get_impl, impl_name

    try:
        adapter = get_impl()
    except ImplError as e:
        parser.error(str(e))
    impl = adapter.name  # "torch" for SHARDSPEC_IMPL=torch or its "module:Class" form
    profile = os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default")
    _register_profiles()
    derandomized = bool(settings.get_profile(profile).derandomize)
    seed = None if derandomized else (args.seed or int.from_bytes(os.urandom(4), "little"))
    out = Path(args.out)
    (out / "repro").mkdir(parents=True, exist_ok=True)

    collector = Collector()
    t0 = time.monotonic()
    code = pytest.ExitCode.OK
    if not args.no_suite:
        seed_args = [] if seed is None else [f"--hypothesis-seed={seed}"]
        code = pytest.main(
            [
                str(ROOT / "conformance" / "tests"),
                "-p",
                "no:cacheprovider",
                "-q",
                *seed_args,
                *rest,
            ],
            plugins=[collector],
        )
    cases = list(collector.cases.values())
    print("running the standalone repros", flush=True)
    results = {} if args.no_repros else run_repros(impl=impl)
    print("running the performance probes", flush=True)
    probes = [] if args.no_probes or impl != "torch" else run_all_probes()
    seconds = time.monotonic() - t0

    # the repros of the implementation's own defects: torch's, or a peer's (DEFECT["impl"])
    defects = [read_defect(p) for p in all_repros(impl)]
    for path in [*all_repros(impl), repro_run.REPROS / "README.md"]:
        if path.exists():
            shutil.copy(path, out / "repro" / path.name)
    entries = build_entries(cases, defects, results)
    from shardspec.testing.devices import local_worlds

    worlds = os.environ.get("SHARDSPEC_MAX_WORLD", "4")
    one_program = ", ".join(str(w) for w in local_worlds())
    header = environment(
        impl if impl == impl_name() else f"{impl} ({impl_name()})",
        seed,
        profile,
        f"suite 1..{worlds}; one program for every rank (LocalTensorMode) {one_program}; "
        "repros as each needs",
        adapter.version(),
        adapter.areas(),
    )
    (out / "report.md").write_text(render(impl, header, cases, entries, probes, seconds))
    (out / "report.html").write_text(
        render_html(
            f"Conformance report: {impl}", header, [e for e in entries if _shown(e)], impl=impl
        )
    )
    case_json = {c.test: asdict(c) for c in cases}
    (out / "report.json").write_text(
        json.dumps(
            {
                "impl": impl,
                "environment": dict(header),
                "pytest_exit_code": int(code),
                "seconds": round(seconds, 1),
                "divergences": [e.as_json() for e in entries if _shown(e)],
                "fixed": [e.id for e in entries if not _shown(e)],
                # every defect's verdict on this release, for `conformance.report.matrix`
                "verdicts": {e.id: defect_verdict(e.as_json(), case_json) for e in entries},
                "defects": [
                    {
                        "id": e.id,
                        "title": e.title,
                        "area": e.area,
                        "rule": e.rule,
                        "upstream": e.upstream,
                    }
                    for e in entries
                ],
                "performance": [p.as_json() for p in probes],
                "cases": list(case_json.values()),
            },
            indent=2,
        )
    )
    missing = [e.id for e in entries if e.repro and not e.reproduced]
    print(
        f"conformance report: {out}/report.md, report.html, report.json, repro/ ({seconds:.0f} s)"
    )
    if missing:
        print(f"repros that did not reproduce: {', '.join(missing)}")
    if args.gate and int(code) == pytest.ExitCode.TESTS_FAILED:
        print("tests failed (--gate): see the short test summary above")
        return 1
    ran = int(code) in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)
    return 0 if ran else int(code)


if __name__ == "__main__":
    sys.exit(main())
