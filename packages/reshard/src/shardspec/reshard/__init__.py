"""shardspec.reshard: move a sharded tensor from one layout to another.

* :func:`plan` — which piece of which source shard fills each destination shard, and who
  sends it (pure integers, no torch).
* :mod:`shardspec.reshard.reference` — the single-process oracle (materialise, then slice).
* :func:`reshard` / :func:`reshard_state_dict` — the distributed executor (torch.distributed:
  a round is one ``all_to_all_single`` over a flat byte buffer, or on gloo one message a pair
  and one for each large piece, sent from and received into the tensors where they hold it
  contiguously); :func:`release_buffers` frees the buffers it keeps between bounded calls.
* :mod:`shardspec.reshard.frontends` — ShardedTensor and DTensor front ends.

Importing this package does not import torch; the executor imports it when called.
"""

from __future__ import annotations

from .errors import ReshardError
from .executor import release_buffers, reshard, reshard_state_dict
from .planner import Piece, Plan, plan

__all__ = [
    "Piece",
    "Plan",
    "ReshardError",
    "plan",
    "release_buffers",
    "reshard",
    "reshard_state_dict",
]
