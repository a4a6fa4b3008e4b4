"""DTensors on meshes of part of the load's group (CKPT-23): FSDP2 + TP's modules outside the
TP plan (sharded on the DP mesh of each TP coordinate), HSDP's shard groups, any mesh built
from some of the ranks. A rank sees only its own mesh, so the destination layout of the whole
group (the meshes side by side, replicas of one another) is put together from what the ranks
report: per tensor, each rank the first rank of its mesh and its layout's fingerprint, and
that first rank the layout itself. Every rank receives the same reports and builds the same
layouts, or raises the same error."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from shardspec.metadata import Layout
from shardspec.metadata.serialize import layout_from_json, layout_to_json
from shardspec.reshard.agreement import all_gather_sized

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

__all__ = ["whole_layouts"]


def whole_layouts(
    parts: Sequence[tuple[str, Layout]],
    rank: int,
    group: dist.ProcessGroup | None,
    comm: torch.device,
) -> list[Layout]:
    """For each ``(key, layout of this rank's mesh, in group ranks)``, in the same order on
    every rank, the layout of every mesh the group's ranks hold it on. A collective of the
    group that every rank joins, whatever it raises afterwards; raises ``ValueError`` (the
    same on every rank) when ranks of one mesh report it differently or two meshes share a
    rank."""
    try:
        report = []
        for key, layout in parts:
            lead = min(layout.ranks)
            text = layout_to_json(layout) if lead == rank else None
            report.append([key, lead, layout.fingerprint().hex(), text])
        payload = json.dumps({"report": report}).encode()
    except Exception as e:  # said in the reports, so that every rank raises it
        payload = json.dumps({"error": f"{type(e).__name__}: {e}"}).encode()
    reports = [json.loads(p) for p in all_gather_sized(payload, group, comm)]
    failed = [f"rank {r}: {p['error']}" for r, p in enumerate(reports) if "error" in p]
    if failed:
        raise ValueError("a DTensor's mesh could not be reported: " + "; ".join(failed))
    return [_whole(i, key, [p["report"] for p in reports]) for i, (key, _) in enumerate(parts)]


def _whole(i: int, key: str, reports: list[list[list[object]]]) -> Layout:
    meshes: dict[int, Layout] = {}
    for r, report in enumerate(reports):
        if len(report) <= i or report[i][0] != key:
            raise ValueError(f"'{key}': rank {r} holds no DTensor of it on part of the group")
        _, lead, _, text = report[i]
        if text is not None:
            assert isinstance(lead, int) and isinstance(text, str)
            meshes[lead] = layout_from_json(text)
    for r, report in enumerate(reports):
        _, lead, fingerprint, _ = report[i]
        mesh = meshes.get(lead) if isinstance(lead, int) else None
        if mesh is None:
            raise ValueError(
                f"'{key}': rank {r}'s DTensor is on a mesh led by rank {lead}, which holds it "
                "on no such mesh"
            )
        if mesh.fingerprint().hex() != fingerprint:
            raise ValueError(
                f"'{key}': ranks {r} and {lead} hold it on one mesh with other placements; "
                "every rank of a mesh must pass the same mesh and placements"
            )
    owner: dict[int, int] = {}
    for lead, mesh in sorted(meshes.items()):
        for r in mesh.ranks:
            other = owner.setdefault(r, lead)
            if other != lead:
                raise ValueError(
                    f"'{key}': rank {r} is in two of its meshes (led by ranks {other} and "
                    f"{lead}); the meshes a DTensor is on must not share ranks"
                )
    first = next(iter(meshes.values()))
    return Layout(first.shape, [s for _, mesh in sorted(meshes.items()) for s in mesh.shards])
