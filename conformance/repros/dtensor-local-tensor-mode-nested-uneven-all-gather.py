"""LocalTensorMode fails an uneven nested all-gather that 8 real gloo ranks get right.

One process: ``python FILE`` (or ``torchrun --nproc-per-node 1 FILE``) runs every rank of a
2 x 2 x 2 mesh under LocalTensorMode on the fake process group. The control, the same move on
8 gloo ranks, exits 0: ``torchrun --standalone --nproc-per-node 8 FILE``.
"""

import contextlib
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

DEFECT = {
    "id": "dtensor-local-tensor-mode-nested-uneven-all-gather",
    "title": "under LocalTensorMode, redistribute [Shard(1), Shard(1), Shard(0)] -> "
    "[Shard(1), Replicate(), Shard(0)] of a (1, 5) tensor on a 2 x 2 x 2 mesh raises; real "
    "gloo ranks hold the right pieces",
    "area": "dtensor",
    "rule": "CONF-1",
    "upstream": None,
    "issue_text": """### LocalTensorMode pads short splits with rank 0's shape; DTensor gathers fail

Under `LocalTensorMode`, `aten.split.Tensor` runs once per rank, and a rank that gets fewer
pieces (its split dim is 0) is padded with empty tensors made by `_zero_sized_like` from the
**first rank's** input (`_for_each_rank_run_func` builds `default_value` once), so a padding
piece has rank 0's sizes on every other dim:

```python
x = LocalTensor({0: torch.zeros(2, 2), 1: torch.zeros(0, 1)})
with LocalTensorMode(frozenset({0, 1})):
    pieces = torch.chunk(x, 2, dim=0)
# rank 1's pieces: (0, 1) and (0, 2); torch.chunk(torch.zeros(0, 1), 2) gives (0, 1), (0, 1)
```

`funcol.all_gather_single(t, gather_dim=1, ...)` undoes the dim-0 gather with
`torch.cat(torch.chunk(res, group_size, 0), dim=1)`, so an all-gather along a dim other than 0
gives a wrong size on ranks whose pieces have no rows while rank 0's have some, and a
different size along the gather dim. DTensor hits that with nested uneven shards: a (1, 5)
tensor on a 2 x 2 x 2 mesh, `[Shard(1), Shard(1), Shard(0)] -> [Shard(1), Replicate(),
Shard(0)]` (one all-gather on mesh dim 1; ranks with mesh-dim-2 coordinate 1 hold no row, and
mesh dim 0 leaves 3 or 2 columns), raised by `Shard._maybe_unpad_tensor`:

```
RuntimeError: narrow unexpectedly changed concrete size on dim 1: 3 -> 2
```

Expected (and what 8 gloo ranks under torchrun hold): rank 4i + 2j + k holds row k (none for
k = 1) of columns [0, 3) for i = 0, [3, 5) for i = 1. A 2-D mesh cannot meet the condition
(the rows and the padded gather size would need two other mesh dims), so 8 ranks is the
smallest world; `[Shard(1)] * 3 -> [Replicate(), Replicate(), Shard(0)]` fails the same way.
LocalTensorMode is how upstream runs many ranks in one process (`torch.distributed.tensor._ops.
strategy_validation` runs every sharding under it, though on a 1-D mesh in 2.13, which this case
cannot reach), so a nested-shard test there fails where real ranks pass. A fix: build each
rank's padding from that rank's own input.

torch 2.13.0 (CPU), one process: `python this_file.py`; the control:
`torchrun --standalone --nproc-per-node 8 this_file.py`.""",
    "nproc": 1,
    "torch_does": "LocalTensorMode's split pads a rank whose pieces have no rows with empties "
    "shaped like rank 0's, so the all-gather on mesh dim 1 gives ranks 5 and 7 three columns "
    "instead of two and redistribute raises in Shard._maybe_unpad_tensor",
    "spec_says": "rank 4i + 2j + k holds row k (none for k = 1) of columns [0, 3) (i = 0) or "
    "[3, 5) (i = 1): rank 0 [[0, 1, 2]], rank 4 [[3, 4]], odd ranks none",
    "tests": [
        "test_dtensor_moves.py::test_redistribute_on_every_rank_of_a_large_mesh_holds_the_oracles_pieces"
    ],
}


def show(t):  # an empty piece keeps its shape: torch's wrong one has 3 columns, not 2
    return t.tolist() if t.numel() else f"no element, shape {tuple(t.shape)}"


full = torch.arange(5.0).reshape(1, 5)  # column c holds c
src, dst = [Shard(1), Shard(1), Shard(0)], [Shard(1), Replicate(), Shard(0)]
world = int(os.environ.get("WORLD_SIZE", "1"))
if world == 1:  # every rank in this one process
    from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", world_size=8, rank=0, store=FakeStore())
    mode, ranks = LocalTensorMode(frozenset(range(8))), list(range(8))
    x = LocalTensor({r: torch.zeros(2, 2) if r == 0 else torch.zeros(0, 1) for r in ranks})
    with mode:
        pieces = torch.chunk(x, 2, dim=0)
    shapes = [tuple(p._local_tensors[1].shape) for p in pieces]
    print(f"cause: torch.chunk under the mode gives rank 1 (0, 1) pieces of shapes {shapes}")
else:  # the control: 8 real gloo ranks
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    mode, ranks = contextlib.nullcontext(), [dist.get_rank()]
try:
    with mode:
        mesh = init_device_mesh("cpu", (2, 2, 2))
        out = distribute_tensor(full, mesh, src).redistribute(mesh, dst).to_local()
    got = {r: out._local_tensors[r] if world == 1 else out for r in ranks}
except RuntimeError as e:
    got = {r: f"{type(e).__name__}: {str(e).splitlines()[0]}" for r in ranks}
bad = False
for r in ranks:
    want = full[r % 2 :, 3 * (r // 4) : 3 + 2 * (r // 4)]  # row k of column chunk i
    if isinstance(got[r], str) or not torch.equal(got[r], want):  # sizes too
        bad = True
        shown = got[r] if isinstance(got[r], str) else show(got[r])
        print(f"DIVERGES rank {r}: redistribute gives {shown}; the spec says {show(want)}")
dist.destroy_process_group()
sys.exit(1 if bad else 0)
