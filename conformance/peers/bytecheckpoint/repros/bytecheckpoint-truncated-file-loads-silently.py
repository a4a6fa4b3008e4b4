"""ByteCheckpoint 0.0.2 loads a chunk whose data file was cut short without an error.

Install: pip install torch==2.13.0 && pip install --no-deps bytecheckpoint==0.0.2 mmh3==4.1.0
universal-pathlib cachetools safetensors numpy typing-extensions grpcio==1.69.0 protobuf==3.20.3
(ByteCheckpoint 0.0.2 pins torch<=2.5.0). Run: torchrun --standalone --nproc-per-node 1 this.py
Its save starts a gRPC coordinator that binds every interface: held to 127.0.0.1 below.
"""

import os
import sys
import tempfile
from datetime import timedelta

DEFECT = {
    "id": "bytecheckpoint-truncated-file-loads-silently",
    "title": "ByteCheckpoint 0.0.2 loads a truncated data file without an error: the missing "
    "elements hold whatever the storage holds",
    "area": "checkpoint_libraries",
    "rule": "CKPT-20",
    "upstream": None,
    "issue_text": """### A truncated data file loads without an error

`load_engine.load_per_file_serial` reads each item with `_SliceFile.read(length)`, which
returns what the file still has, and `_deserialize_tensor` builds the tensor on that short
buffer (`UntypedStorage.from_buffer`, then the pickled size and stride): nothing compares the
bytes read with `_StorageInfo.length`. Saving `arange(7.)` and cutting 3 bytes off its data
file, `bytecheckpoint.load` returns `[0, 1, 2, 3, 4, 5, 0]` and no error. Repro: this file,
bytecheckpoint 0.0.2, torch 2.13.0, one gloo rank.

Expected: a chunk whose bytes the file does not hold (short read, or file shorter than its
offset + length) raises, naming the file and the tensor, on every rank.""",
    "nproc": 1,
    "impl": "bytecheckpoint",
    "needs": ["bytecheckpoint"],
    "torch_does": "the load of arange(7.) from a data file 3 bytes short returns "
    "[0, 1, 2, 3, 4, 5, 0] and raises nothing",
    "spec_says": "a damaged checkpoint is refused on every rank",
    "tests": ["test_checkpoint_libraries.py::test_a_truncated_data_file_is_refused_on_every_rank"],
}

try:
    import asyncio
    import threading

    import bytecheckpoint
    import grpc
    import torch
    import torch.distributed as dist
    from bytecheckpoint.utilities.server import report_service_pb2_grpc, server_lib
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


dist.init_process_group("gloo", timeout=timedelta(seconds=30))
with tempfile.TemporaryDirectory() as path:
    bytecheckpoint.save(path, {"model": Model({"w": torch.arange(7.0)})}, framework="fsdp2")
    data = os.path.join(path, "model", "__0_0.distcp")
    with open(data, "rb+") as f:
        f.truncate(os.path.getsize(data) - 3)
    target = torch.full((7,), -1.0)
    try:
        bytecheckpoint.load(path, {"model": Model({"w": target})}, framework="fsdp2")
        error = None
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
dist.destroy_process_group()
if error is None:
    print(
        f"DIVERGES rank 0: the load from a data file 3 bytes short gave {target.tolist()} and "
        "no error; the spec says a damaged checkpoint is refused"
    )
    sys.exit(1)
print("refused:", error)
