"""ByteCheckpoint 0.0.2 cannot load back the extra_state it saved, on torch >= 2.6.

Install: pip install torch==2.13.0 && pip install --no-deps bytecheckpoint==0.0.2 mmh3==4.1.0
universal-pathlib cachetools safetensors numpy typing-extensions grpcio==1.69.0 protobuf==3.20.3
(ByteCheckpoint 0.0.2 pins torch<=2.5.0). Run: torchrun --standalone --nproc-per-node 1 this.py
Its save starts a gRPC coordinator that binds every interface: held to 127.0.0.1 below.
"""

import sys
import tempfile
from datetime import timedelta

DEFECT = {
    "id": "bytecheckpoint-extra-state-weights-only",
    "title": "ByteCheckpoint 0.0.2 saves extra_state with torch.save(pickle_protocol=4) and "
    "loads it with torch.load's weights_only default: no extra_state loads back on torch >= 2.6",
    "area": "checkpoint_libraries",
    "rule": "CKPT-20",
    "upstream": None,
    "issue_text": """### extra_state saved by `bytecheckpoint.save` does not load on torch >= 2.6

`bytecheckpoint.save(path, {"model": m, "extra_state": extra}, framework="fsdp2")` writes
`extra` with `torch.save(..., pickle_protocol=4)` (`store_engine._write_extra_file`);
`bytecheckpoint.load` reads it with `torch.load(file_path)`
(`load_engine.load_loader_extra_state`), whose default since torch 2.6 is `weights_only=True`,
and the weights-only unpickler does not take protocol 4's `FRAME` opcode: even
`{"step": 3}` fails with `UnpicklingError: Weights only load failed ... Unsupported operand
149`. (Extra state holding NumPy's RNG state would be refused by `weights_only` anyway.) It
loads only with `TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`. Repro: this file, bytecheckpoint 0.0.2,
torch 2.13.0, one gloo rank.

Expected: what `save` accepted loads back (save it with the default protocol, and load it
with `weights_only=False` where the caller trusts its own checkpoint, or with the allow-list
`torch.serialization.add_safe_globals` it needs).""",
    "nproc": 1,
    "impl": "bytecheckpoint",
    "needs": ["bytecheckpoint"],
    "torch_does": "load raises UnpicklingError (Weights only load failed, Unsupported operand "
    "149: protocol 4's FRAME) on the extra_state {'step': 3} save wrote",
    "spec_says": "extra_state saved by a checkpoint library loads back equal",
    "tests": ["test_checkpoint_libraries.py::test_extra_state_loads_back"],
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
extra = {"step": 3}
with tempfile.TemporaryDirectory() as path:
    bytecheckpoint.save(
        path, {"model": Model({"w": torch.arange(6.0)}), "extra_state": extra}, framework="fsdp2"
    )
    state = {"model": Model({"w": torch.zeros(6)}), "extra_state": {}}
    try:
        bytecheckpoint.load(path, state, framework="fsdp2")
        error = None
    except Exception as e:
        error = f"{type(e).__name__}: {str(e).splitlines()[0]}"
dist.destroy_process_group()
if error is not None:
    print(
        f"DIVERGES rank 0: torch {torch.__version__}: load of the extra_state save wrote "
        f"raised {error}; the spec says it loads back equal"
    )
    sys.exit(1)
print("extra_state loaded:", state["extra_state"]["step"])
