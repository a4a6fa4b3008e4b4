"""LocalShardsWrapper handles 8 ops: loading into it or stepping an optimizer on it raises."""

import sys

import torch
from torch.distributed.tensor._shards_wrapper import LocalShardsWrapper

DEFECT = {
    "id": "torchrec-wrapper-handles-few-ops",
    "title": "LocalShardsWrapper handles 8 ops: zeros_like, copy_, mul_ and the other ops of a "
    "checkpoint load or an optimizer step raise NotImplementedError",
    "area": "torchrec",
    "rule": "TORCHREC-14",
    "upstream": None,
    "issue_text": (
        "## `LocalShardsWrapper` cannot be loaded into or stepped by an optimizer\n"
        "\n"
        "`torch/distributed/tensor/_shards_wrapper.py` dispatches 8 ops (`_to_copy`, `view`, "
        "`equal`, `detach`, `clone`, `new_empty` and the all-gather pair); every other op "
        "raises. A checkpoint load copies into the wrapper (`copy_`) and an optimizer builds "
        "its state with `zeros_like` and updates it with `mul_`, `add_`, `addcmul_`, so "
        "neither works on a wrapper parameter.\n"
        "\n"
        "```python\n"
        "import torch\n"
        "from torch.distributed.tensor._shards_wrapper import LocalShardsWrapper\n"
        "\n"
        "w = LocalShardsWrapper([torch.ones(2, 4), torch.ones(2, 3)], [(0, 0), (0, 4)])\n"
        "torch.zeros_like(w)  # NotImplementedError: aten.zeros_like.default is not supported\n"
        "```\n"
        "\n"
        "**Expected**: elementwise ops run shard by shard (operands that are wrappers must "
        "hold the same boxes; plain operands 0-d), and anything else raises naming the op.\n"
        "\n"
        "**Actual**: `NotImplementedError` for `zeros_like`, `copy_`, `mul_`, `add_`, "
        "`addcmul_`, `zero_`, `fill_`.\n"
        "\n"
        "Versions: torch 2.13.0 (CPU)"
    ),
    "nproc": 1,
    "torch_does": "a wrapper of two column blocks: zeros_like, copy_, mul_, add_, addcmul_, "
    "zero_ and fill_ each raise NotImplementedError",
    "spec_says": "elementwise ops run shard by shard, so a checkpoint load and an optimizer "
    "step work on a wrapper parameter exactly as on the plain tensor",
    "tests": ["test_torchrec.py::test_wrapper_runs_load_and_optimizer_ops_shard_by_shard"],
}


def blocks(first):  # a 2x7 table in two column blocks; element (i, j) holds first + 7 * i + j
    table = torch.arange(14.0).reshape(2, 7) + first
    return [table[:, :4].clone(), table[:, 4:].clone()]


def wrapper(first):
    return LocalShardsWrapper(blocks(first), [(0, 0), (0, 4)])


ops = {  # each op on the wrapper, and on one plain block (the spec's result for that block)
    "zeros_like": lambda w, o: torch.zeros_like(w),
    "copy_": lambda w, o: w.copy_(o),
    "mul_": lambda w, o: w.mul_(3.0),
    "add_": lambda w, o: w.add_(o),
    "addcmul_": lambda w, o: w.addcmul_(o, o, value=0.5),
    "zero_": lambda w, o: w.zero_(),
    "fill_": lambda w, o: w.fill_(2.0),
}
failed = []
for name, op in ops.items():
    try:
        got = op(wrapper(0), wrapper(100)).local_shards()
    except NotImplementedError as e:
        failed.append(f"{name} ({str(e).splitlines()[0]})")
        continue
    want = [op(a, b) for a, b in zip(blocks(0), blocks(100))]
    if len(got) != 2 or not all(torch.equal(a, b) for a, b in zip(got, want)):
        failed.append(f"{name} (wrong values: {[t.tolist() for t in got]})")
if failed:
    print(
        f"DIVERGES rank 0: LocalShardsWrapper failed {len(failed)} of {len(ops)} ops a "
        f"checkpoint load or an optimizer applies: {'; '.join(failed)}; the "
        "spec says elementwise ops run shard by shard"
    )
    sys.exit(1)
print("every op ran")
