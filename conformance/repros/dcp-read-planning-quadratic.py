"""DCP read planning compares every saved chunk with every destination chunk."""

import itertools
import math
import sys

import torch
import torch.distributed.checkpoint.planner_helpers as helpers
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    TensorProperties,
    TensorStorageMetadata,
)

DEFECT = {
    "id": "dcp-read-planning-quadratic",
    "title": "DCP create_read_items_for_chunk_list does O(saved x destination) chunk comparisons",
    "area": "checkpoint",
    "rule": "RESHARD-7",
    "kind": "performance",
    "probe": "dcp-read-planning",
    "upstream": "pytorch#169113",
    "nproc": 1,
    "torch_does": "n column chunks loaded as n + 1 column chunks shifted by 2 columns: 2n reads, "
    "but every destination chunk is compared with every saved chunk (n^2 comparisons)",
    "spec_says": "planning costs O((n + m) log(n + m) + k) for n saved, m destination chunks and "
    "k reads",
    "tests": [],
}

calls = 0
pair_check = helpers._check_shard_metadata_pair_overlap


def counting(a: object, b: object) -> bool:
    global calls
    calls += 1
    return pair_check(a, b)


helpers._check_shard_metadata_pair_overlap = counting
counts, reads = {}, {}
for n in (100, 400):  # a (4n, 4n) tensor saved as n column chunks of 4 columns
    size = torch.Size([4 * n, 4 * n])
    saved = [ChunkStorageMetadata(torch.Size([0, 4 * j]), torch.Size([4 * n, 4])) for j in range(n)]
    md = TensorStorageMetadata(TensorProperties(dtype=torch.float32), size, saved)
    cuts = [0, *range(2, 4 * n, 4), 4 * n]  # loaded as n + 1 chunks shifted by 2 columns
    calls, reads[n] = 0, 0
    for a, b in itertools.pairwise(cuts):  # one call per destination rank, as each rank plans
        mine = [ChunkStorageMetadata(torch.Size([0, a]), torch.Size([4 * n, b - a]))]
        reads[n] += len(helpers.create_read_items_for_chunk_list("w", md, mine))
    counts[n] = calls
(n0, c0), (n1, c1) = counts.items()
growth = math.log(c1 / c0) / math.log(n1 / n0)
print(f"reads {reads}, chunk pairs compared {counts}: growth n^{growth:.2f}")
if growth > 1.25:
    print(
        f"DIVERGES: {reads[n1]} reads took {c1} chunk comparisons for n={n1}, growing as "
        f"n^{growth:.2f}; the spec says O((n + m) log(n + m) + k)"
    )
    sys.exit(1)
