"""FSDP1 + TP cannot load its own sharded optimizer state dict back (any TP parameter)."""

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

DEFECT = {
    "id": "fsdp1-tp-optim-state-does-not-load",
    "title": "FSDP1 + TP: optim_state_dict_to_load rejects the SHARDED optimizer state FSDP "
    "itself wrote",
    "area": "fsdp_models",
    "rule": "FSDP-11",
    "upstream": None,
    "issue_text": """### FSDP1 + TP cannot load its own sharded optimizer state dict

On a 2x2 ("dp", "tp") CPU mesh with `Linear(8, 8)` colwise + `Linear(8, 4)` rowwise (even
splits), wrapped as `FSDP(model, device_mesh=mesh["dp"], device_id=cpu)`, one Adam step, then
under `SHARDED_STATE_DICT`:

```python
osd = FSDP.optim_state_dict(model, opt)
opt2.load_state_dict(FSDP.optim_state_dict_to_load(model, opt2, osd))
```

raises on every rank: `_optim_utils._flatten_optim_state` gathers each TP DTensor state to
its global shape and compares it with the TP-local parameter ("Tensor optimizer state does
not have same shape as its parameter: torch.Size([8, 8]) torch.Size([4, 8])"). Repro: this
file, `torchrun --standalone --nproc-per-node 4`, torch 2.13.0.

Expected: the state loads and equals the saved state on every rank. Actual: it raises.""",
    "nproc": 4,
    "torch_does": "optim_state_dict_to_load raises: the TP state is gathered to its global "
    "shape and compared with the TP-local parameter's shape",
    "spec_says": "an FSDP1 + TP sharded optimizer state dict loads back, each rank getting its "
    "own state",
    "tests": [],
}

dist.init_process_group("gloo", timeout=timedelta(seconds=30))
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
model = FSDP(model, device_mesh=mesh["dp"], device_id=torch.device("cpu"))
opt = torch.optim.Adam(model.parameters(), lr=0.1)
model(torch.arange(24.0).reshape(3, 8)).sum().backward()
opt.step()
try:
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        osd = FSDP.optim_state_dict(model, opt)
        opt2 = torch.optim.Adam(model.parameters(), lr=0.1)
        opt2.load_state_dict(FSDP.optim_state_dict_to_load(model, opt2, osd))
    bad = [
        f"exp_avg of flat parameter {i}"
        for i, p in enumerate(model.parameters())
        if not torch.equal(opt2.state[p]["exp_avg"], opt.state[p]["exp_avg"])
    ]
    msg = f"the reloaded {bad} differ from the saved state"
except Exception as e:
    bad, msg = ["?"], f"optim_state_dict_to_load raised {type(e).__name__}: {str(e)[:200]}"
if bad:
    print(f"DIVERGES rank {rank}: {msg}; the spec says it loads back, each rank its own state")
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if bad else 0)
