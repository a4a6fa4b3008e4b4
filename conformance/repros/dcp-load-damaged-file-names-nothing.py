"""DCP's load of a checkpoint whose data file was cut short fails without naming the file, the
tensor or the chunk: every rank reports an internal zip error."""

import os
import sys
import tempfile
import warnings

import torch
import torch.distributed.checkpoint as dcp

DEFECT = {
    "id": "dcp-load-damaged-file-names-nothing",
    "title": "dcp.load of a truncated data file fails with a zip error that names no file",
    "area": "checkpoint",
    "rule": "CKPT-26",
    "upstream": None,
    "issue_text": (
        "## DCP: a truncated checkpoint file fails the load without naming the file\n\n"
        "```python\n"
        "import os, tempfile, torch, torch.distributed.checkpoint as dcp\n"
        "path = tempfile.mkdtemp()\n"
        "dcp.save({'t': torch.arange(64.0)}, checkpoint_id=path, no_dist=True)\n"
        "f = os.path.join(path, '__0_0.distcp')\n"
        "os.truncate(f, os.path.getsize(f) // 2)\n"
        "dcp.load({'t': torch.zeros(64)}, checkpoint_id=path, no_dist=True)\n"
        "```\n\n"
        "**Expected**: an error that names `__0_0.distcp`, the tensor `t` and its chunk, and "
        "says the file is shorter than the metadata says (every byte range is in the "
        "metadata, so the reader can tell before it reads).\n\n"
        "**Actual**: `RuntimeError: PytorchStreamReader failed reading zip archive: failed "
        "finding central directory` (wrapped in `CheckpointException` on every rank when a "
        "process group runs): nothing says which of a job's thousands of files is damaged.\n\n"
        "Versions: torch 2.13.0 (CPU), Python 3.11."
    ),
    "nproc": 1,
    "torch_does": "fails with 'PytorchStreamReader failed reading zip archive' and names no "
    "file, tensor or chunk",
    "spec_says": "every rank raises the same error naming the file, the tensor and the chunk",
    "tests": [
        "test_checkpoint_collective_load.py::"
        "test_a_collective_load_gives_every_rank_the_reference_or_fails_on_all",
        "test_checkpoint_collective_load.py::"
        "test_a_collective_load_among_a_subgroup_of_the_ranks_uses_its_group_ranks",
    ],
}

warnings.simplefilter("ignore")
path = tempfile.mkdtemp()
dcp.save({"t": torch.arange(64.0)}, checkpoint_id=path, no_dist=True)
name = "__0_0.distcp"
f = os.path.join(path, name)
os.truncate(f, os.path.getsize(f) // 2)
try:
    dcp.load({"t": torch.zeros(64)}, checkpoint_id=path, no_dist=True)
    message = "no error"
except BaseException as e:  # DCP's CheckpointException is a BaseException
    message = f"{type(e).__name__}: {e}"
if name not in message:
    first = message.strip().splitlines()[-1][:160] if message.strip() else message
    print(
        f"DIVERGES rank 0: torch's load of a checkpoint whose {name} was cut in half says "
        f"{first!r}, naming no file; the spec says the error names {name}, tensor 't' and "
        "its chunk"
    )
    sys.exit(1)
