"""The project's front door: `nox -s <session>`.

CPU sessions pin torch==2.13.0 (the CPU build); pass `--torch=VERSION` after `--` to test
another, e.g. `nox -s tests -- --torch=2.15.0` (and `--torchrec=VERSION` to `torchrec`). Every
other argument after `--` goes to pytest (or to the benchmark script, for `bench`).

The sessions that take `--torch` share one virtualenv per release, `.nox/torch-<release>`
(`.nox/torch-<release>-torchrec-<release>` with TorchRec), kept between runs: the CUDA builds
of torch 2.14 and 2.15 are gigabytes, so a release is installed once, not once per session.

Virtualenvs are made and filled by uv where it is installed beside nox (`.ci/run` installs it):
every venv after the first links torch, TorchRec and the peers' packages from uv's cache
instead of unpacking them again. uv is given pip's own settings (its index, extra indexes,
find-links, constraint files and certificate, from `pip config list` and PIP_*), so both
resolve from the same places. Without uv the sessions use venv and pip, as before.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import nox
import tomllib  # the Python 3.11 standard library
from nox.command import CommandFailed
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).parent
# Dependency order: metadata <- {testing, reshard <- {checkpoint, fsdp, torchrec, refit}}; testing
# (the rank runtime) depends on metadata only, and the other packages' tests use it.
PACKAGE_ORDER = ("metadata", "testing", "reshard", "checkpoint", "fsdp", "torchrec", "refit")
DEFAULT_TORCH = "2.13.0"
TEST_DEPS = ("pytest>=8", "hypothesis>=6.100", "pytest-timeout", "pytest-xdist")
# `lint` checks the import contracts with it; conformance/meta holds them to made-up graphs.
# Pinned: new releases change what a contract reports.
IMPORT_LINTER = "import-linter==2.17"
# The TorchRec release (and its fbgemm-gpu-cpu) built against each torch minor release; 2.15
# has none yet: 1.9.2's fbgemm 1.9.0 installs but does not load there, and the torchrec tests
# skip with the loader's error.
TORCHREC_FOR_TORCH = {
    "2.13": ("1.8.0", "1.8.0"),
    "2.14": ("1.9.2", "1.9.0"),
    "2.15": ("1.9.2", "1.9.0"),
}
FBGEMM_FOR_TORCHREC = {"1.8.0": "1.8.0", "1.9.2": "1.9.0"}
TORCHREC_DEPS = ("tensordict", "torchmetrics==1.0.3", "tqdm", "pyre-extensions")

nox.options.sessions = ["tests", "conformance", "lint", "typecheck", "spec"]
nox.options.default_venv_backend = "uv|venv"  # uv where nox finds it, else venv and pip
nox.options.reuse_existing_virtualenvs = False


def find_uv() -> str | None:
    """The uv that nox itself would use (on PATH, or installed beside nox), if any."""
    from nox.virtualenv import find_uv as nox_find_uv

    found, path, _ = nox_find_uv()
    return path if found else None


UV = find_uv()


def pip_config(python: str) -> dict[str, str]:
    """pip's settings as pip reads them, key -> value: its PIP_* variables over its
    configuration files' ``install`` section over their ``global`` one."""
    listing = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    rank = {"global": 0, "install": 1, ":env:": 2}
    found: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        key, _, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if section not in rank:
            continue
        if name not in found or rank[section] >= found[name][0]:
            found[name] = (rank[section], value.strip().strip("'\""))
    return {name: value for name, (_, value) in found.items()}


def uv_settings(python: str) -> dict[str, str]:
    """uv's environment for resolving from where pip resolves here (uv reads no pip.conf)."""
    pip = pip_config(python)
    env = {
        # pip takes the best version across every index and find-links location; uv's default
        # takes the first index that has the package, which would hide PyPI's newer releases
        # behind a local mirror's older ones.
        "UV_INDEX_STRATEGY": "unsafe-best-match",
        "UV_PYTHON_DOWNLOADS": "never",  # the venvs use this machine's Python, as venv does
        # Bytecode written at install, as pip does: uv leaves it out, and where
        # PYTHONDONTWRITEBYTECODE is set (this machine, CI) every process then compiled torch
        # again: `import torch` with DTensor and DCP took 7-8 s instead of 3 (2026-11-30), and
        # the suite starts hundreds of processes. The compile costs about 8 s a venv.
        "UV_COMPILE_BYTECODE": "1",
    }
    if "index-url" in pip:
        env["UV_INDEX_URL"] = pip["index-url"]
    if "extra-index-url" in pip:
        env["UV_EXTRA_INDEX_URL"] = " ".join(pip["extra-index-url"].split())
    if "find-links" in pip:
        env["UV_FIND_LINKS"] = ",".join(pip["find-links"].split())
    if "cert" in pip:
        env["SSL_CERT_FILE"] = pip["cert"]
    return env


if UV is not None:
    for _key, _value in uv_settings(sys.executable).items():
        os.environ.setdefault(_key, _value)  # a UV_* variable the user set wins


def packages() -> list[Path]:
    return [ROOT / "packages" / n for n in PACKAGE_ORDER if (ROOT / "packages" / n).is_dir()]


def split_args(session: nox.Session) -> tuple[str, list[str]]:
    torch_version, rest = DEFAULT_TORCH, []
    for arg in session.posargs:
        if arg.startswith("--torch="):
            torch_version = arg.split("=", 1)[1]
        elif not arg.startswith("--torchrec="):
            rest.append(arg)
    try:
        Version(torch_version)
    except InvalidVersion:
        session.error(f"--torch={torch_version}: not a release number (e.g. --torch=2.15.0)")
    return torch_version, rest


