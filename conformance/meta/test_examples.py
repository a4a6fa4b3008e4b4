"""The README's example runs as written, on 4 gloo ranks under torchrun."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script", sorted((ROOT / "examples").glob("*.py")), ids=lambda p: p.name)
def test_example_runs_on_four_ranks(script: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    done = subprocess.run(
        [*cmd, str(script)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, (
        f"{script.name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    assert "Layout shape=" in done.stdout
