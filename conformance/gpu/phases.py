"""The GPU half of the conformance suite, with whatever torch this interpreter has.

``nox -s conformance_gpu`` installs a CUDA torch and the packages, then runs this. On a GPU
machine without a package index (a cluster node behind a firewall, a lent machine), run it
directly with the interpreter that already has a CUDA torch, pytest and Hypothesis::

    python -m conformance.gpu [pytest arguments]

Where ``shardspec`` is not installed the packages are taken from this checkout's
``packages/*/src``. Phases: NCCL with one GPU per rank (world sizes 1..GPUs); on a single GPU,
then gloo ranks (1-4) sharing it with CUDA tensors, which exercises the executor's device
paths (pack, unpack, ``out=``, agreement check) on CUDA. Exits with the first failing phase's
status; exits 1 with the reason when this interpreter's torch sees no GPU.

``python -m conformance.gpu --bench [options]`` measures instead of testing: the executor on
CUDA tensors against the device's copy bandwidth and DTensor (:mod:`conformance.gpu.bench`).
"""

from __future__ import annotations

import subprocess
import sys

from conformance.gpu.env import ROOT, gpu_env


def phases(gpus: int) -> list[dict[str, str]]:
    """The backend settings of each run of the suite, for a machine with ``gpus`` GPUs."""
    runs = [{"SHARDSPEC_BACKEND": "nccl"}]
    if gpus == 1:
        runs.append({"SHARDSPEC_BACKEND": "gloo", "SHARDSPEC_DEVICE": "cuda"})
    return runs


def main(argv: list[str]) -> int:
    if argv[:1] == ["--bench"]:
        from conformance.gpu.bench import main as bench

        return bench(argv[1:])
    import torch

    gpus = torch.cuda.device_count()
    if gpus < 1:
        print(
            f"conformance.gpu: torch {torch.__version__} sees no CUDA GPU "
            f"(CUDA build: {torch.version.cuda or 'no'}); nothing was run",
            file=sys.stderr,
        )
        return 1
    name = torch.cuda.get_device_name(0)
    print(f"conformance.gpu: torch {torch.__version__}, {gpus} GPU(s): {name}")
    for extra in phases(gpus):
        env = {**gpu_env(), **extra}
        print(f"conformance.gpu: {' '.join(f'{k}={v}' for k, v in extra.items())}", flush=True)
        cmd = [sys.executable, "-m", "pytest", "conformance/tests", "-p", "no:cacheprovider"]
        rc = subprocess.run([*cmd, *argv], cwd=ROOT, env=env, check=False).returncode
        if rc != 0:
            return rc
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
