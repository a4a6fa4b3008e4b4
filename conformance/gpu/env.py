"""The environment of a GPU run (``python -m conformance.gpu``, tests or ``--bench``).

A lent GPU machine has a CUDA torch but often no ``shardspec`` installed: there the packages
are taken from this checkout's ``packages/*/src``, in this process and in the ranks it starts.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

__all__ = ["ROOT", "gpu_env"]

ROOT = Path(__file__).resolve().parents[2]


def _installed(module: str) -> bool:
    # find_spec raises, rather than answering None, when the parent package is missing too.
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def gpu_env() -> dict[str, str]:
    """This process's environment for the suite's subprocesses: our implementation under test,
    and ``PYTHONPATH`` naming the checkout's packages where ``shardspec`` is not installed."""
    env = dict(os.environ, SHARDSPEC_IMPL="shardspec")
    if not _installed("shardspec.reshard"):
        srcs = [str(p) for p in sorted((ROOT / "packages").glob("*/src"))]
        env["PYTHONPATH"] = os.pathsep.join([*srcs, str(ROOT), env.get("PYTHONPATH", "")])
    return env