def torchrec_release(session: nox.Session, torch_version: str) -> tuple[str, str]:
    """(torchrec, fbgemm-gpu-cpu) for this session: `--torchrec=X`, or the one built for the
    torch release."""
    for arg in session.posargs:
        if arg.startswith("--torchrec="):
            wanted = arg.split("=", 1)[1]
            if wanted not in FBGEMM_FOR_TORCHREC:
                session.error(
                    f"--torchrec={wanted}: known releases are {sorted(FBGEMM_FOR_TORCHREC)}"
                )
            return wanted, FBGEMM_FOR_TORCHREC[wanted]
    minor = ".".join(torch_version.split(".")[:2])
    if minor not in TORCHREC_FOR_TORCH:
        session.error(
            f"no TorchRec release is known for torch {torch_version}; pass --torchrec=X "
            f"(one of {sorted(FBGEMM_FOR_TORCHREC)})"
        )
    return TORCHREC_FOR_TORCH[minor]


def pip_constraint_files(python: str) -> list[str]:
    """The constraint files pip applies to every install, as pip itself reads them:
    PIP_CONSTRAINT when set, else its configuration files."""
    if "PIP_CONSTRAINT" in os.environ:
        return os.environ["PIP_CONSTRAINT"].split()
    return pip_config(python).get("constraint", "").split()


def refuses_torch(path: str, torch_version: str) -> str | None:
    """The line of constraint file ``path`` that forbids ``torch_version``, if any."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        text = line.split("#", 1)[0].strip()
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.name.lower() == "torch" and not req.specifier.contains(
            torch_version, prereleases=True
        ):
            return text
    return None


def pin_torch(session: nox.Session, python: str, torch_version: str, folder: Path) -> None:
    """Every install of the session from now on runs with torch pinned to the release asked
    for, so that no dependency can swap it; a machine-wide cap that forbids that release (this
    image caps torch at 2.14.1, its CUDA builds being on disk) is lifted for these installs
    only, and every other constraint file pip was given stays."""
    pin = folder / "torch-pin.txt"
    pin.write_text(f"torch=={torch_version}\n")
    kept = []
    for path in pip_constraint_files(python):
        line = refuses_torch(path, torch_version)
        if line is None:
            kept.append(path)
        else:
            session.log(f"lifting pip's constraint {line!r} ({path}) for these installs")
    session.env["PIP_CONSTRAINT"] = " ".join([*kept, str(pin)])
    session.env["UV_CONSTRAINT"] = session.env["PIP_CONSTRAINT"]  # the same files for uv


class Stack:
    """The shared virtualenv of one torch release (and TorchRec release): created once, torch
    installed as asked and checked to be the one that runs, then the test tools and every
    package, editable, with torch held at that release."""

    def __init__(
        self,
        session: nox.Session,
        torch_version: str,
        torchrec: str | None = None,
        peer: str | None = None,
    ):
        self.session = session
        self.torch_version = torch_version
        name = f"torch-{torch_version}" + (f"-torchrec-{torchrec}" if torchrec else "")
        name += f"-{peer}" if peer else ""
        self.location = ROOT / ".nox" / name
        self.bin = self.location / "bin"
        self.python = str(self.bin / "python")

    def create(self) -> None:
        session = self.session
        if not Path(self.python).exists() and UV is not None:
            # --seed: pip too, which pin_torch asks for its constraints and which installs
            # the one wheel uv will not (Megatron's, for its Requires-Python)
            make = [UV, "venv", "--quiet", "--seed", "--python", sys.executable]
            session.run(*make, str(self.location))
        elif not Path(self.python).exists():
            session.run(sys.executable, "-m", "venv", str(self.location))
        else:
            session.log(f"reusing {self.location}")
        session.env["VIRTUAL_ENV"] = str(self.location)
        session.env["PATH"] = os.pathsep.join([str(self.bin), os.environ.get("PATH", "")])
        pin_torch(session, self.python, self.torch_version, self.location)

    def install(self, *args: str, pip: bool = False) -> None:
        """``pip install args`` into this venv, by uv where there is one (unless ``pip``)."""
        if UV is not None and not pip:
            cmd = [UV, "pip", "install", "--quiet", "--python", self.python, *args]
            self.session.run(*cmd, silent=False)
        else:
            self.session.run(self.python, "-m", "pip", "install", "--quiet", *args, silent=False)

    def check_torch(self) -> str:
        out = self.session.run(
            self.python, "-c", "import torch; print(torch.__version__)", silent=True
        )
        found = str(out).strip().splitlines()[-1]
        # a local label names the build (2.15.0+cu130, 2.13.0+cpu): the release is the rest
        if Version(Version(found).public) != Version(self.torch_version):
            self.session.error(
                f"torch {found} runs in {self.location}, but --torch={self.torch_version} was "
                "asked for; delete that directory and run again"
            )
        self.session.log(f"torch {found} ({self.location})")
        return found


def install_checkout(stack: Stack) -> None:
    """Every package of this checkout, editable, into ``stack``, and their bytecode and the
    suite's written: an editable install compiles nothing, and where PYTHONDONTWRITEBYTECODE
    is set (see ``uv_settings``) no process would write it."""
    editable: list[str] = []
    for pkg in packages():
        editable += ["-e", str(pkg)]
    stack.install(*editable)
    sources = [str(pkg / "src") for pkg in packages()] + [str(ROOT / "conformance")]
    stack.session.run(stack.python, "-m", "compileall", "-q", "-j", "0", *sources, silent=True)


def peer_stack(session: nox.Session, torch_version: str, peer: str) -> Stack:
    """A peer's own venv, `.nox/torch-<release>-<peer>`, made and torch installed alone in it
    (checked to be the release asked for); the session installs the rest."""
    stack = Stack(session, torch_version, peer=peer)
    stack.create()
    stack.install(f"torch=={torch_version}")
    stack.check_torch()
    return stack


def install_stack(
    session: nox.Session, *extra: str, torchrec: bool = False, peer: str | None = None
) -> Stack:
    """The session's shared virtualenv with torch (the release asked for), the test tools,
    ``extra`` and every package, editable; TorchRec too when asked. A ``peer`` (``megatron-
    0.19.2``) gets a venv of its own, its package installed by the session."""
    torch_version, _ = split_args(session)
    trec = torchrec_release(session, torch_version) if torchrec else None
    stack = Stack(session, torch_version, trec[0] if trec else None, peer)
    stack.create()
    # torch first and alone: with the pin satisfied, nothing later can pull another build.
    stack.install(f"torch=={torch_version}")
    stack.check_torch()
    stack.install(*TEST_DEPS, *extra)
    install_checkout(stack)
    if trec is not None:
        # --no-deps: torchrec's own requirements name a torch of their choosing.
        stack.install(f"fbgemm-gpu-cpu=={trec[1]}", *TORCHREC_DEPS)
        stack.install("--no-deps", f"torchrec=={trec[0]}")
    stack.check_torch()  # what runs the tests, after everything that could have moved it
    return stack


def run_pytest(stack: Stack, *args: str) -> None:
    # pytest exits 5 when it collected nothing; a package with no tests yet must not pass
    # silently, so that stays a failure.
    stack.session.run(stack.python, "-m", "pytest", *args)


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """Unit and property tests of every package."""
    test_dirs = [str(p / "tests") for p in packages() if (p / "tests").is_dir()]
    if (ROOT / "conformance" / "meta").is_dir():
        test_dirs.append("conformance/meta")
    run_tests(session, test_dirs)


def run_tests(session: nox.Session, paths: list[str]) -> None:
    """pytest on ``paths`` in the session's stack (with import-linter, which the contract tests
    call), the session's own arguments after them."""
    stack = install_stack(session, IMPORT_LINTER)
    _, rest = split_args(session)
    # Tests marked slow (an 8-rank world, say) run in `nox -s slow`; a `-m` of your own wins.
    select = [] if "-m" in rest else ["-m", "not slow"]
    run_pytest(stack, *paths, *select, *rest)


