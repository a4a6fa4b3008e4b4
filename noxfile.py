"""The project's front door: `nox -s <session>`.

CPU sessions pin torch==2.13.0 (the CPU build); pass `--torch=VERSION` after `--` to test
another, e.g. `nox -s tests -- --torch=2.12.0`. Every other argument after `--` goes to pytest
(or to the benchmark script, for `bench`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import nox

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


@nox.session
def conformance(session: nox.Session) -> None:
    """The conformance suite against shardspec, on gloo ranks (world sizes 1-4)."""
    rest = install_stack(session)
    session.env["SHARDSPEC_IMPL"] = "shardspec"
    run_pytest(session, "conformance/tests", *rest)


# World sizes `conformance_scale` simulates, and the areas it runs there (dtensor: meshes of
# exactly W devices up to 4-D; reshard: layouts over W ranks, more ranks than rows).
SCALE_WORLDS = "8,64,512,1024"
SCALE_AREAS = ("conformance/tests/test_reshard.py", "conformance/tests/test_dtensor.py")


@nox.session
def conformance_launched(session: nox.Session) -> None:
    """The conformance suite under torchrun: launcher rank 0 runs pytest, ranks 1-4 are the
    pools (gloo on loopback; 5 processes, so world sizes 1-4 as in `conformance`)."""
    rest = install_stack(session)
    session.env["SHARDSPEC_IMPL"] = "shardspec"
    # Launcher ranks cannot be restarted after a timeout, so a slow machine must not cause one.
    session.env["SHARDSPEC_POOL_TIMEOUT"] = os.environ.get("SHARDSPEC_POOL_TIMEOUT", "60")
    nproc = os.environ.get("SHARDSPEC_LAUNCH_NPROC", "5")
    session.run(
        "torchrun",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "shardspec.testing.launched",
        "conformance/tests",
        "-p",
        "no:cacheprovider",
        *rest,
    )


@nox.session
def conformance_scale(session: nox.Session) -> None:
    """The reshard and dtensor areas on simulated worlds of 8 to 1024 ranks (threads on
    torch's threaded process group), against shardspec and against torch."""
    rest = install_stack(session)
    session.env["SHARDSPEC_SIM_WORLDS"] = os.environ.get("SHARDSPEC_SIM_WORLDS", SCALE_WORLDS)
    session.env["HYPOTHESIS_PROFILE"] = "short"
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
    count = cuda_device_count()
    if count < 1:
        session.skip("conformance_gpu needs a CUDA GPU; nvidia-smi sees none")
    session.install("torch")  # the CUDA build: no CPU pin on a GPU node
    session.install(*TEST_DEPS)
    for pkg in packages():
        session.install("-e", str(pkg))
    session.env["SHARDSPEC_IMPL"] = "shardspec"
    session.env["SHARDSPEC_BACKEND"] = "nccl"  # one GPU per rank: world sizes 1..count
    run_pytest(session, "conformance/tests", *rest)
    if count == 1:
        session.env["SHARDSPEC_BACKEND"] = "gloo"
        session.env["SHARDSPEC_DEVICE"] = "cuda"  # the pool's ranks share the one GPU
        run_pytest(session, "conformance/tests", *rest)


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
