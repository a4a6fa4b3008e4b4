"""ChunkShardingSpec.build_metadata puts empty chunks past the end (check_tensor refuses them)."""

import json
import sys

import torch
from torch.distributed._shard.sharded_tensor.metadata import TensorProperties
from torch.distributed._shard.sharding_spec import ChunkShardingSpec
from torch.distributed._shard.sharding_spec._internals import check_tensor

DEFECT = {
    "id": "chunk-spec-empty-chunk-past-end",
    "title": "ChunkShardingSpec.build_metadata puts empty chunks at split * i, past the end",
    "area": "chunk",
    "rule": "CHUNK-2",
    "upstream": "pytorch PR #121002",
    "nproc": 1,
    "torch_does": "5 rows over 4 ranks: rank 3's empty chunk is stated at offset 6, which "
    "check_tensor on the same metadata rejects",
    "spec_says": "an empty chunk sits at offset n, the size of the chunked dim: rank 3 at 5",
    "tests": ["test_chunk.py::test_chunk_spec_puts_empty_chunks_at_n"],
}

rows = torch.arange(5)  # row i holds the value i
spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(4)])
mds = spec.build_metadata(rows.shape, TensorProperties()).shards_metadata
pieces = list(rows.chunk(4))  # torch.chunk gives 3 pieces; rank 3 holds nothing
pieces += [rows[5:]] * (4 - len(pieces))
bad = False
for r, (md, piece) in enumerate(zip(mds, pieces)):
    start = piece[0].item() if len(piece) else len(rows)  # CHUNK-2: empty at n
    box = {"rank": r, "shape": [5], "spec": [[[start], [len(piece)]]]}
    print("BOXES", json.dumps({**box, "torch": [[md.shard_offsets, md.shard_sizes]]}))
    if md.shard_offsets[0] != start:
        bad = True
        print(
            f"DIVERGES rank {r}: build_metadata puts its {md.shard_sizes[0]}-row chunk (values "
            f"{piece.tolist()}) at offset {md.shard_offsets[0]} of a dim of 5; the spec says "
            f"offset {start}"
        )
try:
    check_tensor(mds, list(rows.shape))
except ValueError as e:
    print(f"DIVERGES rank 3: torch's own check_tensor rejects that metadata: {e}")
    bad = True
sys.exit(1 if bad else 0)