# The tests whose outcome can change with torch's release: those that call upstream's
# distributed APIs (DTensor and its placements, ShardedTensor, DCP, FSDP, LocalTensorMode, the
# threaded world, TorchRec, float8), upstream's known defects among them. The rest, the
# planner, the executor over c10d's plain collectives, the rank pool and the suite's own
# machinery (conformance/meta), is the same on every release; `tests` runs it on the oldest.
RELEASE_TESTS = (
    "packages/metadata/tests",
    "packages/checkpoint/tests",
    "packages/fsdp/tests",
    "packages/torchrec/tests",
    "packages/refit/tests",
    "packages/reshard/tests/test_frontends.py",
    "packages/reshard/tests/test_dtensor_io.py",
    "packages/testing/tests/test_local_tensor.py",
    "packages/testing/tests/test_simulated.py",
)


@nox.session(venv_backend="none")
def tests_release(session: nox.Session) -> None:
    """The release-dependent tests only (RELEASE_TESTS): what CI runs on a second torch
    release (`nox -s tests_release -- --torch=2.15.0`), where all of `tests` took 19 min."""
    missing = [t for t in RELEASE_TESTS if not (ROOT / t).exists()]
    if missing:
        session.error(f"RELEASE_TESTS names what is not there: {missing}")
    run_tests(session, list(RELEASE_TESTS))


@nox.session(venv_backend="none")
def slow(session: nox.Session) -> None:
    """The tests marked slow: larger worlds and longer hunts than the default suite."""
    stack = install_stack(session, IMPORT_LINTER)
    _, rest = split_args(session)
    test_dirs = [str(p / "tests") for p in packages() if (p / "tests").is_dir()]
    run_pytest(stack, *test_dirs, "conformance/meta", "-m", "slow", *rest)
    session.env["SHARDSPEC_IMPL"] = "shardspec"
    run_pytest(stack, "conformance/tests", "-m", "slow", *rest)


@nox.session(venv_backend="none")
def conformance(session: nox.Session) -> None:
    """The conformance suite against shardspec, on gloo ranks (world sizes 1-4). With
    `-- --coverage`, the same run measured as `nox -s coverage` measures it (CI's way: the
    suite runs once and gives both verdicts)."""
    measure = "--coverage" in session.posargs
    stack = install_stack(session, *(["coverage[toml]>=7.10.4"] if measure else []))
    _, rest = split_args(session)
    rest = [a for a in rest if a != "--coverage"]
    if measure:
        _measured_conformance(session, stack, rest)
        return
    session.env["SHARDSPEC_IMPL"] = "shardspec"
    # The faults area's 2 GiB state dict is marked slow (`nox -s slow` runs it).
    select = [] if "-m" in rest else ["-m", "not slow"]
    run_pytest(stack, "conformance/tests", *select, *rest)


