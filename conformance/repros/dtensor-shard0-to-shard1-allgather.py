"""DTensor Shard(0) -> Shard(1) on CPU gathers the whole tensor on every rank."""

import json
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

DEFECT = {
    "id": "dtensor-shard0-to-shard1-allgather",
    "title": "DTensor redistribute Shard(0) -> Shard(1) on CPU all-gathers the global tensor",
    "area": "reshard",
    "rule": "RESHARD-2",
    "kind": "performance",
    "upstream": "pytorch#132751",
    "nproc": 2,
    "torch_does": "an all-gather of the whole tensor to every rank, then a local chunk: each rank "
    "receives (W-1)/W of the global tensor and peaks at its full size",
    "spec_says": "each element crosses between ranks at most once, only to a rank that holds it "
    "in the destination (one all_to_all_single moves 1/W of it per rank)",
    "tests": [],
}

dist.init_process_group("gloo", timeout=timedelta(seconds=120))
rank, world = dist.get_rank(), dist.get_world_size()
n = 1024 * world  # a (n, n) float32 tensor: 4 MiB per rank
full = torch.arange(n * n, dtype=torch.float32).reshape(n, n)
src = distribute_tensor(full, init_device_mesh("cpu", (world,)), [Shard(0)])
with CommDebugMode() as comms:
    out = src.redistribute(src.device_mesh, [Shard(1)]).to_local()
ops = sorted(str(op).split(".")[-1] for op in comms.get_comm_counts())
assert torch.equal(out, full.chunk(world, 1)[rank]), "wrong values"


def one_all_to_all() -> torch.Tensor:  # the same move as one collective
    send = torch.cat([c.contiguous().flatten() for c in src.to_local().chunk(world, 1)])
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    rows = recv.view(world, n // world, n // world)
    return torch.cat(list(rows), 0)


def best(fn) -> float:
    times = []
    for _ in range(3):
        dist.barrier()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


assert torch.equal(one_all_to_all(), out), "the baseline moved the wrong values"
theirs = best(lambda: src.redistribute(src.device_mesh, [Shard(1)]).to_local())
ours = best(one_all_to_all)
print("PERF", json.dumps({"rank": rank, "collectives": ops, "torch_s": theirs, "a2a_s": ours}))
bad = any("all_gather" in op for op in ops)
if bad:
    print(
        f"DIVERGES rank {rank}: redistribute ran {ops}, receiving {(world - 1) / world:.0%} of the "
        f"global tensor; one all_to_all_single does the move {theirs / ours:.1f}x faster here"
    )
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if bad else 0)
