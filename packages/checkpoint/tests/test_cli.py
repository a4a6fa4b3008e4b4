"""The ``shardspec`` command itself: ``shardspec layout FILE`` (CKPT-11) and the command
without torch installed (CKPT-12). The checkpoint subcommands are tested in test_inspect and
test_checkpoint_data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardspec.checkpoint.cli import main
from shardspec.metadata import Box, Layout, Shard, chunk_layout, layout_to_json

# A fresh interpreter in which `import torch` fails as if torch were not installed.
NO_TORCH = (
    "import sys; sys.modules['torch'] = None; "
    "from shardspec.checkpoint.cli import main; sys.exit(main(sys.argv[1:]))"
)


def no_torch(*argv: str) -> subprocess.CompletedProcess[str]:
    # No time limit of our own: pytest-timeout (the runner's) catches a hang.
    return subprocess.run(
        [sys.executable, "-c", NO_TORCH, *argv], capture_output=True, text=True, check=False
    )


@pytest.mark.rule("CKPT-11")
def test_layout_command_draws_a_valid_layout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "l.json"
    f.write_text(layout_to_json(chunk_layout((4, 6), 0, [0, 1])))
    assert main(["layout", str(f)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "valid"
    assert "r0" in out and "r1" in out  # the picture


@pytest.mark.rule("CKPT-11")
def test_layout_command_names_what_is_invalid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gap = Layout((4, 6), [Shard(Box((0, 0), (2, 6)), 0)])  # rows 2:4 held by no rank
    f = tmp_path / "l.json"
    f.write_text(layout_to_json(gap))
    assert main(["layout", str(f)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("INVALID:") and "(2, 0)" in out.splitlines()[-1]


@pytest.mark.rule("CKPT-11")
def test_layout_command_refuses_a_malformed_file_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = json.loads(layout_to_json(chunk_layout((4,), 0, [0, 1])))
    d["shards"][1]["ofsets"] = d["shards"][1].pop("offsets")
    f = tmp_path / "l.json"
    f.write_text(json.dumps(d))
    assert main(["layout", str(f)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "$.shards[1]" in captured.err and "unknown key 'ofsets'" in captured.err
    f.write_text("{not json")
    assert main(["layout", str(f)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


@pytest.mark.rule("CKPT-12")
def test_without_torch_checkpoint_commands_say_what_to_install(tmp_path: Path) -> None:
    for argv in (["inspect", str(tmp_path)], ["verify", str(tmp_path)], ["diff", "a", "b"]):
        (tmp_path / ".metadata").write_bytes(b"")
        proc = no_torch(*argv)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr  # one line, no traceback
        assert "Traceback" not in proc.stderr
        assert "PyTorch" in lines[0] and "pip install" in lines[0] and "torch" in lines[0]


@pytest.mark.rule("CKPT-12")
def test_without_torch_the_layout_command_works(tmp_path: Path) -> None:
    f = tmp_path / "l.json"
    f.write_text(layout_to_json(chunk_layout((4, 6), 1, [0, 1, 2])))
    proc = no_torch("layout", str(f))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "valid"
    assert no_torch("--help").returncode == 0
