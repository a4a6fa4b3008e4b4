"""TorchRec's grid_shard() with fewer hosts than column blocks silently leaves columns unowned."""

import json
import sys

import torch

DEFECT = {
    "id": "torchrec-grid-shard-too-few-hosts",
    "title": "torchrec grid_shard(host_indexes) with fewer hosts than column blocks leaves a gap",
    "area": "torchrec",
    "rule": "TORCHREC-9",
    "upstream": None,
    "issue_text": (
        "## `grid_shard(host_indexes)` with fewer hosts than column blocks leaves columns "
        "without an owner\n"
        "\n"
        "```python\n"
        "import torch\n"
        "from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder\n"
        "from torchrec.distributed.sharding_plan import grid_shard\n"
        "\n"
        'table = torch.nn.Parameter(torch.empty(10, 256, device="meta"))\n'
        "# world 4, local_size 2: two hosts; 256 columns make two column blocks\n"
        'ps = grid_shard(host_indexes=[1])(table, 2, 4, "cpu", '
        "EmbeddingBagCollectionSharder())\n"
        "print([(s.shard_offsets, s.shard_sizes) for s in ps.sharding_spec.shards])\n"
        "# [([0, 0], [5, 128]), ([5, 0], [5, 128])]  -- columns [128, 256) have no owner\n"
        "```\n"
        "\n"
        "**Expected**: a `ValueError`: the table has two column blocks and one host was "
        "given, so block [128, 256) would have no owner.\n"
        "\n"
        "**Actual**: a plan whose shards cover half the table, with no error; the missing "
        "columns are simply never stored.\n"
        "\n"
        "Versions: torch 2.13.0 (CPU), torchrec 1.8.0, fbgemm-gpu-cpu 1.8.0"
    ),
    "nproc": 1,
    "needs": ["torchrec"],
    "torch_does": "grid_shard(host_indexes=[1]) on a (10, 256) table, 2 hosts of 2 ranks: "
    "column block [0, 128) goes to host 1, block [128, 256) to nobody, and no error is raised",
    "spec_says": "exactly one host per column block: a plan with fewer hosts than blocks is "
    "refused (every element of the table must have an owner)",
    "tests": ["test_torchrec.py::test_torchrec_grid_with_too_few_hosts_is_refused"],
}

try:
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.sharding_plan import grid_shard
except (ImportError, OSError) as e:  # OSError: fbgemm-gpu built for another torch
    print(f"SKIPPED torchrec does not load ({type(e).__name__}: {e})")
    sys.exit(0)

table = torch.nn.Parameter(torch.empty(10, 256, device="meta"))
try:  # world 4, local_size 2: two hosts, and the table has two 128-column blocks
    ps = grid_shard(host_indexes=[1])(table, 2, 4, "cpu", EmbeddingBagCollectionSharder())
except Exception as e:  # refused: the rule's answer
    print(f"refused: {type(e).__name__}: {e}")
    sys.exit(0)
shards = ps.sharding_spec.shards
for r in range(4):
    mine = [[s.shard_offsets, s.shard_sizes] for s in shards if s.placement.rank() == r]
    print("BOXES", json.dumps({"rank": r, "shape": [10, 256], "spec": [], "torch": mine}))
covered = sum(s.shard_sizes[0] * s.shard_sizes[1] for s in shards)
if covered != 10 * 256:
    cols = sorted({(s.shard_offsets[1], s.shard_offsets[1] + s.shard_sizes[1]) for s in shards})
    print(
        f"DIVERGES rank 0: grid_shard(host_indexes=[1]) covers {covered} of 2560 elements "
        f"(columns {cols} only, ranks {ps.ranks}) without an error; the spec says a plan with "
        "fewer hosts than column blocks is refused"
    )
    sys.exit(1)
