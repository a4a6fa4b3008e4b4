"""TorchRec DMP.reshard hangs on gloo: its p2p tags come from salted hash()."""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

DEFECT = {
    "id": "torchrec-reshard-tags-from-salted-hash",
    "title": "TorchRec DistributedModelParallel.reshard never completes on gloo: each rank "
    "tags the same isend/irecv with a different hash() of the table name",
    "area": "torchrec",
    "rule": "TORCHREC-17",
    "upstream": None,
    "issue_text": (
        "## `DistributedModelParallel.reshard` hangs on gloo: p2p tags come from salted "
        "`hash()`\n"
        "\n"
        "`torchrec/distributed/sharding/dynamic_sharding.py` `_generate_tag` builds every "
        "isend/irecv tag as `hash((src_rank, shard_id, local_shard_id, dst_rank, shard_name, "
        "is_optimizer_state)) & MAX_TAG_HASH_VALUE`. `hash()` of a tuple holding a `str` is "
        "salted per process (PYTHONHASHSEED is random by default), so the sender and the "
        "receiver compute different tags for the same message. NCCL ignores tags, so GPU jobs "
        "do not see it; gloo matches them, so on CPU the transfer never completes and "
        "`update_state_dictionaries` waits until the process group times out.\n"
        "\n"
        "Run with `torchrun --nproc-per-node 2` (gloo, CPU, PYTHONHASHSEED unset): a 11x8 "
        "table moved table_wise from rank 1 to rank 0 with `DistributedModelParallel.reshard` "
        "and `output_sharding_plan_delta_single` (this file, "
        "`conformance/repros/torchrec-reshard-tags-from-salted-hash.py`, is the whole "
        "program). It prints the tag each rank computes for the one message, then the "
        "reshard times out.\n"
        "\n"
        "**Expected**: the ranks agree on every tag (a deterministic hash such as "
        "`zlib.crc32` of the encoded fields, or no tag at all), and the table moves.\n"
        "\n"
        "**Actual**: rank 0 and rank 1 compute different tags; with `PYTHONHASHSEED=0` set on "
        "every rank the same reshard completes with the right values.\n"
        "\n"
        "Versions: torch 2.13.0 (CPU, gloo), torchrec 1.8.0, fbgemm-gpu-cpu 1.8.0"
    ),
    "nproc": 2,
    "needs": ["torchrec"],
    "torch_does": "the two ranks compute different tags for the one isend/irecv that moves "
    "table t0 from rank 1 to rank 0, so gloo never matches them and the reshard hangs",
    "spec_says": "resharding a live model to another plan moves every table and leaves the "
    "reference slices on every rank",
    "tests": ["test_torchrec.py::test_torchrec_model_reshard_between_plans_holds_the_reference"],
}

if os.environ.get("PYTHONHASHSEED", "random") != "random" and "REPRO_REEXEC" not in os.environ:
    # Python's default is a fresh salt per process; a seed set for the whole job hides this.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    os.execve(sys.executable, [sys.executable, *sys.argv], {**env, "REPRO_REEXEC": "1"})

try:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding.dynamic_sharding import (
        _generate_tag,
        output_sharding_plan_delta_single,
    )
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
    from torchrec.distributed.types import ShardingEnv, ShardingPlan
except (ImportError, OSError) as e:
    print(f"SKIPPED torchrec does not load ({type(e).__name__}: {e})")
    sys.exit(0)

dist.init_process_group("gloo", timeout=timedelta(seconds=30))
rank = dist.get_rank()


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = torch.nn.Linear(2, 2)
        cfg = EmbeddingBagConfig(name="t0", embedding_dim=8, num_embeddings=11, feature_names=["f"])
        self.ebc = EmbeddingBagCollection(tables=[cfg], device=torch.device("meta"))


def plan_on(r):
    ebc = Model().ebc
    return construct_module_sharding_plan(
        ebc, {"t0": table_wise(rank=r)}, local_size=2, world_size=2, device_type="cpu"
    )


old, new = plan_on(1), plan_on(0)
dmp = DistributedModelParallel(
    Model(),
    env=ShardingEnv.from_process_group(dist.group.WORLD),
    device=torch.device("cpu"),
    plan=ShardingPlan({"ebc": old}),
    sharders=[EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_SGD})],
)


def tables(dmp):  # DMP's .module is the model (unwrapped from DDP in newer TorchRec)
    inner = dmp.module
    return getattr(inner, "module", inner).ebc.state_dict()["embedding_bags.t0.weight"]


weights = torch.arange(88.0).reshape(11, 8)
with torch.no_grad():
    for s in tables(dmp).local_shards():
        s.tensor.copy_(weights)
# the one message: shard 0 of t0 (local shard 0 on rank 1) from rank 1 to rank 0
tags = [None, None]
dist.all_gather_object(tags, _generate_tag(1, 0, 0, 0, "t0", False))
print(f"rank {rank}: tags computed for the one message by rank 0 and rank 1: {tags}")
if tags[0] != tags[1]:
    print(
        f"DIVERGES rank {rank}: the ranks tag the same isend/irecv {tags[1]} (sender) and "
        f"{tags[0]} (receiver): gloo never matches them, so DistributedModelParallel.reshard "
        "waits until the process group times out; the spec says the table moves"
    )
    sys.stdout.flush()
    os._exit(1)  # the reshard itself would wait out the 30 s timeout
dmp.reshard({"ebc": output_sharding_plan_delta_single(old, new, True)}, "ebc")
bad = False
for s in tables(dmp).local_shards():
    if not torch.equal(s.tensor, weights):
        bad = True
        print(f"DIVERGES rank {rank}: t0 moved to rank 0 but does not hold the table's values")
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if bad else 0)
