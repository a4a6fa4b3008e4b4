"""distribute_tensor's scatter raises a bare AssertionError for an uneven _StridedShard."""

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard

DEFECT = {
    "id": "dtensor-strided-shard-scatter-asserts",
    "title": "distribute_tensor (src_data_rank=0) raises a bare AssertionError for an uneven "
    "_StridedShard that src_data_rank=None places fine",
    "area": "dtensor",
    "rule": "DTENSOR-4",
    "upstream": None,
    "issue_text": """### distribute_tensor asserts on an uneven _StridedShard (scatter path)

```python
mesh = init_device_mesh("cpu", (2,))
distribute_tensor(torch.arange(3.0), mesh, [_StridedShard(0, split_factor=2)])
```

raises a bare `AssertionError` (no message) on every rank, from
`_StridedShard._shard_tensor`'s check that the scatter list has equal shapes:
`_StridedShard._split_tensor(..., with_padding=True)` computes `pad_sizes` but never pads the
shards (2 rows and 1 row here). With `src_data_rank=None` the same call places the data as
`_split_tensor` says (rank 0 rows 0 and 2, rank 1 row 1), so the layout is defined; only the
scatter path fails. Repro: this file, `torchrun --standalone --nproc-per-node 2`, torch
2.13.0, CPU, gloo.

Expected: rank 0 holds `[0., 2.]`, rank 1 `[1.]`, as with `src_data_rank=None`. Actual:
`AssertionError` on every rank.""",
    "nproc": 2,
    "torch_does": "3 rows, [_StridedShard(0, split_factor=2)] on 2 ranks: the default scatter "
    "raises a bare AssertionError (the split is never padded)",
    "spec_says": "parts [0, 2) [2, 3), chunk i of each to rank i: rank 0 rows 0 and 2, rank 1 "
    "row 1, whichever rank the data comes from",
    "tests": [],
}

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2,))
want = [[0, 2], [1]][rank]  # row i holds the value i
try:
    rows = distribute_tensor(torch.arange(3), mesh, [_StridedShard(0, split_factor=2)]).to_local()
    rows, msg = rows.tolist(), f"holds rows {rows.tolist()}"
except AssertionError as e:
    rows, msg = None, f"distribute_tensor raised AssertionError({str(e)[:120]!r})"
bad = rows != want
if bad:
    print(f"DIVERGES rank {rank}: {msg}; the spec says rows {want}")
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if bad else 0)
