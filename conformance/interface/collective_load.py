"""The collective_load area: the collective load of DCP and safetensors checkpoints (CKPT-22 to
CKPT-28).

Its tests: ``conformance/tests/test_checkpoint_collective_load.py``. An adapter takes part by
subclassing :class:`CollectiveLoad` (with its other areas); a method it does not override
answers :class:`~conformance.interface.Unsupported`.
"""

from __future__ import annotations

from typing import Any

from conformance.faults.damage import damage as damage_checkpoint
from conformance.interface.base import Adapter, dtype_name, ones_of
from shardspec.metadata import Layout


class CollectiveLoad(Adapter):
    """The collective load of DCP and safetensors checkpoints (CKPT-22 to CKPT-28)."""

    area = "collective_load"

    def checkpoint_collective_load(
        self,
        save_pool: Any,
        load_pool: Any,
        saved: Layout,
        tensor: Any,
        load: dict[str, Any],
        reads: str,
        damage: str | None,
        example: str,
        storage: str | None = None,
        copies: int = 0,
        max_buffer_bytes: int | None = None,
        thread_count: int | None = None,
    ) -> list[Any]:
        """A real ``dcp.save`` on ``save_pool``'s ranks of ``{"t": ShardedTensor of saved's
        boxes of tensor, "v": {"n": 7}, "w": 5}`` (with ``copies`` k, also ``"t1"`` ..
        ``"tk"``: the same of ``tensor_copy(tensor, j)``, loaded into the same kind of
        destination as ``t``, their local tensors after ``t``'s in that order); then, when
        ``damage`` says so, the file holding the largest chunk of ``t`` is cut short
        (``truncate``), removed (``remove``), the ``.metadata`` replaced by junk
        (``metadata``), or the chunk list of ``t`` in it made to leave a gap (``gap``: the
        largest chunk left out) or to overlap (``overlap``: a chunk that stops short of the
        tensor's end in some dim moved one element along it, its stored bytes found at its
        new offset; a gap when no chunk can move), each chunk left finding bytes of its
        size, or a field of ``t``'s first non-empty chunk made one no DCP writer writes
        (``outside``: its storage entry's file named through ``../<folder>/``, the same
        file; ``floats``: its offsets a list of floats); then the implementation's
        collective load (CKPT-23 to CKPT-27) on
        ``load_pool``'s ranks into ``{"t": load, "v": {"n": 0}, "w": 0}`` (``load`` as in
        :meth:`checkpoint_round_trip`, or ``{"kind": "plain"}``: a plain tensor on every rank,
        with ``"parameter": True`` an ``nn.Parameter`` of one, as ``named_parameters()`` gives)
        with ``reads`` (and ``storage``, what ``reads="auto"`` is told of the storage, when not
        None: CKPT-25; ``max_buffer_bytes`` and ``thread_count``, the load's bound on its
        exchange buffers and its reading threads, when the implementation has them). Per load
        rank a RankResult whose value holds ``error`` (what the rank
        raised, or None), ``value`` (``{"v": ..., "w": ...}`` as loaded), ``stats``
        (``reads``, ``data_bytes``, ``value_bytes``, ``ranges``: (file, start, stop) of each
        byte range read, or None when the implementation does not say) and whose tensors are
        its local tensors after the load."""
        options = {"max_buffer_bytes": max_buffer_bytes, "thread_count": thread_count}
        return self._collective_load(
            "collective load", save_pool, load_pool, None, saved, tensor, load, reads, damage,
            example, storage, copies, {k: v for k, v in options.items() if v is not None},
        )  # fmt: skip

    def checkpoint_collective_load_disagreeing(
        self,
        save_pool: Any,
        load_pool: Any,
        saved: Layout,
        tensor: Any,
        load: dict[str, Any],
        reads: str,
        max_buffer_bytes: int | None,
        odd: dict[str, Any],
        example: str,
    ) -> list[Any]:
        """:meth:`checkpoint_collective_load` (no damage, no copies) where the load's rank
        ``odd["rank"]`` alone passes another read mode (``odd["reads"]``) or buffer bound
        (``odd["max_buffer_bytes"]``) than the others' ``reads`` and ``max_buffer_bytes``, or
        leaves the value ``odd["drop"]`` (``"v"`` or ``"w"``) out of its state dict (CKPT-26:
        the ranks disagree). A RankResult per load rank as there (``value`` without the key
        dropped)."""
        if self.via != "shardspec":
            raise self.unsupported(
                "ranks that disagree on a collective load: dcp.load has no read modes and no "
                "buffer bound, and lets each rank load its own keys"
            )
        options: dict[str, Any] = {"odd": odd}
        if max_buffer_bytes is not None:
            options["max_buffer_bytes"] = max_buffer_bytes
        return self._collective_load(
            "collective load with a rank that disagrees", save_pool, load_pool, None, saved,
            tensor, load, reads, None, example, None, 0, options,
        )  # fmt: skip

    def checkpoint_collective_load_on(
        self,
        save_pool: Any,
        load_pool: Any,
        members: list[int],
        saved: Layout,
        tensor: Any,
        load: dict[str, Any],
        reads: str,
        damage: str | None,
        example: str,
        storage: str | None = None,
        copies: int = 0,
    ) -> list[Any]:
        """:meth:`checkpoint_collective_load` with the load on the process group of
        ``members`` (``load_pool``'s ranks, ascending) alone: ``load``'s layout ranks and
        mesh are that group's (``members[i]`` is its rank i, and the mesh is laid over the
        members in that order), and the pool's other ranks take no part. A RankResult per
        pool rank; a non-member's value has ``error``, ``value`` and ``stats`` None, and it
        has no tensors."""
        return self._collective_load(
            "collective load on a subgroup", save_pool, load_pool, members, saved, tensor,
            load, reads, damage, example, storage, copies, {},
        )  # fmt: skip

    def _collective_load(
        self,
        what: str,
        save_pool: Any,
        load_pool: Any,
        members: list[int] | None,
        saved: Layout,
        tensor: Any,
        load: dict[str, Any],
        reads: str,
        damage: str | None,
        example: str,
        storage: str | None,
        copies: int,
        options: dict[str, Any],
    ) -> list[Any]:
        import tempfile

        if self.via is None:
            raise self.unsupported(what)
        group = list(range(load_pool.world_size)) if members is None else members
        with tempfile.TemporaryDirectory(prefix="shardspec-cload-") as path:
            values = {"v": {"n": 7}, "w": 5}
            self._dcp_save(save_pool, path, saved, tensor, example, copies, values=values)
            if damage is not None:
                damage_checkpoint(path, damage)
            load_args = {**load, "path": path, "dtype": dtype_name(tensor), "fill": 1,
                         "reads": reads, "shape": list(tensor.shape), **options}  # fmt: skip
            if members is not None:
                load_args["members"] = members
            if storage is not None:
                load_args["storage"] = storage
            if copies:
                load_args["copies"] = copies
            ones = ones_of(load, tensor, len(group))
            per_rank = [
                ones[group.index(r)] * (copies + 1) if r in group else []
                for r in range(load_pool.world_size)
            ]
            return self._run_via(  # type: ignore[no-any-return]
                what, load_pool, "checkpoint.collective_load", load_args,
                per_rank_tensors=per_rank, example=example, taking_part=len(group),
            )  # fmt: skip

    def checkpoint_safetensors_load(
        self, load_pool: Any, tensor: Any, files: int, load: dict[str, Any], reads: str,
        example: str,
    ) -> list[Any]:  # fmt: skip
        """A Hugging Face checkpoint of ``{"t": tensor}`` written by ``safetensors``'
        ``save_file`` beside other tensors (``files`` shards with their index JSON), loaded
        by the implementation's collective load (CKPT-22, CKPT-23) on ``load_pool``'s ranks
        into ``load`` as :meth:`checkpoint_collective_load` does (no values)."""
        import json
        import tempfile

        if self.via is None:
            raise self.unsupported("a collective load of a safetensors checkpoint")
        import torch
        from safetensors.torch import save_file

        with tempfile.TemporaryDirectory(prefix="shardspec-hf-") as path:
            others = {f"layers.{i}.w": torch.full((i + 1, 3), i, dtype=tensor.dtype)
                      for i in range(2 * files - 1)}  # fmt: skip
            names = sorted(others) + ["t"]
            tensors = {**others, "t": tensor.contiguous()}
            weight_map = {}
            for k in range(files):
                fname = f"model-{k + 1:05d}-of-{files:05d}.safetensors"
                part = names[k::files]
                save_file({n: tensors[n] for n in part}, f"{path}/{fname}")
                weight_map.update(dict.fromkeys(part, fname))
            with open(f"{path}/model.safetensors.index.json", "w", encoding="utf-8") as f:
                json.dump({"metadata": {}, "weight_map": weight_map}, f)
            args = {**load, "path": path, "dtype": dtype_name(tensor), "fill": 1,
                    "reads": reads, "shape": list(tensor.shape), "safetensors": True}  # fmt: skip
            return self._run_via(  # type: ignore[no-any-return]
                "safetensors load", load_pool, "checkpoint.collective_load", args,
                per_rank_tensors=ones_of(load, tensor, load_pool.world_size), example=example,
            )  # fmt: skip

    def checkpoint_hf_sharded_load(
        self, save_pool: Any, load_pool: Any, saved: Layout, tensor: Any, load: dict[str, Any],
        reads: str, damage: str | None, example: str,
    ) -> list[Any]:  # fmt: skip
        """DCP's Hugging Face format (CKPT-28): ``{"t": ShardedTensor of saved's boxes of
        tensor}`` (torch's writer keeps one chunk of a tensor a rank)
        saved on ``save_pool``'s ranks by torch's ``HuggingFaceStorageWriter`` with
        ``save_distributed``, a safetensors file a rank placing its chunk in
        ``__metadata__``; then, when ``damage`` says so, the file holding the chunk at the
        tensor's origin removed (``remove``) or cut short (``truncate``); then the
        implementation's collective load on ``load_pool``'s ranks into ``{"t": load}`` with
        ``reads``, answered as :meth:`checkpoint_collective_load` answers."""
        import tempfile
        from pathlib import Path

        if self.via is None:
            raise self.unsupported("a collective load of DCP's Hugging Face format")
        with tempfile.TemporaryDirectory(prefix="shardspec-hfdcp-") as path:
            self._dcp_save(save_pool, path, saved, tensor, example, hf=True)
            if damage is not None:
                victim = _file_at_origin(Path(path))
                if damage == "remove":
                    victim.unlink()
                elif damage == "truncate":
                    with open(victim, "r+b") as f:
                        f.truncate(victim.stat().st_size - 1)
                else:
                    raise ValueError(f"damage must be remove or truncate, got {damage!r}")
            args = {**load, "path": path, "dtype": dtype_name(tensor), "fill": 1,
                    "reads": reads, "shape": list(tensor.shape), "safetensors": True}  # fmt: skip
            return self._run_via(  # type: ignore[no-any-return]
                "DCP Hugging Face load", load_pool, "checkpoint.collective_load", args,
                per_rank_tensors=ones_of(load, tensor, load_pool.world_size), example=example,
            )  # fmt: skip


def _file_at_origin(path: Any) -> Any:
    """The file of DCP's Hugging Face format at ``path`` whose chunk of ``t`` is non-empty and
    starts at the tensor's origin: losing it leaves a gap that the other chunks' bounding box
    still spans."""
    import json
    import math

    from safetensors import safe_open

    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            place = json.loads(h.metadata()["DCP_SHARDING_INFO"])["t"]["saved_offsets"]
            if not any(place) and math.prod(h.get_slice("t").get_shape()) > 0:
                return f
    raise ValueError(f"{path}: no file holds a non-empty chunk of t at its origin")
