"""DCP's save-plan check calls a zero-size chunk inside another chunk an overlap."""

import json
import sys

import torch
from torch.distributed.checkpoint.default_planner import _validate_global_plan
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)

DEFECT = {
    "id": "dcp-save-check-empty-chunk-overlap",
    "title": "DCP's _validate_global_plan refuses a save whose empty chunk lies inside another",
    "area": "checkpoint",
    "rule": "CKPT-1",
    "upstream": None,
    "issue_text": (
        "## DCP: the save-plan check calls a zero-size chunk inside another chunk an overlap\n\n"
        "```python\n"
        "import torch\n"
        "from torch.distributed.checkpoint.default_planner import _validate_global_plan\n"
        "from torch.distributed.checkpoint.metadata import (\n"
        "    ChunkStorageMetadata, Metadata, TensorProperties, TensorStorageMetadata)\n\n"
        "chunks = [ChunkStorageMetadata(torch.Size([0]), torch.Size([2])),  # rows [0, 2)\n"
        "          ChunkStorageMetadata(torch.Size([1]), torch.Size([0]))]  # empty, at 1\n"
        "md = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([2]), "
        "chunks)\n"
        "print(_validate_global_plan([], Metadata({'t': md})))\n"
        "```\n\n"
        "**Expected**: `[]`. A chunk with a zero size holds no element, so it overlaps "
        "nothing, wherever its offset lies (empty shards are routine with more ranks than "
        "rows, and torch's own sharding specs place them at many offsets).\n\n"
        "**Actual**: `['key:t has overlapping chunks: ...']`, so "
        "`DefaultSavePlanner.create_global_plan` raises `ValueError: Failed to validate "
        "global plan` and the save of a valid state dict fails. `_check_box_overlap` compares "
        "offsets against `offset + size` without asking whether either box is empty: for the "
        "empty box, `1 >= 0 + 2` and `0 >= 1 + 0` are both false, so it reports an overlap.\n\n"
        "Versions: torch 2.13.0 (CPU), Python 3.11."
    ),
    "nproc": 1,
    "torch_does": "rows [0, 2) and an empty chunk at row 1 of a 2-row tensor: "
    "_validate_global_plan reports 'overlapping chunks', so DefaultSavePlanner refuses the save",
    "spec_says": "an empty chunk holds nothing and overlaps nothing; the chunks are valid",
    "tests": ["test_checkpoint.py::test_saved_chunks_are_accepted_exactly_when_valid"],
}

# A 2-row tensor saved as rows [0, 2) and an empty chunk whose offset lies inside them.
chunks = [
    ChunkStorageMetadata(offsets=torch.Size([0]), sizes=torch.Size([2])),
    ChunkStorageMetadata(offsets=torch.Size([1]), sizes=torch.Size([0])),
]
for i, c in enumerate(chunks):
    box = [[list(c.offsets), list(c.sizes)]]
    print("BOXES", json.dumps({"rank": i, "shape": [2], "spec": box, "torch": box}))
md = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([2]), chunks)
errors = _validate_global_plan([], Metadata({"t": md}))
if errors:
    print(
        f"DIVERGES rank 0: torch refuses the save: {errors[0]}; the spec says an empty "
        "chunk overlaps nothing"
    )
    sys.exit(1)