# World sizes `conformance_scale` simulates, and the areas it runs there (dtensor: meshes of
# exactly W devices up to 4-D; reshard: layouts over W ranks, more ranks than rows; fsdp: FSDP x
# TP and HSDP x TP meshes of W devices, 2-D to 4-D; validation: grids and chunkings of W cells).
SCALE_WORLDS = "8,64,512,1024"
LOCAL_TESTS = (
    "conformance/tests/test_convert.py::test_dtensor_chunk_lists_on_every_rank_of_a_large_mesh",
    "conformance/tests/test_dtensor_moves.py::"
    "test_redistribute_on_every_rank_of_a_large_mesh_holds_the_oracles_pieces",
    "conformance/tests/test_dtensor_moves.py::"
    "test_redistribute_on_a_large_flattened_mesh_holds_the_oracles_pieces",
)
SCALE_EXAMPLES = "3"
SCALE_AREAS = (
    "conformance/tests/test_reshard.py",
    "conformance/tests/test_dtensor.py",
    "conformance/tests/test_validation.py",
    # HSDP x TP on 3-D and 4-D meshes; against torch each test's explicit example (a known
    # defect, on 4 gloo ranks) fails first, so no failing world of 1024 threads is shrunk
    "conformance/tests/test_fsdp.py",
    # real dcp.save on one simulated world and dcp.load on another, up to 64 ranks (files)
    "conformance/tests/test_checkpoint.py::test_a_checkpoint_saved_on_one_world_loads_on_another",
    # the collective load (both read modes) between simulated worlds of up to 64 ranks
    "conformance/tests/test_checkpoint_collective_load.py",
    # refit on simulated worlds of up to 64 ranks (more ranks than the models' rows): drawn
    # models and recipes, the Megatron-style grids and the refusals, every rank agreeing
    "conformance/tests/test_refit.py",
    # every rank of a mesh as one program on LocalTensorMode (against torch; shardspec's
    # frontends are reported unsupported there and run on the threaded worlds above)
    *LOCAL_TESTS,
    # permuted meshes on threads, of the simulated worlds up to 64 ranks: each example builds
    # a new DeviceMesh, whose every rank creates every subgroup (2 s at 64 ranks, 2 minutes
    # at 512). LocalTensorMode cannot run a permuted mesh in torch 2.13.
    "conformance/tests/test_dtensor_moves.py::"
    "test_redistribute_on_a_mesh_in_any_rank_order_holds_the_oracles_pieces",
)
# Not here: the pooled flattened and scatter tests of test_dtensor_moves.py; the ascending and
# flattened moves run at these sizes as one program (LOCAL_TESTS).


@nox.session(venv_backend="none")
def coverage(session: nox.Session) -> None:
    """Branch coverage of packages/*/src by `nox -s conformance` alone (the same tests and
    examples; pool ranks and simulated ranks measured too), per module; fails under the floor
    in pyproject.toml's [tool.coverage.report]. conformance/coverage_audit.py prints every
    uncovered line and branch of a public function with its reason from
    conformance/coverage-allow.txt, and fails on any without one; reasons that match nothing
    in this run are listed as stale. `nox -s conformance -- --coverage` is the same run."""
    stack = install_stack(session, "coverage[toml]>=7.10.4")
    _, rest = split_args(session)
    _measured_conformance(session, stack, rest)


def _measured_conformance(session: nox.Session, stack: Stack, rest: list[str]) -> None:
    session.env["SHARDSPEC_IMPL"] = "shardspec"
    # measured ranks run slower: a pool timeout would fail a test and hide what it reaches
    session.env["SHARDSPEC_POOL_TIMEOUT"] = os.environ.get("SHARDSPEC_POOL_TIMEOUT", "60")
    # Derandomized (CI's profile) everywhere: with random draws the covered branches differ
    # from run to run, and the audit below would flag a different few each time.
    session.env["HYPOTHESIS_PROFILE"] = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    shutil.rmtree(ROOT / ".coverage-conformance", ignore_errors=True)
    select = [] if "-m" in rest else ["-m", "not slow"]
    # pool ranks end with os._exit, after saving their data (shardspec.testing.worker)
    cov = [stack.python, "-m", "coverage"]
    session.run(*cov, "run", "-m", "pytest", "conformance/tests", *select, *rest)
    session.run(*cov, "combine", "-q")
    report = ROOT / ".coverage-conformance" / "coverage.json"
    session.run(*cov, "json", "-q", "--fail-under=0", "-o", str(report))
    # Both verdicts every run: the audit (each uncovered public line and branch with its
    # reason, per-package figures) is printed even when the floor fails, and vice versa.
    failed = []
    for what, args in (
        ("audit", [stack.python, "conformance/coverage_audit.py", str(report)]),
        ("floor", [*cov, "report"]),
    ):
        try:
            session.run(*args)
        except CommandFailed:
            failed.append(what)
    if failed:
        session.error(f"coverage: {' and '.join(failed)} failed (see above)")


