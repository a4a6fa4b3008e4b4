"""TorchRec's row_wise() plan helper divides by zero on a table with no rows."""

import json
import sys

import torch

DEFECT = {
    "id": "torchrec-row-wise-empty-table",
    "title": "torchrec row_wise() raises ZeroDivisionError on a table with 0 rows",
    "area": "torchrec",
    "rule": "TORCHREC-3",
    "upstream": None,
    "issue_text": (
        "## `row_wise()` raises ZeroDivisionError for a table with 0 rows\n"
        "\n"
        "```python\n"
        "import torch\n"
        "from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder\n"
        "from torchrec.distributed.sharding_plan import row_wise\n"
        "\n"
        'table = torch.nn.Parameter(torch.empty(0, 4, device="meta"))\n'
        'row_wise()(table, 2, 2, "cpu", EmbeddingBagCollectionSharder())\n'
        "# ZeroDivisionError in _calculate_rw_shard_sizes_and_offsets: last_rank = hash_size "
        "// block_size\n"
        "```\n"
        "\n"
        "**Expected**: a plan in which every rank holds the empty block of rows (shard `[0, "
        "0]` + `[0, 4]` on ranks 0 and 1), as `torch.chunk` would give; at the least a "
        "`ValueError` naming the table and its 0 rows (torchrec PRs #3263 and #3922 add "
        "context to ZeroDivisionErrors in the planner's enumerator and storage estimator, "
        "not in this helper).\n"
        "\n"
        "**Actual**: `ZeroDivisionError: integer division or modulo by zero` (block size "
        "`ceil(0 / 2) = 0`).\n"
        "\n"
        "Versions: torch 2.13.0 (CPU), torchrec 1.8.0, fbgemm-gpu-cpu 1.8.0"
    ),
    "nproc": 1,
    "needs": ["torchrec"],
    "torch_does": "row_wise() on a (0, 4) table over 2 ranks raises ZeroDivisionError in "
    "_calculate_rw_shard_sizes_and_offsets (block size 0)",
    "spec_says": "row_wise chunks the rows by the torch.chunk rule: both ranks hold the empty "
    "box at offset (0, 0) of size (0, 4)",
    "tests": ["test_torchrec.py::test_torchrec_row_wise_of_a_table_with_no_rows"],
}

try:
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.sharding_plan import row_wise
except (ImportError, OSError) as e:  # OSError: fbgemm-gpu built for another torch
    print(f"SKIPPED torchrec does not load ({type(e).__name__}: {e})")
    sys.exit(0)

table = torch.nn.Parameter(torch.empty(0, 4, device="meta"))  # a table with no rows yet
spec = [[[0, 0], [0, 4]]]
try:
    ps = row_wise()(table, 2, 2, "cpu", EmbeddingBagCollectionSharder())
except Exception as e:  # ZeroDivisionError today; any refusal still breaks the rule
    for r in range(2):
        print("BOXES", json.dumps({"rank": r, "shape": [0, 4], "spec": spec, "torch": []}))
    print(
        f"DIVERGES rank 0: row_wise() on a (0, 4) table over 2 ranks raises "
        f"{type(e).__name__} ({e}); the spec says each rank holds the empty box (0, 0)+(0, 4)"
    )
    sys.exit(1)
got = sorted((s.placement.rank(), s.shard_offsets, s.shard_sizes) for s in ps.sharding_spec.shards)
if got != [(r, [0, 0], [0, 4]) for r in range(2)]:
    print(f"DIVERGES rank 0: row_wise() gave {got}; the spec says (0, 0)+(0, 4) on ranks 0, 1")
    sys.exit(1)
