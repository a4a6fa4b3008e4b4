"""DTensor.from_local(run_check=True) accepts uneven local shards it then misdescribes."""

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

DEFECT = {
    "id": "dtensor-from-local-accepts-non-chunk-shards",
    "title": "DTensor.from_local(..., run_check=True) accepts local shards that are not the "
    "torch.chunk split of the stated shape",
    "area": "dtensor",
    "rule": "DTENSOR-5",
    "upstream": "pytorch#144109",
    "nproc": 2,
    "torch_does": "accepts 1 + 3 rows for shape (4,) on 2 ranks and describes them as the chunks "
    "[0, 2) [2, 4): rank 0's box holds row 1 it does not have",
    "spec_says": "Shard(0) of 4 rows over 2 is 2 + 2; other local shapes are refused on every "
    "rank before any data moves (fail-fast PR #191472, not merged)",
    "tests": ["test_dtensor_moves.py::test_from_local_accepts_exactly_the_chunk_rules_shards"],
}

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2,))
local = torch.arange(4)[[slice(0, 1), slice(1, 4)][rank]]  # rank 0: row 0, rank 1: rows 1-3
try:
    dt = DTensor.from_local(local, mesh, [Shard(0)], run_check=True, shape=(4,), stride=(1,))
except (RuntimeError, ValueError) as e:
    print(f"rank {rank}: from_local refused the shards: {e}")
    sys.exit(0)
shape, offset = compute_local_shape_and_global_offset(dt.shape, mesh, dt.placements)
rows = local.tolist()
box = {"rank": rank, "shape": [4], "spec": [[[rows[0]], [len(rows)]]]}
print("BOXES", json.dumps({**box, "torch": [[list(offset), list(shape)]]}))
print(
    f"DIVERGES rank {rank}: from_local accepted rows {rows} for shape (4,) and states them "
    f"at offset {offset[0]} size {shape[0]}; the spec says shards of 2 + 2 rows, else refuse"
)
dist.barrier()
dist.destroy_process_group()
sys.exit(1)
