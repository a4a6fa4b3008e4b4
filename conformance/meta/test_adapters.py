"""An adapter any project can write (CONF-15): a module outside this repository, named
``module:Adapter``, runs the suite on its own, with rank operations of its own on the pool's
ranks, its seeded defect caught, the same defect declared known an expected failure, and a bad
name refused saying what is wrong.

The adapter module is written to ``tmp_path`` (outside the repository) and found only through
``PYTHONPATH``; each slice of ``conformance/tests/test_chunk.py`` runs in its own pytest
process, all of them at once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.impls import IMPLS, Impl, ImplError, KnownDefect, get_impl, pool_ops
from shardspec.testing import scaled

ROOT = Path(__file__).resolve().parents[2]
MODULE = "outside_adapter"

ADAPTER = '''
"""A conformance adapter that lives outside the shardspec repository."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from conformance.impls import Impl, KnownDefect
from shardspec.metadata import Box, Layout, LayoutError, Shard, chunk_layout
from shardspec.testing.ops import operation


@operation("outside.chunk", collective=True)
def _chunk(ctx, args, ts):
    """Each rank's chunk, after an all-reduce on the pool's process group."""
    (t,) = ts
    box = chunk_layout(tuple(t.shape), args["dim"], range(ctx.world)).boxes_of(ctx.rank)[0]
    ranks = torch.ones(1, device=ctx.device)
    dist.all_reduce(ranks)
    value = {"box": [list(box.offsets), list(box.sizes)], "ranks": int(ranks.item()),
             "pid": os.getpid()}
    return value, [t[box.slices()].contiguous()]


class Outside(Impl):
    name = "outside"
    rank_ops = (__name__,)  # this module registers outside.chunk on import

    def version(self):
        return "0.0.1-outside"

    def is_valid(self, layout):
        try:
            layout.validate()
        except LayoutError:
            return False
        return True

    def chunk_layout(self, shape, dim, ranks):
        return chunk_layout(shape, dim, ranks)

    def fsdp_local_boxes(self, pool, tensor, dim):
        results = pool.run("outside.chunk", {"dim": dim}, [tensor])
        with open(os.environ["OUTSIDE_LOG"], "a") as fh:
            ranks = [r.value["ranks"] for r in results]
            pids = [r.value["pid"] for r in results]
            fh.write(f"world={pool.world_size} ranks={ranks} pids={pids}\\n")
        return [(Box(*r.value["box"]), r.tensors[0]) for r in results]


class OffByOne(Outside):
    """Chunks after the first start one element early on a dim that does not divide."""

    def chunk_layout(self, shape, dim, ranks):
        good = chunk_layout(shape, dim, ranks)
        d = dim % len(shape)
        if shape[d] % len(ranks) == 0:
            return good
        shards = []
        for i, s in enumerate(good.shards):
            offsets = list(s.box.offsets)
            if i > 0 and not s.box.is_empty:
                offsets[d] -= 1
            shards.append(Shard(Box(offsets, s.box.sizes), s.rank))
        return Layout(good.shape, shards)


class OffByOneKnown(OffByOne):
    known_defects = {
        "test_chunk_spec_follows_the_chunk_rule": KnownDefect(
            "chunks after the first start one element early on uneven dims",
            raises=AssertionError,
            match=r"^boxes_of\\(\\d+\\)=.*, but should be .*\\[chunk\\(",
            issue="outside#1",
        ),
    }


class OffByOneKnownLogged(OffByOneKnown):
    """The known defect, each call logged: the drawn examples run past the explicit one."""

    def chunk_layout(self, shape, dim, ranks):
        with open(os.environ["OUTSIDE_LOG"], "a") as fh:
            fh.write(f"chunk ranks={len(ranks)}\\n")
        return super().chunk_layout(shape, dim, ranks)


class OffByOneKnownThenOther(OffByOneKnown):
    """The known defect, which the explicit example (4,100 ranks) shows, and a second one
    that only the drawn examples (fewer ranks) reach."""

    def chunk_layout(self, shape, dim, ranks):
        if len(ranks) < 4000:
            raise RuntimeError("a second defect, behind the known one")
        return super().chunk_layout(shape, dim, ranks)


class BothKnown(OffByOneKnownThenOther):
    """Both defects declared, each its own entry (two keys naming the one test)."""

    known_defects = {
        **OffByOneKnown.known_defects,
        "conformance/tests/test_chunk.py::test_chunk_spec_follows_the_chunk_rule": KnownDefect(
            "fewer ranks raise", raises=RuntimeError, match=r"^a second defect", issue="outside#2"
        ),
    }


class KnownButFixed(Outside):
    """Declares a defect it does not have."""

    known_defects = OffByOneKnown.known_defects


class NotAnAdapter:
    pass


from conformance.interface import Chunk


