"""Rank-side functions for :func:`shardspec.reshard.agreement.decide_at_root`."""

from __future__ import annotations

import torch
import torch.distributed as dist

from shardspec.reshard.agreement import Verdict, decide_at_root


def _group(members: list[int] | None) -> dist.ProcessGroup | None:
    return None if members is None else dist.new_group(members)


def run_decide(
    rank: int, world: int, members: list[int] | None, rule: str, width: int
) -> tuple[str | None, int] | None:
    """Every member sends a record naming its global rank; ``rule`` is what group rank 0
    does with them: "join" lists them in the order received, "raise" fails, "long" answers a
    message of ``width`` bytes. Non-members take no part and answer None."""
    group = _group(members)
    if members is not None and rank not in members:
        return None
    record = f"r{rank}".encode().ljust(8, b"\0")

    def join(records: list[bytes]) -> Verdict:
        return Verdict(",".join(r.rstrip(b"\0").decode() for r in records), -len(records))

    def fail(records: list[bytes]) -> Verdict:
        return Verdict(None, 1 // (len(records) - len(records)))

    def long(records: list[bytes]) -> Verdict:
        return Verdict("x" * (width - 1) + "é", 2**40)

    rules = {"join": join, "raise": fail, "long": long}
    v = decide_at_root(record, group, torch.device("cpu"), rules[rule])
    return v.error, v.value
