"""ByteCheckpoint 0.0.2: a rank whose data file is missing raises, and the others wait in the
load's closing barrier until the process group's timeout.

Install: pip install torch==2.13.0 && pip install --no-deps bytecheckpoint==0.0.2 mmh3==4.1.0
universal-pathlib cachetools safetensors numpy typing-extensions grpcio==1.69.0 protobuf==3.20.3
(ByteCheckpoint 0.0.2 pins torch<=2.5.0). Run: torchrun --standalone --nproc-per-node 2 this.py
Its save starts a gRPC coordinator that binds every interface: held to 127.0.0.1 below.
"""

import os
import shutil
import sys
import tempfile
import time
from datetime import timedelta

DEFECT = {
    "id": "bytecheckpoint-missing-file-leaves-ranks-waiting",
    "title": "ByteCheckpoint 0.0.2: a load missing one rank's data file fails on that rank and "
    "leaves the others waiting in a barrier until the process group times out",
    "area": "checkpoint_libraries",
    "rule": "CKPT-20",
    "upstream": None,
    "issue_text": """### A missing data file hangs the other ranks of a load

`load_state_dict` reads each rank's items (`read_data`) and then calls `dist.barrier()`. A
rank whose items lie in a missing file raises `FileNotFoundError` before the barrier; the
ranks that need nothing of that file enter the barrier and wait for it until the process
group's timeout (30 minutes by default), so the job hangs instead of failing. Saving a
(7,) DTensor Shard(0) on 2 ranks, deleting `__1_0.distcp` and loading on 2 ranks: rank 1
raises, rank 0 waits the whole timeout (10 s here). Repro: this file, bytecheckpoint 0.0.2,
torch 2.13.0, 2 gloo ranks.

Expected: every rank fails at once with the error (agree on the outcome of the reads, as
DCP's `dcp.load` does with its gathered `CheckpointException`).""",
    "nproc": 2,
    "impl": "bytecheckpoint",
    "needs": ["bytecheckpoint"],
    "torch_does": "rank 1 raises FileNotFoundError; rank 0 waits in the load's dist.barrier() "
    "until the process group's timeout",
    "spec_says": "a damaged checkpoint is refused on every rank, none left waiting",
    "tests": [
        "test_checkpoint_libraries.py::test_a_checkpoint_missing_a_data_file_is_refused_on_every_rank"
    ],
}
TIMEOUT = 10

try:
    import asyncio
    import threading

    import bytecheckpoint
    import grpc
    import torch
    import torch.distributed as dist
    from bytecheckpoint.utilities.server import report_service_pb2_grpc, server_lib
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
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


class Model:  # the Stateful its API takes
    def __init__(self, sd):
        self.sd = sd

    def state_dict(self):
        return self.sd

    def load_state_dict(self, sd):
        self.sd = sd


dist.init_process_group("gloo", timeout=timedelta(seconds=TIMEOUT))
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2,))
path = tempfile.mkdtemp() if rank == 0 else None
box = [path]
dist.broadcast_object_list(box)
path = box[0]
w = distribute_tensor(torch.arange(7.0), mesh, [Shard(0)], src_data_rank=None)
bytecheckpoint.save(path, {"model": Model({"w": w})}, framework="fsdp2")
dist.barrier()
if rank == 0:
    os.remove(os.path.join(path, "model", "__1_0.distcp"))  # rank 1's rows 4-6
dist.barrier()
target = distribute_tensor(torch.full((7,), -1.0), mesh, [Shard(0)], src_data_rank=None)
t0 = time.monotonic()
try:
    bytecheckpoint.load(path, {"model": Model({"w": target})}, framework="fsdp2")
    outcome = "returned"
except Exception as e:
    outcome = f"raised {type(e).__name__}: {str(e).splitlines()[0][:120]}"
took = time.monotonic() - t0
print(f"rank {rank}: {outcome} after {took:.1f} s")
if rank == 1:
    time.sleep(TIMEOUT + 5)  # stay up (as a job's rank would) while rank 0 waits
    os._exit(0)
shutil.rmtree(path, ignore_errors=True)
if took >= TIMEOUT - 1 or outcome == "returned":
    print(
        f"DIVERGES rank 0: its load {outcome} after {took:.1f} s, left waiting in "
        "ByteCheckpoint's barrier while rank 1 failed on the missing file; the spec says "
        "every rank refuses the damaged checkpoint"
    )
    os._exit(1)
os._exit(0)
