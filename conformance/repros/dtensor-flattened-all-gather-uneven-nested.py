"""DTensor's flattened all-gather silently corrupts uneven nested sharding (S(0), S(0) -> R, R)."""

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

DEFECT = {
    "id": "dtensor-flattened-all-gather-uneven-nested",
    "title": "redistribute [Shard(0), Shard(0)] -> [Replicate(), Replicate()] on a mesh with a "
    "flattened dim loses rows of an uneven tensor",
    "area": "dtensor",
    "rule": "CONF-1",
    "upstream": "pytorch PR #194457",
    "nproc": 4,
    "torch_does": "5 rows on a 2 x 2 mesh with a flattened submesh: one flat all-gather assumes "
    "chunks 2/2/1/0 (the pieces are 2/1/1/1), row 4 is lost and a padding row appears",
    "spec_says": "every rank's output equals the global tensor: rows 0, 1, 2, 3, 4",
    "tests": [
        "test_dtensor_moves.py::test_redistribute_on_a_flattened_mesh_holds_the_oracles_pieces",
        "test_dtensor_moves.py::test_redistribute_on_a_large_flattened_mesh_holds_the_oracles_pieces",
    ],
}

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
mesh._flatten()  # a flattened ("a_b") submesh: what makes redistribute take the one-collective path
full = torch.arange(15.0).reshape(5, 3)  # row i holds 3 i, 3 i + 1, 3 i + 2
dt = distribute_tensor(full, mesh, [Shard(0), Shard(0)])
got = dt.redistribute(mesh, [Replicate(), Replicate()]).to_local()
bad = not torch.equal(got, full)
if bad:
    rows = (got[:, 0] / 3).tolist()
    print(
        f"DIVERGES rank {rank}: redistribute to [Replicate(), Replicate()] gives rows {rows}; "
        f"the spec says [0.0, 1.0, 2.0, 3.0, 4.0]"
    )
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if bad else 0)
