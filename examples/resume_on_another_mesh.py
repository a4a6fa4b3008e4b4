"""Train with FSDP2 + TP on a 2x2 mesh, then resume the model and its Adam state on dp=4.

torchrun --standalone --nproc-per-node 4 examples/resume_on_another_mesh.py
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from shardspec.fsdp import reshard_for


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 7), nn.ReLU(), nn.Linear(7, 5))


def sharded(model: nn.Module, mesh: dist.DeviceMesh, tp: dist.DeviceMesh | None) -> nn.Module:
    if tp is not None:  # use_local_output=False: the hidden dim of 7 is uneven over TP
        plan = {"0": ColwiseParallel(use_local_output=False), "2": RowwiseParallel()}
        parallelize_module(model, tp, plan)
    fully_shard(model, mesh=mesh)
    return model


dist.init_process_group("gloo")
x = torch.randn(3, 10, generator=torch.Generator().manual_seed(1))

mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
model = sharded(make_model(), mesh["dp"], mesh["tp"])
opt = torch.optim.Adam(model.parameters(), lr=0.1)
model(x).sum().backward()
opt.step()
msd, osd = get_model_state_dict(model), get_optimizer_state_dict(model, opt)

# Resume on 4-way data parallelism: a new model and optimizer, the state resharded for them.
dp4 = init_device_mesh("cpu", (4,), mesh_dim_names=("dp",))
model4 = sharded(make_model(), dp4, None)
opt4 = torch.optim.Adam(model4.parameters(), lr=0.1)
new_msd, new_osd = reshard_for(model4, msd, osd)  # one batched reshard, checked first
set_model_state_dict(model4, new_msd)
set_optimizer_state_dict(model4, opt4, new_osd)
opt4.zero_grad()
model4(x).sum().backward()
opt4.step()

# The same two steps on one process, for comparison.
ref = make_model()
ref_opt = torch.optim.Adam(ref.parameters(), lr=0.1)
for _ in range(2):
    ref_opt.zero_grad()
    ref(x).sum().backward()
    ref_opt.step()
for (name, p), q in zip(model4.named_parameters(), ref.parameters()):
    assert torch.allclose(p.full_tensor(), q, atol=1e-5, rtol=0), name
if dist.get_rank() == 0:
    print("resumed on dp=4: parameters after the second step match the single-process run")
dist.barrier()  # no rank tears gloo down while a peer is still sending
dist.destroy_process_group()
