"""FSDP1 + TP's _chunk_tensor raises an overlap error for an uneven TP shard (7 rows on 3)."""

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.fsdp  # first: the module below has an import cycle
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.parallel.fsdp import _chunk_tensor, _get_local_box

DEFECT = {
    "id": "fsdp-chunk-tensor-overlap",
    "title": "tensor/parallel/fsdp.py _chunk_tensor raises an overlap error: 7 rows on 3 TP ranks",
    "area": "fsdp",
    "rule": "FSDP-6",
    "upstream": "pytorch PR #188947",
    "nproc": 3,
    "torch_does": "states the TP shards at floor offsets 0, 2, 4 with sizes 3, 3, 1: the boxes "
    "overlap and ShardedTensor construction raises",
    "spec_says": "TP shard t of 7 rows over 3 sits at min(3 t, 7): boxes [0, 3) [3, 6) [6, 7)",
    "tests": [
        "test_chunk.py::test_fsdp_chunk_tensor_of_a_tp_shard",
        "test_fsdp.py::test_chunk_tensor_states_the_rows_it_holds",
    ],
}

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
full = torch.arange(7.0).reshape(7, 1)  # row i holds the value i
dt = distribute_tensor(full, init_device_mesh("cpu", (world,)), [Shard(0)])
mine = [dist.new_group([r]) for r in range(world)][rank]  # FSDP over this rank alone (dp=1)
rows = dt.to_local().flatten().int().tolist()
offsets, sizes = _get_local_box(dt)
start = rows[0] if rows else 7
box = {"rank": rank, "shape": [7], "spec": [[[start], [len(rows)]]]}
print("BOXES", json.dumps({**box, "torch": [[[offsets[0]], [sizes[0]]]]}))
try:
    st = _chunk_tensor(dt, 0, 1, 1, mine)
    got = sorted((m.shard_offsets[0], m.shard_sizes[0]) for m in st.metadata().shards_metadata)
    bad = got != [(0, 3), (3, 3), (6, 1)]
    msg = f"_chunk_tensor states boxes (offset, size) {got}"
except ValueError as e:
    bad, msg = True, f"_chunk_tensor raised {type(e).__name__}: {str(e)[:160]}"
if bad:
    print(f"DIVERGES rank {rank} (holds rows {rows}): {msg}; the spec says [0, 3) [3, 6) [6, 7)")
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if bad else 0)