def loopback_launch() -> ModuleType:
    """``shardspec.testing.loopback_launch``, loaded from its file: it needs only the standard
    library, and this interpreter has no torch to import the package with."""
    path = ROOT / "packages/testing/src/shardspec/testing/loopback_launch.py"
    spec = importlib.util.spec_from_file_location("shardspec_loopback_launch", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@nox.session(venv_backend="none")
def conformance_launched(session: nox.Session) -> None:
    """The conformance suite under torchrun: launcher rank 0 runs pytest, ranks 1-4 are the
    pools (gloo on loopback; 5 processes, so world sizes 1-4 as in `conformance`), in a network
    namespace of its own that holds only `lo`: torchrun's rendezvous store listens on every
    interface whatever it is asked (spec CONF-9). Where no namespace can be made the session
    stops, unless SHARDSPEC_LAUNCH_ANY_INTERFACE=1 lets the store listen on every interface."""
    stack = install_stack(session)
    _, rest = split_args(session)
    session.env["SHARDSPEC_IMPL"] = "shardspec"
    # Launcher ranks cannot be restarted after a timeout, so a slow machine must not cause one.
    session.env["SHARDSPEC_POOL_TIMEOUT"] = os.environ.get("SHARDSPEC_POOL_TIMEOUT", "60")
    nproc = int(os.environ.get("SHARDSPEC_LAUNCH_NPROC", "5"))
    # As in `conformance`: the tests marked slow run in `nox -s slow`; a `-m` of your own wins.
    # Those that spawn worlds of their own (FSDP models, resumes, the faults area's killed and
    # hung ranks) never meet the launched ranks: here they would only repeat the pooled run,
    # at 3 of this session's 5 minutes.
    select = [] if "-m" in rest else ["-m", "not slow and not own_world"]
    launch = loopback_launch()
    cmd = launch.torchrun_command(
        stack.python, nproc, ["conformance/tests", "-p", "no:cacheprovider", *select, *rest]
    )
    problem = launch.namespace_problem(stack.python)
    if problem is None:
        session.log("torchrun runs in a network namespace of its own holding only lo")
        cmd = launch.isolated(cmd, stack.python)
    elif os.environ.get(launch.OPT_OUT) == "1":
        session.warn(
            f"no network namespace here ({problem}); {launch.OPT_OUT}=1, so torchrun runs "
            "as it is: its rendezvous store listens on EVERY interface of this machine for "
            "the whole run (unauthenticated), the ranks' sockets on 127.0.0.1"
        )
    else:
        session.error(
            f"no network namespace here ({problem}), and without one torchrun's rendezvous "
            "store listens on every interface of this machine (conformance/repros/"
            f"torchrun-store-binds-every-interface.py). Run as root or where user namespaces "
            f"are allowed, or set {launch.OPT_OUT}=1 to run with the store on every interface"
        )
    session.run(*cmd)


@nox.session(venv_backend="none")
def conformance_scale(session: nox.Session) -> None:
    """The reshard, dtensor, fsdp (HSDP x TP, 3-D and 4-D meshes) and validation areas on
    simulated worlds of 8 to 1024 ranks (threads on torch's threaded process group), DCP round
    trips and refits on worlds of up to 64 of them, and
    DTensor's moves and chunk lists as one program for every rank (LocalTensorMode), against
    shardspec and against torch."""
    stack = install_stack(session)
    _, rest = split_args(session)
    session.env["SHARDSPEC_SIM_WORLDS"] = os.environ.get("SHARDSPEC_SIM_WORLDS", SCALE_WORLDS)
    session.env["SHARDSPEC_LOCAL_WORLDS"] = os.environ.get("SHARDSPEC_LOCAL_WORLDS", SCALE_WORLDS)
    session.env["HYPOTHESIS_PROFILE"] = "short"
    # An example at 1024 ranks costs seconds: SCALE_EXAMPLES per property keeps both
    # implementations' runs under 15 minutes on 2 cores (set SHARDSPEC_EXAMPLES for more).
    session.env["SHARDSPEC_EXAMPLES"] = os.environ.get("SHARDSPEC_EXAMPLES", SCALE_EXAMPLES)
    for impl in os.environ.get("SHARDSPEC_SCALE_IMPLS", "shardspec,torch").split(","):
        session.env["SHARDSPEC_IMPL"] = impl
        run_pytest(stack, *SCALE_AREAS, "-p", "no:cacheprovider", *rest)


@nox.session(venv_backend="none")
def conformance_upstream(session: nox.Session) -> None:
    """The conformance suite against upstream torch; writes conformance-report.{md,json}."""
    # with TorchRec, so the report covers TorchRec's plan helpers too
    stack = install_stack(session, torchrec=True)
    _, rest = split_args(session)
    session.env["SHARDSPEC_IMPL"] = "torch"
    session.run(stack.python, "-m", "conformance.report", "--out", "conformance-report", *rest)


# ByteCheckpoint under test. 0.0.2 pins torch<=2.5.0 (and grpcio==1.69.0, protobuf==3.20.3,
# mmh3<=4.2.0): it is installed --no-deps beside the torch asked for, with its own imports at
# the versions its metadata names.
BYTECHECKPOINT = "0.0.2"
BYTECHECKPOINT_DEPS = (
    "mmh3>=4.1.0,<=4.2.0",
    "universal-pathlib>=0.2.2,<=1.0.0",
    "cachetools>=5.4.0,<=10.0.0",
    "safetensors>=0.4.5,<=1.0.0",
    "numpy",
    "typing-extensions",
    "grpcio==1.69.0",
    "protobuf==3.20.3",
)


@nox.session(venv_backend="none")
def peers_bytecheckpoint(session: nox.Session) -> None:
    """The conformance suite against ByteCheckpoint 0.0.2 (SHARDSPEC_IMPL=bytecheckpoint) in
    its own venv, `.nox/torch-<release>-bytecheckpoint-0.0.2` (torch 2.13.0 CPU by default,
    the test tools, every package editable, ByteCheckpoint --no-deps); writes
    conformance-report-bytecheckpoint/ (its divergences with their repros). Its saves are
    held to 127.0.0.1 (conformance/peers/bytecheckpoint/env.py)."""
    torch_version, rest = split_args(session)
    # its own venv beside the shared ones: ByteCheckpoint's pinned grpcio and protobuf stay
    # out of the venvs every other session uses
    stack = peer_stack(session, torch_version, f"bytecheckpoint-{BYTECHECKPOINT}")
    stack.install(*TEST_DEPS)
    install_checkout(stack)
    stack.install(*BYTECHECKPOINT_DEPS)
    stack.install("--no-deps", f"bytecheckpoint=={BYTECHECKPOINT}")
    stack.check_torch()
    session.env["SHARDSPEC_IMPL"] = "bytecheckpoint"
    draw_past_known(session)
    # a rank's first save starts ByteCheckpoint's coordinator and thread pools: give the pool
    # a minute per example on this shared machine (a hang is still caught)
    session.env["SHARDSPEC_POOL_TIMEOUT"] = os.environ.get("SHARDSPEC_POOL_TIMEOUT", "60")
    out = "conformance-report-bytecheckpoint"
    select = [] if "-m" in rest else ["-m", "not slow"]
    # --gate: its known defects are strict expected failures, so a failed test fails the session
    session.run(stack.python, "-m", "conformance.report", "--out", out, "--gate", *select, *rest)


MEGATRON_RELEASE = "0.19.2"
# What Megatron-Core needs at run time beside torch, pinned: numpy and packaging (its own
# requirements), triton (imported when megatron.core is), psutil (its save).
MEGATRON_DEPS = ("numpy==2.4.6", "packaging==26.4", "triton==3.6.0", "psutil==7.2.2")


def draw_past_known(session: nox.Session) -> None:
    """A peer's known defects do not stop a property at its first example (CONF-14): its
    drawn examples still run against the peer, those showing a known defect's signature are
    counted, any other failure fails the session. SHARDSPEC_DRAW_PAST_KNOWN overrides ("0":
    none; else test names, comma-separated patterns)."""
    session.env["SHARDSPEC_DRAW_PAST_KNOWN"] = os.environ.get("SHARDSPEC_DRAW_PAST_KNOWN", "1")


@nox.session(venv_backend="none")
def peers_megatron(session: nox.Session) -> None:
    """Megatron-Core's dist_checkpointing under the conformance suite, in its own venv
    (`.nox/torch-<release>-megatron-0.19.2`): writes conformance-report-megatron/, after
    writing a fresh Megatron checkpoint and reading it with shardspec's tools."""
    stack = install_stack(session, *MEGATRON_DEPS, peer=f"megatron-{MEGATRON_RELEASE}")
    _, rest = split_args(session)
    # Its only wheel (cp311) declares Requires-Python >= 3.12; it runs on 3.11. --no-deps:
    # its requirements are the pins above (and torch, held at the release asked for).
    wheels = Path(session.create_tmp()) / "megatron-wheel"
    shutil.rmtree(wheels, ignore_errors=True)
    session.run(
        stack.python, "-m", "pip", "download", "--quiet", f"megatron-core=={MEGATRON_RELEASE}",
        "--no-deps", "--ignore-requires-python", "-d", str(wheels),
    )  # fmt: skip
    # by pip: uv has no --ignore-requires-python for an install
    wheel = [str(w) for w in wheels.glob("*.whl")]
    stack.install("--no-deps", "--ignore-requires-python", *wheel, pip=True)
    stack.check_torch()
    # The committed Megatron checkpoint's writer, rerun with the real package; the package
    # tests read both (CKPT-21).
    fresh = Path(session.create_tmp()) / "megatron-checkpoint"
    shutil.rmtree(fresh, ignore_errors=True)
    session.run(
        stack.python, "packages/checkpoint/tests/peer_checkpoints.py", "megatron", str(fresh)
    )
    session.env["SHARDSPEC_MEGATRON_CHECKPOINT"] = str(fresh)
    run_pytest(stack, "packages/checkpoint/tests/test_peer_checkpoints.py")
    session.env["SHARDSPEC_IMPL"] = "megatron"
    draw_past_known(session)
    # Every Megatron save or load that fails on some ranks restarts a pool, whose ranks import
    # Megatron again (seconds each): a few derandomized examples per property; the known
    # defects are explicit examples, so they show every run.
    session.env["HYPOTHESIS_PROFILE"] = os.environ.get("HYPOTHESIS_PROFILE", "short")
    session.env["SHARDSPEC_EXAMPLES"] = os.environ.get("SHARDSPEC_EXAMPLES", "10")
    # --gate: its known defects are strict expected failures, so a failed test fails the session
    session.run(
        stack.python, "-m", "conformance.report", "--out", "conformance-report-megatron",
        "--gate", *rest,
    )  # fmt: skip


DEEPSPEED = "0.19.8"
# What DeepSpeed needs at run time beside torch (its requirements), pinned; pydantic brings its
# own pins.
DEEPSPEED_DEPS = (
    "einops==0.8.2", "hjson==3.1.0", "msgpack==1.2.4", "ninja==1.13.2", "numpy==2.4.6",
    "packaging==26.4", "psutil==7.2.2", "py-cpuinfo==9.0.0", "pydantic==2.14.4", "tqdm==4.70.1",
)  # fmt: skip


@nox.session(venv_backend="none")
def peers_deepspeed(session: nox.Session) -> None:
    """The conformance suite against DeepSpeed 0.19.8 (SHARDSPEC_IMPL=deepspeed) in its own
    venv, `.nox/torch-<release>-deepspeed-0.19.8` (torch 2.13.0 CPU by default): its ZeRO
    checkpoints (stages 1-3) saved on one data-parallel size, made universal and loaded on
    another, and read by zero_to_fp32; writes conformance-report-deepspeed/ (its divergences
    with their repros). DeepSpeed comes only as a source release: built here with no op
    compiled (DS_BUILD_OPS=0, against the venv's torch), run with DS_ACCELERATOR=cpu on gloo."""
    torch_version, rest = split_args(session)
    stack = peer_stack(session, torch_version, f"deepspeed-{DEEPSPEED}")
    stack.install(*TEST_DEPS, *DEEPSPEED_DEPS, "setuptools", "wheel")
    install_checkout(stack)
    # its setup.py imports torch to decide which ops to build: against this venv's, none built
    session.env["DS_BUILD_OPS"] = "0"
    stack.install("--no-deps", "--no-build-isolation", f"deepspeed=={DEEPSPEED}")
    stack.check_torch()
    session.env["DS_ACCELERATOR"] = "cpu"
    session.env["SHARDSPEC_IMPL"] = "deepspeed"
    draw_past_known(session)
    # Each example starts two fresh worlds (a save and a load) whose ranks import DeepSpeed:
    # a few derandomized examples per property beside the explicit ones, where the known
    # defects are.
    session.env["HYPOTHESIS_PROFILE"] = os.environ.get("HYPOTHESIS_PROFILE", "short")
    session.env["SHARDSPEC_EXAMPLES"] = os.environ.get("SHARDSPEC_EXAMPLES", "3")
    out = "conformance-report-deepspeed"
    # --gate: its known defects are strict expected failures, so a failed test fails the session
    session.run(stack.python, "-m", "conformance.report", "--out", out, "--gate", *rest)


TRANSFORMERS = "5.23.0"
# transformers' distributed loading asks for accelerate (a device_map); the rest of their
# requirements pinned at what they resolved to on 2026-11-30.
TRANSFORMERS_DEPS = (
    "accelerate==1.15.0", "huggingface-hub==2.4.0", "safetensors==0.8.0", "tokenizers==0.23.3",
    "numpy==2.4.6", "packaging==26.4", "regex==2026.11.19", "tqdm==4.70.1",
)  # fmt: skip


@nox.session(venv_backend="none")
def peers_transformers(session: nox.Session) -> None:
    """The conformance suite against transformers 5.23.0 (SHARDSPEC_IMPL=transformers) in its
    own venv, `.nox/torch-<release>-transformers-5.23.0` (torch 2.13.0 CPU by default): a
    Llama-style safetensors model loaded with DistributedConfig(tp_size, fsdp_size) on 4 gloo
    CPU ranks, each rank's shard against the reference, and saved and loaded on another mesh;
    writes conformance-report-transformers/."""
    torch_version, rest = split_args(session)
    stack = peer_stack(session, torch_version, f"transformers-{TRANSFORMERS}")
    stack.install(*TEST_DEPS, *TRANSFORMERS_DEPS, f"transformers=={TRANSFORMERS}")
    install_checkout(stack)
    stack.check_torch()
    session.env["SHARDSPEC_IMPL"] = "transformers"
    draw_past_known(session)
    # Each example starts fresh worlds of 4 ranks that import transformers: a few derandomized
    # examples per property beside the explicit ones.
    session.env["HYPOTHESIS_PROFILE"] = os.environ.get("HYPOTHESIS_PROFILE", "short")
    session.env["SHARDSPEC_EXAMPLES"] = os.environ.get("SHARDSPEC_EXAMPLES", "3")
    # no network: the model directories are local, and the hub is never asked
    session.env["HF_HUB_OFFLINE"] = "1"
    out = "conformance-report-transformers"
    # --gate: its known defects are strict expected failures, so a failed test fails the session
    session.run(stack.python, "-m", "conformance.report", "--out", out, "--gate", *rest)


MATRIX_RELEASES = "2.13.0,2.14.1,2.15.0"


@nox.session(venv_backend="none")
def report_matrix(session: nox.Session) -> None:
    """The upstream report on several torch releases, merged into one verdict per defect and
    release: `nox -s report_matrix -- --torch=2.13.0,2.14.1,2.15.0 [--out DIR]`."""
    releases, out, rest = MATRIX_RELEASES, "report-matrix", []
    args = list(session.posargs)
    while args:
        arg = args.pop(0)
        if arg.startswith("--torch="):
            releases = arg.split("=", 1)[1]
        elif arg == "--out" and args:
            out = args.pop(0)
        elif arg.startswith("--out="):
            out = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    folders = []
    for release in [r.strip() for r in releases.split(",") if r.strip()]:
        folder = f"{out}/torch-{release}"
        # one nox run per release: each installs (or reuses) that release's own venv
        session.run(
            "python3", "-m", "nox", "-s", "conformance_upstream", "--",
            f"--torch={release}", "--out", folder, *rest, external=True,
        )  # fmt: skip
        folders.append(folder)
    session.run("python3", "-m", "conformance.report.matrix", "--out", out, *folders)


def cuda_device_count() -> int:
    """GPUs visible to this machine, asked of the driver: no torch needed, nothing installed."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    listing = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
    if listing.returncode != 0:
        return 0
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))


@nox.session
def conformance_gpu(session: nox.Session) -> None:
    """The conformance suite on CUDA: one GPU per rank under NCCL where there are several; on
    one GPU, NCCL at world size 1 and then gloo ranks (1-4) sharing the GPU with CUDA tensors,
    which exercises every device path of the executor."""
    _, rest = split_args(session)
    if cuda_device_count() < 1:
        session.skip("conformance_gpu needs a CUDA GPU; nvidia-smi sees none")
    session.install("torch")  # the CUDA build: no CPU pin on a GPU node
    session.install(*TEST_DEPS)
    for pkg in packages():
        session.install("-e", str(pkg))
    # The phases live in conformance/gpu/phases.py so that a GPU machine with no package index runs
    # the same thing with its own CUDA torch: `python -m conformance.gpu`.
    select = [] if "-m" in rest else ["-m", "not slow"]
    session.run("python", "-m", "conformance.gpu", *select, *rest)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting; import-linter: the direction of dependencies and no import
    circles (the contracts in pyproject.toml)."""
    session.install("ruff==0.17.6", IMPORT_LINTER)  # pinned: new ruff releases add rules
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    # import-linter reads the sources only: the packages are found on PYTHONPATH, torch-free,
    # and .ci holds the contract type it adds (import_contracts.py).
    paths = [ROOT / ".ci", *sorted((ROOT / "packages").glob("*/src"))]
    session.run("lint-imports", "--no-cache", env={"PYTHONPATH": os.pathsep.join(map(str, paths))})


@nox.session(venv_backend="none")
def typecheck(session: nox.Session) -> None:
    """mypy --strict on every package's src/."""
    stack = install_stack(session, "mypy==2.4.1", "numpy")
    srcs = [str(p / "src") for p in packages()]
    session.run(stack.python, "-m", "mypy", *srcs)


@nox.session
def spec(session: nox.Session) -> None:
    """Traceability: every rule in spec/ has a test, every test cites an existing rule."""
    args = ["--check"] if os.environ.get("CI") else []
    session.run("python", "spec/trace.py", *args, *session.posargs, external=True)


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Benchmarks, reported as ratios against baselines measured in the same run."""
    stack = install_stack(session)
    _, rest = split_args(session)
    scripts = sorted(str(p) for pkg in packages() for p in (pkg / "benchmarks").glob("bench_*.py"))
    # the suite's own (conformance/bench/) and each peer's (conformance/peers/<name>/bench.py)
    suite = ROOT / "conformance"
    scripts += sorted(str(p) for p in (suite / "bench").glob("*.py") if p.name != "__init__.py")
    scripts += sorted(str(p) for p in (suite / "peers").glob("*/bench.py"))
    for script in scripts:
        session.run(stack.python, script, *rest)


@nox.session(venv_backend="none")
def torchrec(session: nox.Session) -> None:
    """TorchRec on CPU (1.8.0 with torch 2.13, 1.9.2 with 2.14; `--torchrec=X` picks another):
    the shardspec.torchrec tests and conformance area with it."""
    stack = install_stack(session, torchrec=True)
    _, rest = split_args(session)
    run_pytest(stack, "packages/torchrec/tests", "conformance/tests", "-k", "torchrec", *rest)


def distribution(pkg: Path) -> tuple[str, str, list[str]]:
    """(name, version, dependencies) from a package's pyproject.toml."""
    project = tomllib.loads((pkg / "pyproject.toml").read_text())["project"]
    return project["name"], project["version"], list(project.get("dependencies", []))


def check_sibling_pins() -> None:
    """Every shardspec-* dependency names a sibling at exactly its version, so that
    `pip install --find-links dist` resolves the monorepo's own builds and nothing else."""
    versions = {name: version for name, version, _ in map(distribution, packages())}
    for pkg in packages():
        name, _, deps = distribution(pkg)
        for dep in deps:
            if not dep.startswith("shardspec-"):
                continue
            pin = re.fullmatch(r"(shardspec-[a-z]+)==([0-9][0-9a-z.]*)", dep)
            if pin is None or versions.get(pin[1]) != pin[2]:
                raise RuntimeError(
                    f"{name} depends on {dep!r}; siblings must be pinned as "
                    f"NAME==VERSION with the sibling's own version ({versions})"
                )


@nox.session
def build(session: nox.Session) -> None:
    """A wheel and an sdist of every distribution into dist/ (emptied first)."""
    check_sibling_pins()
    # One build environment for all of them (hatchling, as the pyprojects require) instead of
    # an isolated one per wheel and per sdist.
    session.install("build>=1.2", "hatchling>=1.21")
    out = ROOT / "dist"
    shutil.rmtree(out, ignore_errors=True)
    for pkg in packages():
        session.run("python", "-m", "build", "--no-isolation", "--outdir", str(out), str(pkg))


def sibling_closure(dist: str) -> list[str]:
    """``dist`` and every shardspec distribution it pulls, directly or not."""
    deps = {
        name: [d.split("==")[0] for d in ds if d.startswith("shardspec-")]
        for name, _, ds in map(distribution, packages())
    }
    seen: list[str] = []
    todo = [dist]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.append(name)
            todo += deps[name]
    return seen


# The README's examples, each run by `wheels` once, beside the distribution of its module
# alone (the distributions that depend on it import it the same way, which the probe checks).
EXAMPLES = (
    ("shardspec.reshard", "reshard_dtensor.py"),
    ("shardspec.fsdp", "resume_on_another_mesh.py"),
    ("shardspec.refit", "refit_train_to_serve.py"),
)


@nox.session(requires=["build"], venv_backend="venv")  # pip: what a user runs
def wheels(session: nox.Session) -> None:
    """What a user does, for every distribution: `pip install --find-links dist <dist>` beside
    a preinstalled torch, then import it and its siblings from site-packages and run its own
    module's README example from there (4 gloo ranks under torchrun)."""
    torch_version, _ = split_args(session)
    venv = Path(str(session.virtualenv.location))
    pin_torch(session, str(venv / "bin" / "python"), torch_version, venv)
    session.install(f"torch=={torch_version}")
    # Installing torch takes minutes; one venv serves every distribution, put back to
    # torch-alone between them (every package pip added is removed), which is a fresh venv.
    stale = [n for n in pip_freeze(session) if n.startswith("shardspec")]  # a reused venv
    if stale:
        session.run("python", "-m", "pip", "uninstall", "--yes", *stale)
    baseline = set(pip_freeze(session))
    work = Path(session.create_tmp()).resolve()
    probe = ROOT / ".ci" / "check_installed.py"
    for dist in (distribution(pkg)[0] for pkg in packages()):
        session.log(f"--- {dist}, alone, from dist/")
        session.install("--find-links", str(ROOT / "dist"), dist)
        session.run("python", "-m", "pip", "check")
        modules = [n.replace("shardspec-", "shardspec.") for n in sibling_closure(dist)]
        own = dist.replace("shardspec-", "shardspec.")
        with session.chdir(work):
            session.run("python", str(probe), str(ROOT), torch_version, *modules)
            if "shardspec.checkpoint" in modules:  # its console script is on PATH and starts
                session.run("shardspec", "--help", silent=True)
            for module, example in EXAMPLES:
                if module == own:
                    # A copy outside the source tree, run from there: nothing imports the
                    # checkout.
                    shutil.copy(ROOT / "examples" / example, work / example)
                    session.run(
                        "torchrun",
                        "--standalone",
                        "--nproc-per-node",
                        "4",
                        str(work / example),
                        env={"OMP_NUM_THREADS": "1"},
                    )
        added = sorted(set(pip_freeze(session)) - baseline)
        session.run("python", "-m", "pip", "uninstall", "--yes", *added)


def pip_freeze(session: nox.Session) -> list[str]:
    out = session.run("python", "-m", "pip", "freeze", silent=True)
    return [line.split("==")[0].split(" @ ")[0] for line in str(out).splitlines() if line]
