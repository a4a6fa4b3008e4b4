"""DCP loses a chunk's data when an empty chunk of the same tensor starts at its offset."""

import shutil
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, init_from_local_shards

DEFECT = {
    "id": "dcp-empty-chunk-displaces-data",
    "title": "dcp.save cannot save a ShardedTensor with an empty shard at the offset where "
    "another rank's shard starts: the save's dedup drops the non-empty chunk",
    "area": "checkpoint",
    "rule": "CKPT-1",
    "upstream": None,
    "issue_text": """### dcp.save loses rows when an empty shard starts where another shard starts

DCP keys a saved chunk by `MetadataIndex(fqn, offset)` (`index` takes no part in equality).
`dedup_save_plans` therefore takes a non-empty chunk and an empty chunk at the same offset on
another rank for one replicated chunk and keeps the one in the plan with fewer bytes so far:
here the empty one.
The non-empty chunk is dropped from the plan, and the save fails its own check ("Failed to
validate global plan": 2 of 4 elements covered) although the ShardedTensor is complete. On one
rank the same collision makes `resolve_data` write the empty shard's bytes under the other's
key (the global plan renumbers `index`, and `_find_shard` then matches by offset alone), and
`dcp.load` dies in `read_data` ("mismatch sizes").

```python
# 2 ranks; a ShardedTensor of arange(4): rank 0 holds [2, 4) and [0, 2), rank 1 holds [0, 0)
dcp.save({"t": st}, checkpoint_id=path)  # CheckpointException: Failed to validate global plan
```

Expected: the save succeeds (an empty chunk holds nothing) and a load gives `[0, 1, 2, 3]`.
Empty shards are legal in a ShardedTensor (FSDP1 and TorchRec make them on uneven splits).
torch 2.13.0, CPU, gloo, `torchrun --standalone --nproc-per-node 2`.""",
    "nproc": 2,
    "torch_does": "the save's dedup keeps the empty chunk at offset 0 and drops rows 0-1, then "
    "its own check refuses the plan; on one rank the load dies reading the empty chunk's bytes",
    "spec_says": "every element is saved once: an empty chunk holds nothing and cannot displace "
    "a non-empty chunk at its offset; the load gives [0, 1, 2, 3]",
    "tests": ["test_checkpoint.py::test_a_checkpoint_saved_on_one_world_loads_on_another"],
}

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
full = torch.arange(4)
boxes = [(2, 2), (0, 2)] if rank == 0 else [(0, 0)]  # (offset, length): rank 1's is empty
local = [
    Shard(full[o : o + n].clone(), ShardMetadata([o], [n], f"rank:{rank}/cpu")) for o, n in boxes
]
st = init_from_local_shards(local, 4)
path = [tempfile.mkdtemp() if rank == 0 else None]
dist.broadcast_object_list(path)
out = torch.full((4,), -1)
try:
    dcp.save({"t": st}, checkpoint_id=path[0])
    dcp.load({"t": out}, checkpoint_id=path[0])
    got = f"loads {out.tolist()}"
except BaseException as e:  # DCP raises CheckpointException (a BaseException) on every rank
    got = f"dcp.save raises {type(e).__name__}: {str(e).strip().splitlines()[-1][:160]}"
bad = out.tolist() != full.tolist()
if bad:
    print(
        f"DIVERGES rank {rank}: a valid ShardedTensor of arange(4) {got}; the spec says it "
        "saves, and loads [0, 1, 2, 3]"
    )
dist.barrier()
if rank == 0:
    shutil.rmtree(path[0])
dist.destroy_process_group()
sys.exit(1 if bad else 0)
