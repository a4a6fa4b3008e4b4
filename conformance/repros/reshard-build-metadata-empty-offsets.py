"""build_reshard_metadata's chunk offsets, empty chunks included, against the chunk rule."""

import itertools
import sys

import torch
from torch.distributed._shard.sharded_tensor.reshard import build_reshard_metadata
from torch.distributed._shard.sharding_spec import ChunkShardingSpec

DEFECT = {
    "id": "reshard-build-metadata-empty-offsets",
    "title": "build_reshard_metadata accumulates chunk sizes into offsets: empty chunks must "
    "land at n, the size of the chunked dim (checked)",
    "area": "reshard",
    "rule": "CHUNK-2",
    "upstream": None,
    "issue_text": (
        "Checked, not reproduced: `build_reshard_metadata` "
        "(`torch/distributed/_shard/sharded_tensor/reshard.py`) sums the chunk sizes into its "
        "offsets, so an empty chunk lands at n, where the chunk rule puts it. Kept so that "
        "every release is checked; nothing to file while it holds."
    ),
    "checked": "not reproduced on torch 2.13.0 (CPU): 1-D and 2-D shapes up to 8, every dim, "
    "1-5 ranks and every rank order up to 4 ranks put every chunk where the chunk rule does",
    "nproc": 1,
    "torch_does": "the design notes list its running sums among four ways torch places empty "
    "chunks (a dim of 5 over 4 ranks: the empty chunk at 5)",
    "spec_says": "chunk i of n over k ranks is [min(i*s, n), min((i+1)*s, n)) with "
    "s = ceil(n/k), so an empty chunk sits at n",
}


def chunk_rule(n, k):  # (offset, size) of each chunk, by hand from the rule
    s = -(-n // k)
    return [(min(i * s, n), min((i + 1) * s, n) - min(i * s, n)) for i in range(k)]


bad = []
for shape in [(n,) for n in range(9)] + [(n, m) for n in range(6) for m in range(1, 4)]:
    for dim, k in itertools.product(range(len(shape)), range(1, 6)):
        orders = itertools.permutations(range(k)) if k <= 4 else [tuple(range(k))]
        for order in orders:
            spec = ChunkShardingSpec(dim=dim, placements=[f"rank:{r}/cpu" for r in order])
            metas, _ = build_reshard_metadata(torch.Size(shape), spec, k)
            want = chunk_rule(shape[dim], k)
            for i, r in enumerate(order):
                got = (metas[r].shard_offsets[dim], metas[r].shard_sizes[dim])
                if got != want[i]:
                    bad.append(
                        f"shape {shape} dim {dim} ranks {list(order)}: chunk {i} at "
                        f"{list(got)}, the rule says {list(want[i])}"
                    )
if bad:
    print(
        f"DIVERGES rank 0: build_reshard_metadata placed {len(bad)} chunk(s) off the chunk "
        f"rule, first {bad[0]}"
    )
    sys.exit(1)
print("every chunk where the chunk rule puts it")
