"""LocalShardsWrapper sums 2-D shard shapes along dim 1 even when the shards are stacked by row."""

import json
import sys

import torch
from torch.distributed.tensor._shards_wrapper import LocalShardsWrapper

DEFECT = {
    "id": "torchrec-wrapper-row-stack-shape",
    "title": "LocalShardsWrapper's shape sums 2-D shards along dim 1 even for a row-wise stack",
    "area": "torchrec",
    "rule": "TORCHREC-11",
    "upstream": None,
    "issue_text": (
        "## `LocalShardsWrapper.shape` is wrong for row-wise shards\n"
        "\n"
        "```python\n"
        "import torch\n"
        "from torch.distributed.tensor._shards_wrapper import LocalShardsWrapper\n"
        "\n"
        "table = torch.arange(20).reshape(5, 4)\n"
        "w = LocalShardsWrapper([table[0:2], table[2:5]], [(0, 0), (2, 0)])\n"
        "print(w.shape)  # torch.Size([2, 8])\n"
        "```\n"
        "\n"
        "**Expected**: `torch.Size([5, 4])`, what `torch.cat` of the shards along the dim in "
        "which their offsets differ (dim 0) gives. Row-wise stacks are what TorchRec's "
        "table_row_wise / grid shards can leave on one rank.\n"
        "\n"
        "**Actual**: `torch.Size([2, 8])`: the constructor always sums 2-D shard sizes along "
        "dim 1 (and 1-D ones along dim 0), whatever the offsets say, so `empty_like` / "
        "`new_empty` and anything reading `.shape` see a tensor that is not the local "
        "storage.\n"
        "\n"
        "Versions: torch 2.13.0 (CPU)"
    ),
    "nproc": 1,
    "torch_does": "rows [0, 2) and [2, 5) of a 4-column table (shards (2, 4) and (3, 4) at "
    "offsets (0, 0) and (2, 0)) give a wrapper of shape (2, 8)",
    "spec_says": "the shape is the shards laid end to end along the dim they are stacked in: "
    "(5, 4), what torch.cat of the shards along dim 0 gives",
    "tests": ["test_torchrec.py::test_wrapper_of_row_blocks"],
}

table = torch.arange(20).reshape(5, 4)  # element (i, j) holds 4 * i + j
shards, offsets = [table[0:2], table[2:5]], [(0, 0), (2, 0)]
w = LocalShardsWrapper(shards, offsets)
want = tuple(torch.cat(shards).shape)
boxes = [[list(o), list(s.shape)] for o, s in zip(offsets, shards)]
print("BOXES", json.dumps({"rank": 0, "shape": [5, 4], "spec": boxes, "torch": boxes}))
print(f"wrapper shape {tuple(w.shape)}; torch.cat of its shards along dim 0: {want}")
if tuple(w.shape) != want:
    print(
        f"DIVERGES rank 0: LocalShardsWrapper of row blocks {shards[0].tolist()} and "
        f"{shards[1].tolist()} has shape {tuple(w.shape)}; the spec says {want}"
    )
    sys.exit(1)
