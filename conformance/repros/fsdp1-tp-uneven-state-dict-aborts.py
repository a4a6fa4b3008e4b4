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
    "upstream": None,
    "issue_text": """### FSDP1 + TP: SHARDED_STATE_DICT aborts gloo for an uneven TP shard

On a 2x2 ("dp", "tp") CPU mesh, `Linear(10, 7)` under `ColwiseParallel` and `Linear(7, 5)`
under `RowwiseParallel`, wrapped as `FSDP(model, device_mesh=mesh["dp"],
device_id=torch.device("cpu"))`, `model.state_dict()` under
`StateDictType.SHARDED_STATE_DICT` kills the process group: two ranks abort in gloo
("op.preamble.length <= op.nbytes. 80 vs 60. Received data size doesn't match expected
size"), the other two see "Connection reset by peer".

Cause: `tensor/parallel/fsdp.py` `_chunk_dtensor` rebuilds the TP parameter with
`DTensor.from_local(tensor.to_local(), root_mesh, [Replicate(), Shard(0)], run_check=False)`
without `shape=`/`stride=`, so each TP rank infers its own global shape (4 rows x 2 = 8 on
TP rank 0, 3 x 2 = 6 on TP rank 1) and the `redistribute` that follows runs mismatched
collectives (the class of #110762; PR #123812 proposed passing the global shape here, and
2.13 does not). Even with the shape passed, the target placements `(Shard(0), Shard(0))`
chunk dp-first, which is not where FSDP1 put 7 rows (TP [0, 4) [4, 7), then FSDP 2 + 2 /
2 + 1).

Repro: this file, `torchrun --standalone --nproc-per-node 4`, torch 2.13.0.
Expected: `state_dict()` returns entries that `full_tensor()` back to the weights. Actual:
the process group aborts.""",
    "nproc": 4,
    "torch_does": "state_dict() dies in tensor/parallel/fsdp.py _chunk_dtensor's redistribute: "
    "gloo 'Received data size doesn't match expected size', the other ranks see resets",
    "spec_says": "every rank's entry holds chunk p of its TP piece, and the entries gather "
    "back to the full weight (Linear(10, 7).weight: rows 4 + 3 over TP, then 2 + 2 / 2 + 1)",
    "tests": [
        "test_fsdp_models.py::test_fsdp1_tp_uneven_mlp_local_state_is_the_reference_slice",
        "test_fsdp.py::test_chunk_dtensor_states_the_rows_it_holds",
        "test_fsdp.py::test_chunk_dtensor_gathers_back_to_the_tp_piece",
    ],
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
