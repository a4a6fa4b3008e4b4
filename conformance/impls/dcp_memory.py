"""DCP checkpoints held in memory, for the adapters' checkpoint questions: the storage
metadata of a chunk list, the regions a load plan reads, and ``dcp.load`` through a planner
with no process group and no files."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardspec.metadata import Box

__all__ = ["checkpoint_storage", "load_through_planner", "read_regions"]


def checkpoint_storage(shape: Sequence[int], chunks: Sequence[Box]) -> Any:
    import torch
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        TensorProperties,
        TensorStorageMetadata,
    )

    return TensorStorageMetadata(
        TensorProperties(dtype=torch.float32),
        torch.Size(shape),
        [ChunkStorageMetadata(torch.Size(b.offsets), torch.Size(b.sizes)) for b in chunks],
    )


def read_regions(items: Any) -> list[tuple[int, int, Box]]:
    return [
        (
            it.storage_index.index,
            it.dest_index.index,
            Box(
                [a + b for a, b in zip(it.storage_index.offset, it.storage_offsets)],
                list(it.lengths),
            ),
        )
        for it in items
    ]


def load_through_planner(
    planner: Any, shape: Sequence[int], chunks: Sequence[Box], tensor: Any
) -> tuple[Any, int]:
    """``dcp.load`` (no process group) of tensor ``t`` through ``planner`` from an in-memory
    checkpoint whose chunks are ``chunks``, chunk ``i`` holding ``tensor``'s elements of box
    ``i``, into a tensor of ``shape`` filled with -1: ``(the loaded tensor, or the exception
    the load raised; how many read items reached storage)``. A damaged checkpoint must be
    refused with no read at all."""

    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.metadata import Metadata
    from torch.distributed.checkpoint.storage import StorageReader
    from torch.futures import Future

    md = Metadata({"t": checkpoint_storage(shape, chunks)})
    reads = [0]

    class Memory(StorageReader):  # type: ignore[misc]
        def reset(self, checkpoint_id: Any = None) -> None:
            pass

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            return md

        def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, **kw: Any) -> None:
            pass

        def prepare_local_plan(self, plan: Any) -> Any:
            return plan

        def prepare_global_plan(self, plans: Any) -> Any:
            return plans

        def read_data(self, plan: Any, planner: Any) -> Any:
            for item in plan.items:
                reads[0] += 1
                box = chunks[item.storage_index.index]
                start = [o + s for o, s in zip(box.offsets, item.storage_offsets)]
                src = tensor[tuple(slice(a, a + n) for a, n in zip(start, item.lengths))]
                dst = planner.resolve_tensor(item).detach()
                dst.copy_(src)
                planner.commit_tensor(item, dst)
            done: Any = Future()
            done.set_result(None)
            return done

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
            return True

    target = torch.full(tuple(shape), -1.0, dtype=torch.float32)
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.simplefilter("ignore", UserWarning)
            dcp.load({"t": target}, storage_reader=Memory(), planner=planner, no_dist=True)
    except (Exception, CheckpointException) as e:  # a BaseException: the refusal is the verdict
        return e, reads[0]
    return target, reads[0]
