"""Launched mode end to end: torchrun with 3 ranks, launcher rank 0 runs pytest on
launched_probe.py and ranks 1-2 serve as its pools of 1 and 2 ranks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shardspec.testing import scaled

HERE = Path(__file__).resolve().parent


@pytest.mark.rule("CONF-11")
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_the_driver_runs_pytest_and_the_other_launcher_ranks_are_its_pools() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    env.pop("SHARDSPEC_LAUNCHED", None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "3",
        "-m",
        "shardspec.testing.launched",
        str(HERE / "launched_probe.py"),
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    out = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=scaled(600), check=False
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "1 passed" in out.stdout, out.stdout[-4000:]
