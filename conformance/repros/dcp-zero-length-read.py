"""DCP's load planning emits a zero-length read for an empty saved chunk inside a local one."""

import sys

import torch
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

DEFECT = {
    "id": "dcp-zero-length-read",
    "title": "create_read_items_for_chunk_list reads an empty saved chunk (a zero-length read)",
    "area": "checkpoint",
    "rule": "CKPT-3",
    "upstream": None,
    "issue_text": (
        "## DCP: load planning emits a zero-length ReadItem for an empty saved chunk\n\n"
        "```python\n"
        "import torch\n"
        "from torch.distributed.checkpoint.metadata import (\n"
        "    ChunkStorageMetadata, TensorProperties, TensorStorageMetadata)\n"
        "from torch.distributed.checkpoint.planner_helpers import "
        "create_read_items_for_chunk_list\n\n"
        "saved = [ChunkStorageMetadata(torch.Size([0]), torch.Size([2])),  # rows [0, 2)\n"
        "         ChunkStorageMetadata(torch.Size([1]), torch.Size([0]))]  # empty, at 1\n"
        "md = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([2]), "
        "saved)\n"
        "local = [ChunkStorageMetadata(torch.Size([0]), torch.Size([2]))]\n"
        "for it in create_read_items_for_chunk_list('t', md, local):\n"
        "    print(it.storage_index, it.lengths)\n"
        "```\n\n"
        "**Expected**: one read, of saved chunk 0 with lengths `[2]`. An empty chunk holds "
        "nothing to read.\n\n"
        "**Actual**: two reads; the first is of the empty chunk with lengths `[0]`. The "
        "overlap test of the sweep counts a zero-size box whose offset lies inside the local "
        "chunk. Each such `ReadItem` costs the storage reader a request for nothing "
        "(`FileSystemReader` opens the file and `torch.load`s the empty chunk), and a reader "
        "that rejects empty ranges fails the load.\n\n"
        "Versions: torch 2.13.0 (CPU), Python 3.11."
    ),
    "nproc": 1,
    "torch_does": "for a local chunk of rows [0, 2) and saved chunks [0, 2) and an empty one "
    "at row 1, it plans a read of the empty chunk with lengths [0] besides the real read",
    "spec_says": "a load reads exactly the non-empty overlaps: one read of saved chunk 0",
    "tests": ["test_checkpoint.py::test_a_load_reads_exactly_the_overlaps"],
}

saved = [
    ChunkStorageMetadata(offsets=torch.Size([0]), sizes=torch.Size([2])),
    ChunkStorageMetadata(offsets=torch.Size([1]), sizes=torch.Size([0])),
]
md = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([2]), saved)
local = [ChunkStorageMetadata(offsets=torch.Size([0]), sizes=torch.Size([2]))]
items = create_read_items_for_chunk_list("t", md, local)
empty = [it for it in items if 0 in it.lengths]
if empty:
    it = empty[0]
    print(
        f"DIVERGES rank 0: torch plans {len(items)} reads, one of the empty saved chunk at "
        f"offset {list(it.storage_index.offset)} with lengths {list(it.lengths)}; the spec "
        "says one read, of saved chunk 0 with lengths [2]"
    )
    sys.exit(1)
