"""FSDP's _create_chunk_sharded_tensor leaves a rank past the data out of the metadata."""

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.fsdp  # first: FSDP's modules have an import cycle
from torch.distributed.fsdp._shard_utils import _create_chunk_sharded_tensor

DEFECT = {
    "id": "fsdp-chunk-sharded-tensor-drops-empty-chunk",
    "title": "FSDP _create_chunk_sharded_tensor lists no box for a rank past the data",
    "area": "fsdp",
    "rule": "CHUNK-3",
    "upstream": None,
    "issue_text": (
        "## FSDP `_create_chunk_sharded_tensor` leaves ranks past the data out of the "
        "ShardedTensor's metadata\n"
        "\n"
        "Run with `torchrun --nproc-per-node 3`:\n"
        "\n"
        "```python\n"
        "import torch, torch.distributed as dist\n"
        "import torch.distributed.fsdp\n"
        "from torch.distributed.fsdp._shard_utils import _create_chunk_sharded_tensor\n"
        "\n"
        'dist.init_process_group("gloo")\n'
        "rank = dist.get_rank()\n"
        "st = _create_chunk_sharded_tensor(torch.arange(6).reshape(2, 3), rank, 3, 1, "
        "dist.group.WORLD)\n"
        "print(rank, [(m.shard_offsets, m.shard_sizes, str(m.placement)) for m in "
        "st.metadata().shards_metadata])\n"
        "# every rank: [([0, 0], [1, 3], 'rank:0/cpu'), ([1, 0], [1, 3], 'rank:1/cpu')]  -- "
        "nothing for rank 2\n"
        "```\n"
        "\n"
        "**Expected**: one shard per rank of the group, rank 2 holding the empty chunk `[2, "
        "0]` + `[0, 3]` (the offset at the dim size, as DTensor's "
        "`compute_local_shape_and_global_offset` places empty shards since #150862), and "
        "rank 2 holding that empty local shard.\n"
        "\n"
        "**Actual**: `tensor.chunk(world_size)` returns 2 chunks, and the metadata and local "
        "shards are built from those only: with more ranks than rows (small parameters, "
        "large FSDP worlds) the ranks past the data have no box and no local shard, so the "
        "layout is not a chunk layout over the group, every consumer that expects one box "
        "per rank (resharding, DCP flattening, which then drops the entry on that rank) has "
        "to special-case it, and `ChunkShardingSpec`'s own metadata for the same tensor "
        "disagrees.\n"
        "\n"
        "Versions: torch 2.13.0 (CPU, gloo)"
    ),
    "nproc": 3,
    "torch_does": "2 rows on 3 ranks: the ShardedTensor's metadata lists 2 shards (ranks 0, 1); "
    "rank 2 has no box and no local shard",
    "spec_says": "a chunk layout gives every rank exactly one box: rank 2 holds the empty box "
    "at offset 2 (FSDP-6 lists every chunk, empty ones at offset n)",
    "tests": ["test_chunk.py::test_fsdp_chunk_sharded_tensor_lists_every_chunk"],
}

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
full = torch.arange(6).reshape(2, 3)  # row i holds 3i, 3i+1, 3i+2
st = _create_chunk_sharded_tensor(full, rank, world, 1, dist.group.WORLD)
mine = [md for md in st.metadata().shards_metadata if md.placement.rank() == rank]
start = min(rank, 2)  # the chunk rule: 1 row per rank, the empty chunk at offset 2
spec = [[[start, 0], [min(rank + 1, 2) - start, 3]]]
torch_boxes = [[md.shard_offsets, md.shard_sizes] for md in mine]
print("BOXES", json.dumps({"rank": rank, "shape": [2, 3], "spec": spec, "torch": torch_boxes}))
bad = torch_boxes != spec
if bad:
    local = [s.tensor.tolist() for s in st.local_shards()]
    print(
        f"DIVERGES rank {rank}: the ShardedTensor's metadata gives rank {rank} the boxes "
        f"{torch_boxes} (local shards {local}) of {len(st.metadata().shards_metadata)} listed; "
        f"the spec says one box {spec[0]}"
    )
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if bad else 0)
