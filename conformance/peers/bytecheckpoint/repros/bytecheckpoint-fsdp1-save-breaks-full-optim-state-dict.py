"""After ByteCheckpoint 0.0.2's first FSDP1 save in a process, torch's full optimizer state
dict of the saved model reads each parameter's exp_avg_sq as its exp_avg.

Install: pip install torch==2.13.0 && pip install --no-deps bytecheckpoint==0.0.2 mmh3==4.1.0
universal-pathlib cachetools safetensors numpy typing-extensions grpcio==1.69.0 protobuf==3.20.3
(ByteCheckpoint 0.0.2 pins torch<=2.5.0). Run: torchrun --standalone --nproc-per-node 2 this.py
Its save starts a gRPC coordinator that binds every interface: held to 127.0.0.1 below.
"""

import shutil
import sys
import tempfile
from datetime import timedelta

DEFECT = {
    "id": "bytecheckpoint-fsdp1-save-breaks-full-optim-state-dict",
    "title": "After ByteCheckpoint 0.0.2's FSDP1 save, the full optimizer state dict of the "
    "same model reads exp_avg_sq as exp_avg",
    "area": "checkpoint_libraries",
    "rule": "CKPT-20",
    "upstream": None,
    "issue_text": """### An FSDP1 save changes what the model's full optimizer state dict reads

An FSDP1 model (`use_orig_params=True`, 2 gloo ranks, CPU) after one Adam step:
`get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))` gives
each parameter's `exp_avg` and `exp_avg_sq`. After
`bytecheckpoint.save(path, {"model": model, "optimizer": opt}, framework="fsdp")` (the first
save of the process) the same call gives `exp_avg_sq`'s values under `exp_avg` too, on every
rank; the optimizer's own (flat) state is unchanged, the checkpoint holds the right values,
and the same calls without ByteCheckpoint's save, or around torch's own
`FSDP.optim_state_dict` under `SHARDED_STATE_DICT` with `offload_to_cpu=True`, read the same
before and after. A job that saves with ByteCheckpoint and then exports a consolidated copy
(or evaluates its optimizer state) gets the wrong first moment. Repro: this file,
bytecheckpoint 0.0.2, torch 2.13.0, 2 gloo ranks.

Expected: a save leaves the job's state, and every view of it, as it found it.""",
    "nproc": 2,
    "impl": "bytecheckpoint",
    "needs": ["bytecheckpoint"],
    "torch_does": "after the first FSDP1 save, the full optimizer state dict reads each "
    "exp_avg as the parameter's exp_avg_sq",
    "spec_says": "a save leaves the job's state as it found it",
    "tests": [
        "test_checkpoint_libraries.py::test_an_fsdp1_save_leaves_the_full_state_dicts_as_they_were"
    ],
}

try:
    import asyncio
    import threading

    import bytecheckpoint
    import grpc
    import torch
    import torch.distributed as dist
    from bytecheckpoint.utilities.server import report_service_pb2_grpc, server_lib
    from torch import nn
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
except (ImportError, OSError) as e:
    print(f"SKIPPED bytecheckpoint does not load ({type(e).__name__}: {e})")
    sys.exit(0)


def loopback_coordinator(world_size):  # its own servicer, on 127.0.0.1 in this process
    box, ready = {}, threading.Event()

    async def serve():
        server = grpc.aio.server()
        report_service_pb2_grpc.add_ByteCheckpointReportServiceServicer_to_server(
            server_lib.ReportServicer(world_size), server
        )
        box["addr"] = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        ready.set()
        await server.wait_for_termination()

    threading.Thread(target=lambda: asyncio.run(serve()), daemon=True).start()
    ready.wait(60)
    return box["addr"]


server_lib.start_server_in_new_process = loopback_coordinator
server_lib.get_host_ip = server_lib._get_local_ip = lambda: "127.0.0.1"


dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
torch.manual_seed(0)
model = FSDP(
    nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3)),
    device_id=torch.device("cpu"),
    use_orig_params=True,
)
opt = torch.optim.Adam(model.parameters(), lr=0.1)
model(torch.arange(15.0).reshape(3, 5) / 10).sum().backward()
opt.step()
full = StateDictOptions(full_state_dict=True)


def first_moments():
    osd = get_optimizer_state_dict(model, opt, options=full)["state"]
    return {k: v["exp_avg"].clone() for k, v in osd.items()}, {
        k: v["exp_avg_sq"].clone() for k, v in osd.items()
    }


before, squares = first_moments()
path = tempfile.mkdtemp() if rank == 0 else None
box = [path]
dist.broadcast_object_list(box)
bytecheckpoint.save(box[0], {"model": model, "optimizer": opt}, framework="fsdp")
after, _ = first_moments()
dist.barrier()
if rank == 0:
    shutil.rmtree(box[0], ignore_errors=True)
changed = [k for k in before if not torch.equal(before[k], after[k])]
as_squares = [k for k in changed if torch.equal(after[k], squares[k])]
dist.destroy_process_group()
if changed:
    print(
        f"DIVERGES rank {rank}: after the save, exp_avg of {changed} reads other values "
        f"({len(as_squares)} of them exp_avg_sq's: {after['0.bias'][:3].tolist()} where it "
        f"read {before['0.bias'][:3].tolist()}); the spec says a save leaves the state as it "
        "was"
    )
    sys.exit(1)
