"""compute_local_shape_and_global_offset puts nested empty shards at the global dim size."""

import itertools
import json
import sys

from torch.distributed.tensor import Shard
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

DEFECT = {
    "id": "dtensor-nested-empty-shard-offset",
    "title": "compute_local_shape_and_global_offset puts a nested empty shard at the global dim "
    "size, not at the end of its parent",
    "area": "dtensor",
    "rule": "DTENSOR-6",
    "upstream": "pytorch#161368",
    "nproc": 1,
    "torch_does": "5 rows on a 2 x 4 mesh with [Shard(0), Shard(0)]: coordinate (0, 3), an empty "
    "chunk of the parent rows [0, 3), is reported at offset 5",
    "spec_says": "an empty piece sits at the end of the piece it was cut from: (0, 3) at 3, "
    "(1, 2) and (1, 3) at 5",
    "tests": [
        "test_dtensor.py::test_nested_empty_pieces_sit_at_the_end_of_their_parent",
        "test_dtensor.py::test_whole_mesh_nested_empty_pieces_sit_at_the_end_of_their_parent",
    ],
}

# The per-coordinate helper that compute_local_shape_and_global_offset(shape, mesh, placements)
# calls with mesh.shape and the rank's coordinate: one process can ask for every coordinate.
n, mesh = 5, (2, 4)
bad = False
for i, (a, b) in enumerate(itertools.product(range(2), range(4))):
    shape, offset = _compute_local_shape_and_global_offset([n], mesh, [a, b], [Shard(0), Shard(0)])
    parent = [(0, 3), (3, 5)][a]  # chunk a of 2: rows [0, 3) and [3, 5)
    start = min(parent[0] + b * 1, parent[1])  # chunk b of 4 of the parent, ceil(m / 4) = 1
    box = {"rank": i, "shape": [n], "spec": [[[start], [shape[0]]]]}
    print("BOXES", json.dumps({**box, "torch": [[[offset[0]], [shape[0]]]]}))
    if offset[0] != start:
        bad = True
        print(
            f"DIVERGES rank {i}: coordinate ({a}, {b}) holds {shape[0]} rows of parent rows "
            f"[{parent[0]}, {parent[1]}) at offset {offset[0]}; the spec says {start}"
        )
sys.exit(1 if bad else 0)
