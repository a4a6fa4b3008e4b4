"""Run one standalone upstream repro the way ``torchrun`` would, listening on loopback only.

A repro (``conformance/repros/<id>.py``) is plain torch that a PyTorch maintainer runs as
``torchrun --standalone --nproc-per-node N <id>.py``. It prints a line starting ``DIVERGES`` and
exits 1 on any rank where upstream breaks the spec, and exits 0 everywhere once upstream is
fixed. It may print ``BOXES {json}`` lines (the boxes the spec gives beside the boxes torch
gave) for the report to draw, and ``PERF {json}`` lines (what a performance repro measured).

``torchrun --standalone`` would start its store on every interface; here the driver starts
the rank runtime's loopback-only store (``shardspec.testing.loopback``) and the ranks join it
as torchrun's agent store (``TORCHELASTIC_USE_AGENT_STORE``), with gloo on the loopback
device. Usage: ``python -m conformance.report.repro_run conformance/repros/<id>.py``.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardspec.testing.loopback import loopback_store

# torch's repros; each peer's live in its own folder, conformance/peers/<name>/repros/
REPROS = Path(__file__).resolve().parents[1] / "repros"
PEERS = Path(__file__).resolve().parents[1] / "peers"
# The fields every repro's DEFECT literal must state; see conformance/repros/README.md.
REQUIRED = ("id", "title", "area", "rule", "upstream", "nproc", "torch_does", "spec_says")
# The report runs repros on a thread pool, and CPython 3.11's parser is not thread-safe:
# concurrent ast.parse calls raised "SystemError: AST constructor recursion depth mismatch"
# in the torch 2.14.1 report run, which ended the whole report.
_PARSE = threading.Lock()


def read_defect(path: Path) -> dict[str, Any]:
    """The ``DEFECT = {...}`` literal at the top of a repro, read without running it."""
    text = path.read_text()
    with _PARSE:
        tree = ast.parse(text, filename=str(path))
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "DEFECT"
        ):
            defect = ast.literal_eval(node.value)
            if not isinstance(defect, dict):
                raise ValueError(f"{path}: DEFECT must be a dict literal")
            missing = [k for k in REQUIRED if k not in defect]
            if missing:
                raise ValueError(f"{path}: DEFECT lacks {', '.join(missing)}")
            if defect["id"] != path.stem:
                raise ValueError(f"{path}: DEFECT id {defect['id']!r} is not the file name")
            if defect["upstream"] is None and not defect.get("issue_text"):
                raise ValueError(f"{path}: not reported upstream, so it needs an issue_text")
            return defect
    raise ValueError(f"{path}: no DEFECT = {{...}} literal")


def all_repros(impl: str | None = None) -> list[Path]:
    """Every repro, or those of ``impl``'s defects (``DEFECT["impl"]``, default ``torch``; a
    peer's, e.g. ``bytecheckpoint``, need its package and run in its session)."""
    paths = [*REPROS.glob("*.py"), *PEERS.glob("*/repros/*.py")]
    found = sorted((p for p in paths if not p.name.startswith("_")), key=lambda p: p.name)
    return (
        found if impl is None else [p for p in found if read_defect(p).get("impl", "torch") == impl]
    )


@dataclass
class ReproResult:
    id: str
    nproc: int
    outcome: str  # reproduced | fixed | broken | skipped | timeout
    exit_codes: list[int | None]
    output: dict[int, str]
    boxes: list[dict[str, Any]] = field(default_factory=list)
    perf: list[dict[str, Any]] = field(default_factory=list)
    divergences: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def reproduced(self) -> bool:
        return self.outcome == "reproduced"


def shown_outcome(path: Path, res: ReproResult) -> str:
    """The outcome as a reader should see it: a checked claim (``DEFECT["checked"]``) that
    still agrees was never broken, so it reads "not reproduced", not "fixed"."""
    if res.outcome == "fixed" and read_defect(path).get("checked"):
        return "not reproduced (a checked claim)"
    return res.outcome


def _classify(codes: list[int | None], text: dict[int, str]) -> tuple[str, list[str]]:
    lines = [ln for out in text.values() for ln in out.splitlines()]
    diverges = [ln for ln in lines if ln.startswith("DIVERGES")]
    skipped = [ln for ln in lines if ln.startswith("SKIPPED")]
    if any(c is None for c in codes):
        return ("reproduced" if diverges else "timeout"), diverges
    if diverges:
        return "reproduced", diverges
    if skipped and all(c == 0 for c in codes):
        return "skipped", skipped
    if all(c == 0 for c in codes):
        return "fixed", []
    return "broken", []


def _json_lines(text: dict[int, str], tag: str) -> list[dict[str, Any]]:
    found = []
    for out in text.values():
        for line in out.splitlines():
            if line.startswith(tag):
                # a line cut short by a dying rank: the DIVERGES lines still tell
                with contextlib.suppress(ValueError):
                    found.append(json.loads(line[len(tag) :]))
    return found


def run_repro(path: Path, nproc: int | None = None, timeout: float = 180.0) -> ReproResult:
    """Run the repro on ``nproc`` ranks (its DEFECT's by default) and classify what it did.

    ``reproduced``: some rank printed DIVERGES; ``fixed``: every rank exited 0 without it;
    ``skipped``: it said it cannot run here (a missing package); ``broken``: it failed without
    saying it diverged (a bug in the repro, not in torch); ``timeout``: ranks still running.
    """
    defect = read_defect(path)
    world = int(nproc or defect["nproc"])
    store = loopback_store()
    port = store.port
    env_base = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "GROUP_RANK": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="shardspec-repro-") as tmp:
        procs: list[subprocess.Popen[bytes]] = []
        logs = []
        for rank in range(world):
            log = open(Path(tmp) / f"rank{rank}.log", "wb")  # noqa: SIM115 - closed below
            logs.append(log)
            env = {**env_base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(path)],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        deadline = t0 + timeout
        codes: list[int | None] = [None] * world
        while time.monotonic() < deadline and any(c is None for c in codes):
            codes = [p.poll() for p in procs]
            time.sleep(0.05)
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for log in logs:
            log.close()
        text = {r: (Path(tmp) / f"rank{r}.log").read_text(errors="replace") for r in range(world)}
    del store
    outcome, divergences = _classify(codes, text)
    return ReproResult(
        defect["id"],
        world,
        outcome,
        codes,
        text,
        _json_lines(text, "BOXES "),
        _json_lines(text, "PERF "),
        sorted(set(divergences)),
        time.monotonic() - t0,
    )


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repro", nargs="*", type=Path, help="repro files (default: all)")
    parser.add_argument("--nproc", type=int, default=None)
    parser.add_argument("-v", "--verbose", action="store_true", help="print every rank's output")
    args = parser.parse_args(argv)
    worst = 0
    for path in args.repro or all_repros():
        res = run_repro(path, args.nproc)
        print(f"{res.id}: {shown_outcome(path, res)} on {res.nproc} rank(s) in {res.seconds:.1f} s")
        for line in res.divergences[:4]:
            print(f"  {line}")
        if args.verbose or res.outcome in ("broken", "timeout"):
            for rank, out in res.output.items():
                tail = "\n".join(out.strip().splitlines()[-15:])
                print(f"  --- rank {rank} (exit {res.exit_codes[rank]}) ---\n{tail}")
        if res.outcome in ("broken", "timeout"):
            worst = 1
    return worst


if __name__ == "__main__":
    sys.exit(main())
