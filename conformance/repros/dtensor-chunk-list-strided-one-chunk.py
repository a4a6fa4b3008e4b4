"""DTensor.__create_chunk_list__ reports a multi-block _StridedShard local tensor as one chunk."""

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard

DEFECT = {
    "id": "dtensor-chunk-list-strided-one-chunk",
    "title": "DTensor.__create_chunk_list__ describes a _StridedShard local tensor holding "
    "several blocks as one chunk",
    "area": "convert",
    "rule": "CONVERT-7",
    "upstream": None,
    "issue_text": """### DTensor.__create_chunk_list__ is wrong for a multi-block _StridedShard

`__create_chunk_list__` (what DCP saves) returns one chunk per rank from
`compute_local_shape_and_global_offset`. With 3 rows and
`[_StridedShard(0, split_factor=2)]` on 2 ranks, rank 0's local tensor holds rows 0 and 2
(`_StridedShard._split_tensor`: parts [0, 1] and [2], chunk 0 of each), but its chunk list
is the one block rows [0, 2), so DCP would save row 2's data in row 1's place (and rank 1
also claims row 1).

```python
dt = distribute_tensor(torch.arange(3.0), init_device_mesh("cpu", (2,)),
                       [_StridedShard(0, split_factor=2)], src_data_rank=None)
print(dist.get_rank(), dt.to_local(), dt.__create_chunk_list__())
```

Expected on rank 0: two chunks, offsets 0 and 2, size 1 each, in local order. Actual: one
chunk, offset 0, size 2. torch 2.13.0, CPU, gloo, `torchrun --standalone --nproc-per-node 2`.""",
    "nproc": 2,
    "torch_does": "rank 0 holds rows [0, 2] but its chunk list is the one block [0, 2) (rows 0, 1)",
    "spec_says": "one chunk per block in local order: rows [0, 1) and [2, 3)",
    "tests": [
        "test_convert.py::test_dtensor_chunk_list_is_where_the_local_data_sits",
        "test_convert.py::test_dtensor_chunk_lists_on_every_rank_of_a_large_mesh",
    ],
}

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2,))
# src_data_rank=None: each rank splits its own copy (the default scatter asserts on this split)
dt = distribute_tensor(
    torch.arange(3.0), mesh, [_StridedShard(0, split_factor=2)], src_data_rank=None
)
rows = dt.to_local().int().tolist()  # row i holds the value i
spec: list = []  # the rank's blocks: maximal runs of consecutive rows, in local order
for r in rows:
    if spec and spec[-1][0][0] + spec[-1][1][0] == r:
        spec[-1][1][0] += 1
    else:
        spec.append([[r], [1]])
chunks = [[list(c.offsets), list(c.sizes)] for c in dt.__create_chunk_list__()]
print("BOXES", json.dumps({"rank": rank, "shape": [3], "spec": spec, "torch": chunks}))
bad = chunks != spec
if bad:
    print(
        f"DIVERGES rank {rank}: local rows {rows}, __create_chunk_list__ (offsets, sizes) "
        f"{chunks}; the spec says {spec}"
    )
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if bad else 0)
