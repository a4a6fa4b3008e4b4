"""LocalShardsWrapper zips shards with offsets: a short offsets list silently drops shards."""

import json
import sys

import torch
from torch.distributed.tensor._shards_wrapper import LocalShardsWrapper

DEFECT = {
    "id": "torchrec-wrapper-short-offsets",
    "title": "LocalShardsWrapper accepts fewer offsets than shards and drops the rest from its "
    "chunks",
    "area": "torchrec",
    "rule": "TORCHREC-12",
    "upstream": None,
    "issue_text": (
        "## `LocalShardsWrapper` silently drops shards that have no offset\n"
        "\n"
        "```python\n"
        "import torch\n"
        "from torch.distributed.tensor._shards_wrapper import LocalShardsWrapper\n"
        "\n"
        "table = torch.arange(20).reshape(5, 4)\n"
        "w = LocalShardsWrapper([table[0:2], table[2:5]], [(0, 0)])  # one offset for two "
        "shards\n"
        "print(len(w.local_shards()), len(w.local_chunks))  # 2 1\n"
        "```\n"
        "\n"
        "**Expected**: a `ValueError` saying that 2 shards were given 1 offset (and, more "
        "generally, that each offset has the shard's ndim and that the shards do not "
        "overlap).\n"
        "\n"
        "**Actual**: the wrapper is built; `local_chunks` zips shards with offsets, so the "
        "second shard is missing from the chunks DCP saves: rows 2-4 are silently never "
        "written to the checkpoint.\n"
        "\n"
        "Versions: torch 2.13.0 (CPU)"
    ),
    "nproc": 1,
    "torch_does": "two shards with one offset: the wrapper is built, holds both shards, and "
    "lists one chunk, so DCP never saves the second shard",
    "spec_says": "one offset per shard: a wrapper whose shards and offsets disagree is refused, "
    "naming the shard",
    "tests": ["test_torchrec.py::test_wrapper_refuses_a_short_offsets_list"],
}

table = torch.arange(20).reshape(5, 4)  # element (i, j) holds 4 * i + j
shards = [table[0:2], table[2:5]]
try:
    w = LocalShardsWrapper(shards, [(0, 0)])  # the offset (2, 0) of the second shard is missing
except (ValueError, AssertionError) as e:
    print(f"refused: {e}")
    sys.exit(0)
chunks = [[list(c.offsets), list(c.sizes)] for c in w.local_chunks]
spec = [[[0, 0], [2, 4]], [[2, 0], [3, 4]]]
print("BOXES", json.dumps({"rank": 0, "shape": [5, 4], "spec": spec, "torch": chunks}))
print(
    f"DIVERGES rank 0: LocalShardsWrapper took {len(w.local_shards())} shards with 1 offset "
    f"and lists {len(chunks)} chunk(s) {chunks}: rows {shards[1].tolist()} are never saved; "
    "the spec says a wrapper with fewer offsets than shards is refused"
)
sys.exit(1)
