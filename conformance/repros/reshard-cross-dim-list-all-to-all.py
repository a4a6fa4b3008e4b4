"""ShardedTensor.reshard from dim 0 to dim 1 fails on gloo for uneven splits (list all_to_all)."""

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
from torch.distributed._shard.sharded_tensor.metadata import TensorProperties
from torch.distributed._shard.sharding_spec import ChunkShardingSpec

DEFECT = {
    "id": "reshard-cross-dim-list-all-to-all",
    "title": "ShardedTensor.reshard across dims (reshard_local_shard) uses list all_to_all, "
    "which gloo refuses for uneven splits",
    "area": "reshard",
    "rule": "RESHARD-1",
    "upstream": None,
    "issue_text": (
        "## `ShardedTensor.reshard` across dims fails on gloo for uneven splits "
        "(`reshard_local_shard` uses list `all_to_all`)\n"
        "\n"
        "Run with `torchrun --nproc-per-node 4` (gloo):\n"
        "\n"
        "```python\n"
        "import torch, torch.distributed as dist\n"
        "from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor\n"
        "from torch.distributed._shard.sharded_tensor.metadata import TensorProperties\n"
        "from torch.distributed._shard.sharding_spec import ChunkShardingSpec\n"
        "\n"
        'dist.init_process_group("gloo")\n'
        "rank = dist.get_rank()\n"
        "full = torch.arange(12 * 21).reshape(12, 21)\n"
        'places = [f"rank:{r}/cpu" for r in range(4)]\n'
        "src = ChunkShardingSpec(dim=0, placements=places)\n"
        "meta = src.build_metadata(full.shape, TensorProperties(dtype=full.dtype))\n"
        "local = [Shard(full[3 * rank : 3 * rank + 3].clone(), meta.shards_metadata[rank])]\n"
        "st = ShardedTensor._init_from_local_shards_and_global_metadata(local, meta, "
        "sharding_spec=src)\n"
        "st.reshard(ChunkShardingSpec(dim=1, placements=places))  # 21 columns: 6, 6, 6, 3\n"
        "```\n"
        "\n"
        "**Expected**: rank r holds all 12 rows of columns [6r, min(6r + 6, 21)).\n"
        "\n"
        "**Actual**: `RuntimeError: ProcessGroupGloo::scatter: invalid tensor size at index "
        "3 (expected (3, 6), got (3, 3))` on one rank and connection errors on the others. "
        "`reshard_local_shard` calls the list form of `all_to_all`, which gloo only "
        "implements for equal sizes; `all_to_all_single` with split sizes (as "
        "`reshuffle_local_shard` already uses) works on every backend.\n"
        "\n"
        "Versions: torch 2.13.0 (CPU, gloo)"
    ),
    "nproc": 4,
    "torch_does": "12x21 chunked on dim 0 over 4 ranks, resharded to dim 1 (columns 6, 6, 6, "
    "3): the list all_to_all raises on gloo",
    "spec_says": "every rank ends with the reference slice: rank r holds all 12 rows of "
    "columns [6r, min(6r + 6, 21))",
    "tests": ["test_reshard.py::test_reshard_equals_the_global_tensor_sliced"],
}

dist.init_process_group("gloo", timeout=timedelta(seconds=30))
rank = dist.get_rank()
full = torch.arange(12 * 21).reshape(12, 21)  # element (i, j) holds 21 * i + j
places = [f"rank:{r}/cpu" for r in range(4)]
src, dst = ChunkShardingSpec(dim=0, placements=places), ChunkShardingSpec(dim=1, placements=places)
meta = src.build_metadata(full.shape, TensorProperties(dtype=full.dtype))
local = [Shard(full[3 * rank : 3 * rank + 3].clone(), meta.shards_metadata[rank])]
st = ShardedTensor._init_from_local_shards_and_global_metadata(local, meta, sharding_spec=src)
lo, hi = 6 * rank, min(6 * rank + 6, 21)
try:
    got = st.reshard(dst).local_tensor()
except Exception as e:  # gloo refuses on one rank; its peers may see a broken connection
    msg = str(e).strip().splitlines()[0].split(". This is")[0][-120:]
    print(
        f"DIVERGES rank {rank}: reshard dim 0 -> dim 1 raised {type(e).__name__}: {msg}; "
        f"the spec says rank {rank} ends with columns {lo}-{hi - 1} of every row"
    )
    sys.stdout.flush()
    os._exit(1)
cols = sorted({v % 21 for v in got[0].tolist()})
spec = [[[0, lo], [12, hi - lo]]]
held = [[[0, cols[0]], [got.shape[0], len(cols)]]] if cols else []
print("BOXES", json.dumps({"rank": rank, "shape": [12, 21], "spec": spec, "torch": held}))
bad = not torch.equal(got, full[:, lo:hi])
if bad:
    print(
        f"DIVERGES rank {rank}: after reshard rank {rank} holds columns {cols}; the spec "
        f"says columns {lo}-{hi - 1} of every row"
    )
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if bad else 0)
