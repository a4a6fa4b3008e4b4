"""2-D uneven [Shard(0), Shard(0)]: compute_local_shape_and_global_offset and DCP on real ranks.

pytorch#161368's case (2 rows on a 2 x 4 mesh) shrunk to a 2 x 2 mesh. On torch 2.13 the
non-empty offsets are right and the DCP round trip below holds; what still diverges is the
nested empty shard, placed at the global size instead of its parent's end (the same defect as
dtensor-nested-empty-shard-offset.py, here through the public API on real ranks).
"""

import json
import shutil
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

DEFECT = {
    "id": "dtensor-2d-uneven-empty-offset-dcp",
    "title": "2-D uneven [Shard(0), Shard(0)]: the offsets compute_local_shape_and_global_offset "
    "gives a real 2 x 2 mesh, and a DCP round trip",
    "area": "dtensor",
    "rule": "DTENSOR-6",
    "upstream": "pytorch#161368",
    "nproc": 4,
    "torch_does": "2 rows on a 2 x 2 mesh: coordinate (0, 1), the empty chunk of parent row "
    "[0, 1), is reported at offset 2 (the global size)",
    "spec_says": "an empty piece sits at the end of its parent: (0, 1) at 1, (1, 1) at 2; the "
    "DCP round trip gives back rows 0, 1",
    "tests": ["test_dtensor.py::test_nested_empty_pieces_sit_at_the_end_of_their_parent"],
}

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2, 2))
a, b = mesh.get_coordinate()
full = torch.arange(2.0)  # row i holds i
dt = distribute_tensor(full, mesh, [Shard(0), Shard(0)])
shape, offset = compute_local_shape_and_global_offset(dt.shape, mesh, dt.placements)
start = a + 1 if b else a  # chunk b of 2 of parent row [a, a + 1): row a, then empty at a + 1
box = {"rank": rank, "shape": [2], "spec": [[[start], [shape[0]]]]}
print("BOXES", json.dumps({**box, "torch": [[[offset[0]], [shape[0]]]]}))
problems = []
if offset[0] != start:
    problems.append(
        f"coordinate ({a}, {b}) holds {shape[0]} rows at offset {offset[0]}; the spec says "
        f"{start}, the end of its parent row [{a}, {a + 1})"
    )
path = [tempfile.mkdtemp() if rank == 0 else None]
dist.broadcast_object_list(path)
try:
    dcp.save({"t": dt}, checkpoint_id=path[0])
    back = {"t": torch.zeros(2)}
    dcp.load(back, checkpoint_id=path[0])
    if not torch.equal(back["t"], full):
        problems.append(f"the DCP round trip gives {back['t'].tolist()}; the spec says [0.0, 1.0]")
except BaseException as e:  # DCP's CheckpointException is a BaseException
    problems.append(f"DCP raised {type(e).__name__}: {str(e)[:120]}; the spec says it round-trips")
for p in problems:
    print(f"DIVERGES rank {rank}: {p}")
dist.barrier()
if rank == 0:
    shutil.rmtree(path[0], ignore_errors=True)
dist.destroy_process_group()
sys.exit(1 if problems else 0)
