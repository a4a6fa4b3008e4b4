"""FSDP1 + TP's _chunk_tensor names a stand-in owner (rank 0 or 1) outside the TP group."""

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.fsdp  # first: the module below has an import cycle
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.parallel.fsdp import _chunk_tensor

DEFECT = {
    "id": "fsdp-chunk-tensor-owner-outside-tp-group",
    "title": "tensor/parallel/fsdp.py _chunk_tensor names group ranks 0/1 as owners: "
    "outside the TP group of ranks 2-3",
    "area": "fsdp",
    "rule": "FSDP-6",
    "upstream": None,
    "issue_text": """### _chunk_tensor (FSDP1 + TP) names owners outside the TP group

`tensor/parallel/fsdp.py` `_create_sharded_tensor_md_from_dt` writes the *group* rank
(`my_rank`, or the stand-in `scapegoat_rank = 0 if my_rank > 0 else 1`) into each
`ShardMetadata.placement`, which `ShardedTensor` reads as a *global* rank. On a 2x2
("dp", "tp") mesh the TP group of ranks 2, 3 gets owners 0 and 1, so
`ShardedTensor._init_from_local_shards_and_global_metadata` raises on ranks 2 and 3; on
ranks 0 and 1 every shard but its own is attributed to the wrong rank (rank 1 claims rows
[0, 2)).

Repro (torch 2.13.0, CPU, gloo): `torchrun --standalone --nproc-per-node 4
fsdp-chunk-tensor-owner-outside-tp-group.py` (this file).

Expected: the outer ShardedTensor's shard i is owned by TP rank i of the group,
`mesh["tp"].mesh[i]` (ranks 2, 3 for the second group). Actual: ranks 2, 3 raise; ranks 0,
1 name themselves or each other regardless of which shard they hold.""",
    "nproc": 4,
    "torch_does": "writes group ranks 0/1 as owners: ranks 2, 3 raise, ranks 0, 1 name the "
    "wrong owner for the other rank's shard",
    "spec_says": "each outer shard is owned by the TP rank that holds it (ranks 2, 3 in the "
    "second TP group)",
    "tests": [
        "test_chunk.py::test_fsdp_chunk_tensor_of_a_tp_shard",
        "test_fsdp.py::test_chunk_tensor_states_the_rows_it_holds",
    ],
}

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
p = mesh.get_coordinate()[0]
tp_ranks = mesh["tp"].mesh.tolist()
dt = distribute_tensor(torch.arange(4.0).reshape(4, 1), mesh["tp"], [Shard(0)])  # even: 2 + 2
want = [(t * 2, r) for t, r in enumerate(tp_ranks)]  # (offset, owner) per TP shard
try:
    st = _chunk_tensor(dt, p, 2, 1, mesh["dp"].get_group())
    mds = st.metadata().shards_metadata
    got = sorted((m.shard_offsets[0], m.placement.rank()) for m in mds)
    msg = f"_chunk_tensor names (offset, owner) {got}"
except Exception as e:
    got, msg = None, f"_chunk_tensor raised {type(e).__name__}: {str(e)[:200]}"
bad = got != want
if bad:
    print(f"DIVERGES rank {rank}: {msg}; the spec says {want} (TP group {tp_ranks})")
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if bad else 0)
