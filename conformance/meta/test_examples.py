"""The README's examples run as written, on 4 gloo ranks under torchrun."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shardspec.testing import scaled

ROOT = Path(__file__).resolve().parents[2]
# CI deselects these (`-m "not slow and not examples"`): `nox -s wheels` runs every example
# there, from the installed wheels, which also shows that the wheels hold what they need.
pytestmark = pytest.mark.examples
# What each example prints once it has checked its own result; a new example says it here.
SUCCESS_LINE = {
    "reshard_dtensor.py": "Layout shape=",
    "resume_on_another_mesh.py": "parameters after the second step match the single-process run",
    "refit_train_to_serve.py": "serving tensors equal the reference bit for bit",
}


@pytest.mark.parametrize("script", sorted((ROOT / "examples").glob("*.py")), ids=lambda p: p.name)
def test_example_runs_on_four_ranks(script: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    done = subprocess.run(
        [*cmd, str(script)], capture_output=True, text=True, timeout=scaled(300), check=False
    )
    assert done.returncode == 0, (
        f"{script.name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    assert script.name in SUCCESS_LINE, f"{script.name}: add the line it prints to SUCCESS_LINE"
    assert SUCCESS_LINE[script.name] in done.stdout, done.stdout[-3000:]
