"""DCP's _flatten_sharded_tensors drops a ShardedTensor that has no local shard on this rank."""

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
from torch.distributed._shard.sharded_tensor.metadata import (
    ShardedTensorMetadata,
    TensorProperties,
)
from torch.distributed.checkpoint._sharded_tensor_utils import _flatten_sharded_tensors

DEFECT = {
    "id": "checkpoint-flatten-drops-entry-without-local-shard",
    "title": "checkpoint/_sharded_tensor_utils.py _flatten_sharded_tensors drops an entry with "
    "no local shard",
    "area": "checkpoint",
    "rule": "FSDP-8",
    "upstream": None,
    "issue_text": (
        "## DCP `_flatten_sharded_tensors` drops a ShardedTensor that has no local shard on "
        "this rank\n"
        "\n"
        "Run with `torchrun --nproc-per-node 2`:\n"
        "\n"
        "```python\n"
        "import torch, torch.distributed as dist\n"
        "from torch.distributed._shard.metadata import ShardMetadata\n"
        "from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor\n"
        "from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, "
        "TensorProperties\n"
        "from torch.distributed.checkpoint._sharded_tensor_utils import "
        "_flatten_sharded_tensors\n"
        "\n"
        'dist.init_process_group("gloo")\n'
        "rank = dist.get_rank()\n"
        "full = torch.arange(6).reshape(2, 3)\n"
        'md = ShardMetadata([0, 0], [2, 3], "rank:0/cpu")  # rank 0 holds the whole tensor\n'
        "meta = ShardedTensorMetadata([md], full.shape, TensorProperties(dtype=full.dtype))\n"
        "st = ShardedTensor._init_from_local_shards_and_global_metadata(\n"
        "    [Shard(full.clone(), md)] if rank == 0 else [], meta\n"
        ")\n"
        'print(rank, sorted(_flatten_sharded_tensors({"w": st, "step": 7})))\n'
        "# rank 0: ['step', 'w']   rank 1: ['step']\n"
        "```\n"
        "\n"
        '**Expected**: both ranks keep `"w"` (a ShardedTensor with no local shard is left as '
        "it is), so every rank's state dict names the same keys and DCP plans the tensor "
        "from its global metadata on every rank.\n"
        "\n"
        "**Actual**: `rewrite_dict` returns without setting the key when "
        "`value.local_shards()` is empty, so the key disappears on rank 1. With FSDP this is "
        "the common case of a rank past the data (see `_create_chunk_sharded_tensor`, which "
        "gives such a rank no local shard); the same function also raises for an inner "
        "ShardedTensor with no local shard.\n"
        "\n"
        "Versions: torch 2.13.0 (CPU, gloo)"
    ),
    "nproc": 2,
    "torch_does": "a (2, 3) ShardedTensor held whole by rank 0: on rank 1 the flattened state "
    "dict has no key 'w' at all",
    "spec_says": "flattening keeps every entry: a ShardedTensor with no local shard is kept as "
    "it is, so every rank's state dict names the same keys",
    # packages/fsdp/tests/test_hooks_single.py checks it too; no conformance test reaches it yet
    "tests": [
        "test_flatten.py::test_flattening_keeps_every_key_and_states_the_2d_layout",
        "test_checkpoint_collective_load.py::"
        "test_a_rank_holding_no_shard_of_a_tensor_loads_the_values_beside_it",
    ],
}

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
full = torch.arange(6).reshape(2, 3)
md = ShardMetadata(shard_offsets=[0, 0], shard_sizes=[2, 3], placement="rank:0/cpu")
meta = ShardedTensorMetadata([md], full.shape, TensorProperties(dtype=full.dtype))
local = [Shard(full.clone(), md)] if rank == 0 else []  # rank 1 holds nothing of "w"
st = ShardedTensor._init_from_local_shards_and_global_metadata(local, meta)
flat = _flatten_sharded_tensors({"w": st, "step": 7})
print(f"rank {rank}: flattened keys {sorted(flat)}")
bad = "w" not in flat
if bad:
    print(
        f"DIVERGES rank {rank}: _flatten_sharded_tensors returned keys {sorted(flat)}: 'w' "
        "(no local shard here) is gone; the spec says an entry with no local data is kept"
    )
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if bad else 0)
