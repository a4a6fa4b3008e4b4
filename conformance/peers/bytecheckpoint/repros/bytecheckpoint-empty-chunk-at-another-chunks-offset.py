"""ByteCheckpoint 0.0.2 cannot save a ShardedTensor with an empty shard at the offset where
another shard starts: its global plan check fails (DCP's offset-keyed dedup, inherited).

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
    "id": "bytecheckpoint-empty-chunk-at-another-chunks-offset",
    "title": "ByteCheckpoint 0.0.2 cannot save a ShardedTensor with an empty shard at the "
    "offset where another rank's shard starts",
    "area": "checkpoint",
    "rule": "CKPT-1",
    "upstream": None,
    "issue_text": """### An empty shard at another shard's offset fails the save

A (4,) ShardedTensor whose rank 0 holds rows [2, 4) and [0, 2) and whose rank 1 holds an
empty shard at offset 0 (valid: the empty shard holds nothing). `bytecheckpoint.save(...,
framework="fsdp2")` raises `ValueError: Failed to validate global plan` on every rank:
`custom_dedup_tensors` keys write items by `MetadataIndex`, whose equality ignores `index`,
so the empty chunk and rows [0, 2) are taken for one replicated chunk and the empty one is
kept (rank 1's plan is smaller); rows [0, 2) are never planned and the fill check fails.
(Saved on one rank instead, both chunks are planned under one offset and the load gives one
chunk's bytes for the other.) The same dedup as DCP's (pytorch's
`dedup_save_plans`). Repro: this file, bytecheckpoint 0.0.2, torch 2.13.0, 2 gloo ranks.

Expected: empty chunks hold nothing, so they are left out of the plan (or deduplicated by
their full box), and the save writes every row.""",
    "nproc": 2,
    "impl": "bytecheckpoint",
    "needs": ["bytecheckpoint"],
    "torch_does": "save raises ValueError('Failed to validate global plan') on every rank",
    "spec_says": "a valid layout's chunks are saved and load back to the reference",
    "tests": ["test_checkpoint.py::test_a_checkpoint_saved_on_one_world_loads_on_another"],
}

try:
    import asyncio
    import threading

    import bytecheckpoint
    import grpc
    import torch
    import torch.distributed as dist
    from bytecheckpoint.utilities.server import report_service_pb2_grpc, server_lib
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
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
rank = dist.get_rank()
full = torch.arange(4, dtype=torch.int32)
boxes = {0: [(2, 2), (0, 2)], 1: [(0, 0)]}
local = [
    Shard(full[o : o + n].clone(), ShardMetadata([o], [n], f"rank:{rank}/cpu"))
    for o, n in boxes[rank]
]
st = ShardedTensor._init_from_local_shards(local, 4)
box = [tempfile.mkdtemp() if rank == 0 else None]
dist.broadcast_object_list(box)
try:
    bytecheckpoint.save(box[0], {"model": Model({"t": st})}, framework="fsdp2")
    error = None
except BaseException as e:  # its plan check raises DCP's CheckpointException, a BaseException
    error = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:160]}"
dist.barrier()
if rank == 0:
    shutil.rmtree(box[0], ignore_errors=True)
dist.destroy_process_group()
if error is not None:
    print(
        f"DIVERGES rank {rank}: the save of layout (4,) r0:[2,4) r0:[0,2) r1:[0,0) raised "
        f"{error}; the spec says a valid layout saves and loads back arange(4)"
    )
    sys.exit(1)
