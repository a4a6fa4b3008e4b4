"""FSDP2 + TP cannot DCP-save its own state dict: 7 rows on dp=3 x tp=2."""

import json
import shutil
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

DEFECT = {
    "id": "fsdp2-tp-dcp-save-dp3-tp2",
    "title": "FSDP2 + TP: (_StridedShard(0, 2), Shard(0)) misplaces 7 rows on dp=3 x tp=2, so "
    "DCP cannot save the model's own state dict",
    "area": "fsdp_models",
    "rule": "FSDP-5",
    "upstream": None,
    "issue_text": """### FSDP2 + TP: DCP cannot save a 7-row weight on dp=3 x tp=2

`Linear(10, 7)` under `ColwiseParallel` on the "tp" dim of a (dp=3, tp=2) CPU mesh, then
`fully_shard(model, mesh=mesh["dp"])`. The data is right (TP rows [0, 4) [4, 7), then FSDP
chunks 2 + 2 + 0 and 1 + 1 + 1), but the parameter's placements
`(_StridedShard(0, split_factor=2), Shard(0))` describe another layout:
`compute_local_shape_and_global_offset` puts coordinate (2, 0), which holds no rows, at row 6
with 1 row, and (2, 1), which holds row 6, at offset 7 with 0 rows. `dcp.save(
model.state_dict())` then fails ("mismatch sizes torch.Size([1, 10]) vs torch.Size([0, 10])").
Repro: this file, `torchrun --standalone --nproc-per-node 6`, torch 2.13.0.

Expected: the save and a load into full tensors give back the weight. Actual: the save
raises (or, where shapes happen to match, writes rows in the wrong place).""",
    "nproc": 6,
    "torch_does": "the placements put coordinate (2, 0) at row 6 (1 row) though it holds none, "
    "and (2, 1) holding row 6 at offset 7: dcp.save raises",
    "spec_says": "placements describe an FSDP parameter only when their layout is FSDP-1's; "
    "the state dict round-trips through DCP",
    "tests": [],
}

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (3, 2), mesh_dim_names=("dp", "tp"))
model = nn.Linear(10, 7, bias=False)
with torch.no_grad():  # row i holds 10 i .. 10 i + 9
    model.weight.copy_(torch.arange(70.0).reshape(7, 10))
parallelize_module(model, mesh["tp"], ColwiseParallel())
fully_shard(model, mesh=mesh["dp"])
w = model.weight
rows = (w.to_local()[:, 0] / 10).int().tolist()
shape, offset = compute_local_shape_and_global_offset(w.shape, w.device_mesh, w.placements)
spec = [[rows[0], 0], [len(rows), 10]] if rows else [[7, 0], [0, 10]]
box = {"rank": rank, "shape": [7, 10], "spec": [spec]}
print("BOXES", json.dumps({**box, "torch": [[list(offset), list(shape)]]}))
path = [tempfile.mkdtemp() if rank == 0 else None]
dist.broadcast_object_list(path)
try:
    dcp.save({"w": w}, checkpoint_id=path[0])
    back = {"w": torch.zeros(7, 10)}
    dcp.load(back, checkpoint_id=path[0])
    bad = not torch.equal(back["w"], torch.arange(70.0).reshape(7, 10))
    msg = f"dcp round trip gives rows {(back['w'][:, 0] / 10).tolist()}"
except BaseException as e:  # DCP's CheckpointException is a BaseException
    first = next(iter(getattr(e, "failures", {}).values()), (e,))  # (exception, traceback)
    bad, msg = True, f"dcp.save raised {type(e).__name__}: {str(first[0])[:160]}"
if bad:
    print(
        f"DIVERGES rank {rank}: holds rows {rows}, placements say offset {list(offset)} "
        f"shape {list(shape)}; {msg}; the spec says the save round-trips"
    )
dist.barrier()
if rank == 0:
    shutil.rmtree(path[0], ignore_errors=True)
dist.destroy_process_group()
sys.exit(1 if bad else 0)
