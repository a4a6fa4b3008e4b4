"""ShardedTensor.reshard to a new rank order on the same dim receives from the wrong rank."""

import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
from torch.distributed._shard.sharded_tensor.metadata import TensorProperties
from torch.distributed._shard.sharding_spec import ChunkShardingSpec

DEFECT = {
    "id": "reshard-reshuffle-wrong-sender",
    "title": "ShardedTensor.reshard (reshuffle_local_shard) pairs senders and receivers wrongly "
    "when only the rank order changes",
    "area": "reshard",
    "rule": "RESHARD-1",
    "upstream": None,
    "issue_text": (
        "## `ShardedTensor.reshard` to a new rank order on the same dim aborts gloo "
        "(`reshuffle_local_shard` receives from the wrong rank)\n"
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
        'src = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in (0, 1, 2, 3)])\n'
        'dst = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in (1, 2, 3, 0)])\n'
        "meta = src.build_metadata(full.shape, TensorProperties(dtype=full.dtype))\n"
        "local = [Shard(full[3 * rank : 3 * rank + 3].clone(), meta.shards_metadata[rank])]\n"
        "st = ShardedTensor._init_from_local_shards_and_global_metadata(local, meta, "
        "sharding_spec=src)\n"
        "print(rank, st.reshard(dst).local_tensor()[:, 0] // 21)\n"
        "```\n"
        "\n"
        "**Expected**: rank 1 holds rows 0-2, rank 2 rows 3-5, rank 3 rows 6-8, rank 0 rows "
        "9-11.\n"
        "\n"
        "**Actual**: gloo aborts a rank with `Received data size doesn't match expected "
        "size` (504 vs 0) and the others fail with connection resets. In "
        "`reshuffle_local_shard`, `new_rank = resharding_spec.placements[idx].rank()` (idx = "
        "this rank's old chunk index) is where this rank's rows must go, and the same "
        "`new_rank` is used for `output_split_sizes`, i.e. as the rank to receive from. The "
        "sender of this rank's new chunk is `sharding_spec.placements[new_idx].rank()` "
        "(new_idx = this rank's new chunk index). The two coincide only when the permutation "
        "is its own inverse (a swap), which is why the tests pass.\n"
        "\n"
        "Versions: torch 2.13.0 (CPU, gloo)"
    ),
    "nproc": 4,
    "torch_does": "12x21 chunked on dim 0 over ranks [0, 1, 2, 3], resharded to placements "
    "[1, 2, 3, 0]: each rank expects its rows from the rank it sends to, and gloo aborts "
    "with a size mismatch",
    "spec_says": "every rank ends with the reference slice: rank 1 rows 0-2, rank 2 rows 3-5, "
    "rank 3 rows 6-8, rank 0 rows 9-11",
    "tests": ["test_reshard.py::test_reshard_equals_the_global_tensor_sliced"],
}

dist.init_process_group("gloo", timeout=timedelta(seconds=30))
rank = dist.get_rank()
full = torch.arange(12 * 21).reshape(12, 21)  # element (i, j) holds 21 * i + j
src = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in (0, 1, 2, 3)])
dst = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in (1, 2, 3, 0)])
meta = src.build_metadata(full.shape, TensorProperties(dtype=full.dtype))
md = meta.shards_metadata[rank]
local = [Shard(full[3 * rank : 3 * rank + 3].clone(), md)]
st = ShardedTensor._init_from_local_shards_and_global_metadata(local, meta, sharding_spec=src)
want = (rank - 1) % 4  # dst chunk index of this rank
time.sleep(rank)  # enter one by one, so the first failure is reported on rank 0, not a race
try:
    got = st.reshard(dst).local_tensor()
except Exception as e:  # gloo kills a rank that receives unexpected data; its peers raise
    msg = str(e).strip().splitlines()[0].split(". This is")[0][-120:]
    print(
        f"DIVERGES rank {rank}: reshard to placements [1, 2, 3, 0] raised "
        f"{type(e).__name__}: {msg}; each rank waited for its new rows from the rank it sent "
        f"its own rows to (rank {rank} from rank {(rank + 1) % 4}; the spec's sender is rank "
        f"{(rank - 1) % 4}) and gloo aborted the ranks that got rows they did not expect "
        f"('Received data size doesn't match expected size'); the spec says rank {rank} "
        f"ends with rows {3 * want}-{3 * want + 2}"
    )
    sys.stdout.flush()
    os._exit(1)
rows = sorted({v // 21 for v in got[:, 0].tolist()})
spec = [[[3 * want, 0], [3, 21]]]
held = [[[rows[0], 0], [len(rows), 21]]] if rows else []
print("BOXES", json.dumps({"rank": rank, "shape": [12, 21], "spec": spec, "torch": held}))
bad = not torch.equal(got, full[3 * want : 3 * want + 3])
if bad:
    print(
        f"DIVERGES rank {rank}: after reshard rank {rank} holds rows {rows}; the spec says "
        f"rows {3 * want}-{3 * want + 2}"
    )
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if bad else 0)
