"""The project's front door: `nox -s <session>`.

CPU sessions pin torch==2.13.0 (the CPU build); pass `--torch=VERSION` after `--` to test
another, e.g. `nox -s tests -- --torch=2.12.0`. Every other argument after `--` goes to pytest
(or to the benchmark script, for `bench`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import nox
import tomllib  # the Python 3.11 standard library

ROOT = Path(__file__).parent
# Dependency order: metadata <- {testing, reshard <- {fsdp, torchrec}}; testing (the rank
# runtime) depends on metadata only, and the other packages' tests use it.
PACKAGE_ORDER = ("metadata", "testing", "reshard", "fsdp", "torchrec")
DEFAULT_TORCH = "2.13.0"
TEST_DEPS = ("pytest>=8", "hypothesis>=6.100", "pytest-timeout", "pytest-xdist")
TORCHREC_DEPS = (
    "fbgemm-gpu-cpu==1.8.0",
    "tensordict",
    "torchmetrics==1.0.3",
    "tqdm",
    "pyre-extensions",
)

nox.options.sessions = ["tests", "conformance", "lint", "typecheck", "spec"]
nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = False


def packages() -> list[Path]:
    return [ROOT / "packages" / n for n in PACKAGE_ORDER if (ROOT / "packages" / n).is_dir()]


def split_args(session: nox.Session) -> tuple[str, list[str]]:
    torch_version = DEFAULT_TORCH
    rest: list[str] = []
    for arg in session.posargs:
        if arg.startswith("--torch="):
            torch_version = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return torch_version, rest


def install_stack(session: nox.Session, *extra: str) -> list[str]:
    """Install torch (pinned), the test tools and every package, editable; return posargs."""
    torch_version, rest = split_args(session)
    # torch first and alone: with the pin satisfied, nothing later can pull a CUDA build.
    session.install(f"torch=={torch_version}")
    session.install(*TEST_DEPS, *extra)
    editable: list[str] = []
    for pkg in packages():
        editable += ["-e", str(pkg)]
    session.install(*editable)
    return rest


def install_torchrec(session: nox.Session) -> None:
    # --no-deps: torchrec's own requirements would replace the pinned CPU torch.
    session.install(*TORCHREC_DEPS)
    session.install("--no-deps", "torchrec==1.8.0")


def run_pytest(session: nox.Session, *args: str) -> None:
    # pytest exits 5 when it collected nothing; a package with no tests yet must not pass
    # silently, so that stays a failure.
    session.run("python", "-m", "pytest", *args)


@nox.session
def tests(session: nox.Session) -> None:
    """Unit and property tests of every package."""
    rest = install_stack(session)
    test_dirs = [str(p / "tests") for p in packages() if (p / "tests").is_dir()]
    if (ROOT / "conformance" / "meta").is_dir():
        test_dirs.append("conformance/meta")
    # Tests marked slow (an 8-rank world, say) run in `nox -s slow`; a `-m` of your own wins.
    select = [] if "-m" in rest else ["-m", "not slow"]
    run_pytest(session, *test_dirs, *select, *rest)


@nox.session
def slow(session: nox.Session) -> None:
    """The tests marked slow: larger worlds and longer hunts than the default suite."""
    rest = install_stack(session)
    test_dirs = [str(p / "tests") for p in packages() if (p / "tests").is_dir()]
    run_pytest(session, *test_dirs, "conformance/meta", "-m", "slow", *rest)
    session.env["SHARDSPEC_IMPL"] = "shardspec"
    run_pytest(session, "conformance/tests", "-m", "slow", *rest)


@nox.session
def conformance(session: nox.Session) -> None:
    """The conformance suite against shardspec, on gloo ranks (world sizes 1-4)."""
    rest = install_stack(session)
    session.env["SHARDSPEC_IMPL"] = "shardspec"
    # The faults area's 2 GiB state dict is marked slow (`nox -s slow` runs it).
    select = [] if "-m" in rest else ["-m", "not slow"]
    run_pytest(session, "conformance/tests", *select, *rest)


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


@nox.session
def coverage(session: nox.Session) -> None:
    """Branch coverage of packages/*/src by `nox -s conformance` alone (the same tests and
    examples; pool ranks and simulated ranks measured too), per module; fails under the floor
    in pyproject.toml's [tool.coverage.report] and prints conformance/coverage-allow.txt, the
    public functions' branches left uncovered on purpose, one reason each."""
    rest = install_stack(session, "coverage[toml]>=7.10")
    session.env["SHARDSPEC_IMPL"] = "shardspec"
    # measured ranks run slower: a pool timeout would fail a test and hide what it reaches
    session.env["SHARDSPEC_POOL_TIMEOUT"] = os.environ.get("SHARDSPEC_POOL_TIMEOUT", "60")
    shutil.rmtree(ROOT / ".coverage-conformance", ignore_errors=True)
    select = [] if "-m" in rest else ["-m", "not slow"]
    # pool ranks end with os._exit, after saving their data (shardspec.testing.worker)
    session.run("coverage", "run", "-m", "pytest", "conformance/tests", *select, *rest)
    session.run("coverage", "combine", "-q")
    session.log(
        "Uncovered on purpose (conformance/coverage-allow.txt):\n"
        + (ROOT / "conformance" / "coverage-allow.txt").read_text()
    )
    session.run("coverage", "report")


@nox.session
def conformance_launched(session: nox.Session) -> None:
    """The conformance suite under torchrun: launcher rank 0 runs pytest, ranks 1-4 are the
    pools (gloo on loopback; 5 processes, so world sizes 1-4 as in `conformance`)."""
    rest = install_stack(session)
    session.env["SHARDSPEC_IMPL"] = "shardspec"
    # Launcher ranks cannot be restarted after a timeout, so a slow machine must not cause one.
    session.env["SHARDSPEC_POOL_TIMEOUT"] = os.environ.get("SHARDSPEC_POOL_TIMEOUT", "60")
    nproc = os.environ.get("SHARDSPEC_LAUNCH_NPROC", "5")
    # As in `conformance`: the tests marked slow run in `nox -s slow`; a `-m` of your own wins.
    select = [] if "-m" in rest else ["-m", "not slow"]
    session.run(
        "torchrun",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "shardspec.testing.launched",
        "conformance/tests",
        "-p",
        "no:cacheprovider",
        *select,
        *rest,
    )


@nox.session
def conformance_scale(session: nox.Session) -> None:
    """The reshard, dtensor, fsdp (HSDP x TP, 3-D and 4-D meshes) and validation areas on
    simulated worlds of 8 to 1024 ranks (threads on torch's threaded process group), DCP round
    trips between worlds of up to 64 of them, and
    DTensor's moves and chunk lists as one program for every rank (LocalTensorMode), against
    shardspec and against torch."""
    rest = install_stack(session)
    session.env["SHARDSPEC_SIM_WORLDS"] = os.environ.get("SHARDSPEC_SIM_WORLDS", SCALE_WORLDS)
    session.env["SHARDSPEC_LOCAL_WORLDS"] = os.environ.get("SHARDSPEC_LOCAL_WORLDS", SCALE_WORLDS)
    session.env["HYPOTHESIS_PROFILE"] = "short"
    # An example at 1024 ranks costs seconds: SCALE_EXAMPLES per property keeps both
    # implementations' runs under 15 minutes on 2 cores (set SHARDSPEC_EXAMPLES for more).
    session.env["SHARDSPEC_EXAMPLES"] = os.environ.get("SHARDSPEC_EXAMPLES", SCALE_EXAMPLES)
    for impl in os.environ.get("SHARDSPEC_SCALE_IMPLS", "shardspec,torch").split(","):
        session.env["SHARDSPEC_IMPL"] = impl
        run_pytest(session, *SCALE_AREAS, "-p", "no:cacheprovider", *rest)


@nox.session
def conformance_upstream(session: nox.Session) -> None:
    """The conformance suite against upstream torch; writes conformance-report.{md,json}."""
    rest = install_stack(session)
    install_torchrec(session)  # so the report covers TorchRec's plan helpers too
    session.env["SHARDSPEC_IMPL"] = "torch"
    session.run("python", "-m", "conformance.report", "--out", "conformance-report", *rest)


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
    session.run("python3", "-m", "conformance.report_matrix", "--out", out, *folders)


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
    # The phases live in conformance/gpu.py so that a GPU machine with no package index runs
    # the same thing with its own CUDA torch: `python -m conformance.gpu`.
    select = [] if "-m" in rest else ["-m", "not slow"]
    session.run("python", "-m", "conformance.gpu", *select, *rest)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting."""
    session.install("ruff==0.17.6")  # pinned: new ruff releases add rules
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on every package's src/."""
    install_stack(session, "mypy==2.4.1", "numpy")
    srcs = [str(p / "src") for p in packages()]
    session.run("mypy", *srcs)


@nox.session
def spec(session: nox.Session) -> None:
    """Traceability: every rule in spec/ has a test, every test cites an existing rule."""
    args = ["--check"] if os.environ.get("CI") else []
    session.run("python", "spec/trace.py", *args, *session.posargs, external=True)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks, reported as ratios against baselines measured in the same run."""
    rest = install_stack(session)
    scripts = sorted(str(p) for pkg in packages() for p in (pkg / "benchmarks").glob("bench_*.py"))
    scripts += sorted(str(p) for p in (ROOT / "conformance").glob("bench_*.py"))
    for script in scripts:
        session.run("python", script, *rest)


@nox.session
def torchrec(session: nox.Session) -> None:
    """TorchRec 1.8 on CPU: the shardspec.torchrec tests and conformance area with it."""
    rest = install_stack(session)
    install_torchrec(session)
    run_pytest(session, "packages/torchrec/tests", "conformance/tests", "-k", "torchrec", *rest)


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


# The README's examples, each run by `wheels` for every distribution that installs its module.
EXAMPLES = (
    ("shardspec.reshard", "reshard_dtensor.py"),
    ("shardspec.fsdp", "resume_on_another_mesh.py"),
)


@nox.session(requires=["build"])
def wheels(session: nox.Session) -> None:
    """What a user does, for every distribution: `pip install --find-links dist <dist>` beside
    a preinstalled torch, then import it and its siblings from site-packages and run the README
    example from there (4 gloo ranks under torchrun)."""
    torch_version, _ = split_args(session)
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
        with session.chdir(work):
            session.run("python", str(probe), str(ROOT), torch_version, *modules)
            if "shardspec.metadata" in modules:  # its console script is on PATH and starts
                session.run("shardspec", "--help", silent=True)
            for module, example in EXAMPLES:
                if module in modules:
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