class ChunksOnly(Chunk):
    """An adapter of one area, as conformance/README.md shows one."""

    name = "chunks-only"

    def chunk_layout(self, shape, dim, ranks):
        return chunk_layout(shape, dim, ranks)
'''

CHUNK_RULE = "test_chunk_spec_follows_the_chunk_rule"
VALIDATION = "test_validator_agrees_with_the_oracle"
ONE_AREA = ("test_chunk.py", "test_validation.py")
SLICE = f"{CHUNK_RULE} or test_reshard_path_follows_the_chunk_rule or test_fsdp_box_holds"


@pytest.fixture
def outside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The adapter module, in a folder outside the repository, importable here too."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / f"{MODULE}.py").write_text(ADAPTER)
    assert ROOT not in folder.resolve().parents
    monkeypatch.syspath_prepend(str(folder))
    return folder


def _start(
    folder: Path,
    impl: str,
    k: str,
    log: Path,
    files: tuple[str, ...] = ("test_chunk.py",),
    **extra: str,
) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHARDSPEC_", "HYPOTHESIS_"))}
    env.update(extra)
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH", "")])),
        HYPOTHESIS_PROFILE="short",
        SHARDSPEC_EXAMPLES="3",
        SHARDSPEC_MAX_WORLD="2",
        OUTSIDE_LOG=str(log),
    )
    cmd = [sys.executable, "-m", "pytest", *(f"conformance/tests/{f}" for f in files), "-k", k]
    cmd += ["--impl", impl, "-p", "no:cacheprovider", "-rsxX", "--tb=short"]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=scaled(240))
    return proc.returncode, out


@pytest.mark.rule("CONF-15", "CONF-4", "CONF-5", "CONF-14")
def test_an_outside_adapter_runs_the_suite(outside: Path, tmp_path: Path) -> None:
    log = tmp_path / "ranks.log"
    runs = {
        "good": _start(outside, f"{MODULE}:Outside", SLICE, log),
        "defect": _start(outside, f"{MODULE}:OffByOne", CHUNK_RULE, log),
        "known": _start(outside, f"{MODULE}:OffByOneKnown", CHUNK_RULE, log),
        "bad": _start(outside, f"{MODULE}:NotAnAdapter", CHUNK_RULE, log),
        "one area": _start(
            outside, f"{MODULE}:ChunksOnly", f"{CHUNK_RULE} or {VALIDATION}", log, ONE_AREA
        ),
    }
    done = {name: _finish(proc) for name, proc in runs.items()}

    # (a) a correct adapter passes, and what it does not answer is reported unsupported
    code, out = done["good"]
    assert code == 0, out
    assert "impl=outside (outside_adapter:Outside) version 0.0.1-outside" in out, out
    assert re.search(r"2 passed, 1 skipped", out), out
    assert "unsupported by outside: reshard chunk layouts" in out, out
    # its own rank operation ran on the ranks of a pool of 2, other processes than the driver
    worlds = [line for line in log.read_text().splitlines() if line.startswith("world=2 ")]
    assert worlds, log.read_text()
    pids = [int(p) for p in re.findall(r"\d+", worlds[0].partition("pids=")[2])]
    assert "ranks=[2, 2]" in worlds[0] and len(set(pids)) == 2, worlds
    assert runs["good"].pid not in pids

    # (b) a seeded defect fails with the suite's message shape
    code, out = done["defect"]
    assert code == 1, out
    assert re.search(r"1 failed", out), out
    assert re.search(r"AssertionError: boxes_of\(\d+\)=\[.*\], but should be \[.*\] \[chunk\(", out)

    # (c) the same defect declared by the adapter is a strict expected failure
    code, out = done["known"]
    assert code == 0, out
    assert re.search(r"1 xfailed", out), out
    assert "outside: chunks after the first start one element early" in out, out

    # (d) a name that is no adapter stops the run, saying why and what the built-ins are
    code, out = done["bad"]
    assert code == pytest.ExitCode.USAGE_ERROR, out
    assert "outside_adapter:NotAnAdapter is <class 'outside_adapter.NotAnAdapter'>, not a " in out
    assert "subclass of conformance.interface.Adapter" in out and f"({', '.join(IMPLS)})" in out

    # (e) an adapter of one area runs that area; a test of another area is unsupported, named
    code, out = done["one area"]
    assert code == 0, out
    assert re.search(r"1 passed, 2 skipped", out), out  # the oracle's and the large ones
    assert "unsupported by chunks-only: the validation area (validation of a layout" in out, out


@pytest.mark.rule("CONF-14")
def test_a_known_defect_does_not_hide_the_drawn_examples(outside: Path, tmp_path: Path) -> None:
    """With SHARDSPEC_DRAW_PAST_KNOWN=1: the chunk rule's explicit example (4,100 ranks) meets
    the known defect; the drawn ones still run against that adapter, and a second defect among
    them fails the test, unless it is declared too."""
    logs = {name: tmp_path / f"{name}.log" for name in ("known", "other", "both", "fixed")}
    on = {"SHARDSPEC_DRAW_PAST_KNOWN": "1"}
    runs = {
        "known": _start(outside, f"{MODULE}:OffByOneKnownLogged", CHUNK_RULE, logs["known"], **on),
        "other": _start(
            outside, f"{MODULE}:OffByOneKnownThenOther", CHUNK_RULE, logs["other"], **on
        ),
        "both": _start(outside, f"{MODULE}:BothKnown", CHUNK_RULE, logs["both"], **on),
        "fixed": _start(outside, f"{MODULE}:KnownButFixed", CHUNK_RULE, logs["fixed"], **on),
    }
    done = {name: _finish(proc) for name, proc in runs.items()}

    code, out = done["known"]
    assert code == 0 and re.search(r"1 xfailed", out), out
    worlds = [int(n) for n in re.findall(r"^chunk ranks=(\d+)$", logs["known"].read_text(), re.M)]
    assert worlds[0] == 4100, worlds  # the explicit example first, failing with the defect
    assert len([w for w in worlds if w < 4100]) >= 3, worlds  # then every drawn one (3)

    code, out = done["other"]
    assert code == 1 and re.search(r"1 failed", out), out
    assert "RuntimeError: a second defect, behind the known one" in out, out

    # the second defect declared too: the test is an expected failure of either
    code, out = done["both"]
    assert code == 0 and re.search(r"1 xfailed", out), out
    assert "outside: chunks after the first start" in out and "outside: fewer ranks" in out, out

    code, out = done["fixed"]
    assert code == 1 and re.search(r"1 failed", out), out
    assert "XPASS(strict)" in out, out


@pytest.mark.rule("CONF-15")
@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("outside_adapter", "not a built-in name, nor of the form 'package.module:Adapter'"),
        ("no_such_module_here:Adapter", "module 'no_such_module_here' is not found"),
        (f"{MODULE}:Missing", f"module '{MODULE}' has no attribute 'Missing'"),
        (f"{MODULE}:NotAnAdapter", "not a subclass of conformance.interface.Adapter"),
        (f"{MODULE}:", "nor of the form 'package.module:Adapter'"),
    ],
)
def test_a_bad_name_says_what_is_wrong(outside: Path, spec: str, says: str) -> None:
    with pytest.raises(ImplError) as info:
        get_impl(spec)
    assert says in str(info.value)
    assert f"({', '.join(IMPLS)})" in str(info.value)


@pytest.mark.rule("CONF-15")
def test_an_adapter_takes_part_in_the_areas_it_subclasses(outside: Path) -> None:
    from conformance.interface import AREAS, Unsupported
    from conformance.report.write import environment

    one = get_impl(f"{MODULE}:ChunksOnly")
    assert one.areas() == ("chunk",) and get_impl("torch").areas() == AREAS
    assert len(AREAS) == len(set(AREAS)) > 10
    layout = one.chunk_layout((5,), 0, [0, 1])
    assert [s.box.sizes for s in layout.shards] == [(3,), (2,)]
    with pytest.raises(Unsupported, match=r"^unsupported by chunks-only: the reshard area \("):
        one.reshard(None, layout, layout, None)
    with pytest.raises(AttributeError):
        one.no_such_method  # noqa: B018 - a name of no area is no method
    header = dict(environment("chunks-only", None, "ci", "1..2", "0", one.areas()))
    assert header["areas taken part in"] == "chunk"
    assert "validation" in header["areas unsupported (no part taken)"].split(", ")
    assert "chunk" not in header["areas unsupported (no part taken)"].split(", ")


@pytest.mark.rule("CONF-15")
def test_an_adapter_states_its_ops_and_known_defects(outside: Path) -> None:
    impl = get_impl(f"{MODULE}:OffByOneKnown")
    assert impl.name == "outside" and impl.version() == "0.0.1-outside"
    assert pool_ops(impl)[-1] == MODULE
    (defect,) = impl.known_defects.values()
    assert defect.raises is AssertionError and defect.issue == "outside#1"
    # a class that states no name is named by what names it
    assert get_impl("conformance.impls:Impl").name == "conformance.impls:Impl"
    # the built-ins are the same form, by name
    assert type(get_impl("torch")).__name__ == "TorchImpl"
    with pytest.raises(re.error):
        KnownDefect("bad", raises=AssertionError, match="(")
    with pytest.raises(TypeError, match="exception types"):
        KnownDefect("bad", raises="AssertionError", match="x")  # type: ignore[arg-type]

    wrong = type("Wrong", (Impl,), {"known_defects": {"test_x": ("reason", AssertionError, "x")}})
    sys.modules[MODULE].Wrong = wrong  # type: ignore[attr-defined]
    with pytest.raises(ImplError, match=r"known_defects\['test_x'\] is .*not a .*KnownDefect"):
        get_impl(f"{MODULE}:Wrong")
