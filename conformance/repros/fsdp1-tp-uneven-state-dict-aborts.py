"""FSDP1 + TP: SHARDED_STATE_DICT with an uneven TP shard aborts gloo in state_dict()."""

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

DEFECT = {
    "id": "fsdp1-tp-uneven-state-dict-aborts",
    "title": "FSDP1 + TP SHARDED_STATE_DICT aborts gloo for 7 rows over TP 2 (_chunk_dtensor)",
    "area": "fsdp_models",
    "rule": "FSDP-9",
    "upstream": "pytorch PR #188947",
    "nproc": 4,
    "torch_does": "state_dict() dies in tensor/parallel/fsdp.py _chunk_dtensor's redistribute: "
    "gloo 'Received data size doesn't match expected size', the other ranks see resets",
    "spec_says": "every rank's entry holds chunk p of its TP piece, and the entries gather "
    "back to the full weight (Linear(10, 7).weight: rows 4 + 3 over TP, then 2 + 2 / 2 + 1)",
    "tests": ["test_fsdp_models.py::test_fsdp1_tp_uneven_mlp_local_state_is_the_reference_slice"],
}

dist.init_process_group("gloo", timeout=timedelta(seconds=20))
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
model = nn.Sequential(nn.Linear(10, 7), nn.ReLU(), nn.Linear(7, 5))
with torch.no_grad():  # arange values: weight row i of layer 0 starts at 10 i
    for p in model.parameters():
        p.copy_(torch.arange(p.numel(), dtype=p.dtype).reshape(p.shape))
full = {k: v.clone() for k, v in model.state_dict().items()}
parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
model = FSDP(model, device_mesh=mesh["dp"], device_id=torch.device("cpu"))
try:
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        sd = model.state_dict()
    wrong = [
        k for k, v in sd.items() if not torch.equal(v.full_tensor(), full[k.split("module.")[-1]])
    ]
    msg = f"state_dict() entries {wrong} do not gather back to the model's weights"
except Exception as e:
    wrong, msg = ["?"], f"state_dict() raised {type(e).__name__}: {str(e)[:160]}"
if wrong:
    print(f"DIVERGES rank {rank}: {msg}; the spec says each entry holds its FSDP-1 chunk")
sys.exit(1 if wrong else 0)
