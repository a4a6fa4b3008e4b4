"""The FSDP hooks in one process (torch's fake process group): chunking, flattening,
installing on other torch versions (FSDP-6..8)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from fsdp_fake import fake_world

from shardspec.fsdp import DTensorExtensions, flatten_sharded_tensors, install
from shardspec.fsdp.flatten import layout_of
from shardspec.metadata import Box, ConversionError, chunk_layout
from shardspec.testing.defects import known_failure


@pytest.mark.rule("FSDP-6", "FSDP-3")
@pytest.mark.parametrize(("rows", "world", "rank"), [(5, 2, 1), (7, 3, 2), (1, 2, 1), (5, 4, 3)])
def test_chunk_tensor_plain_lists_every_chunk_at_its_offset(
    rows: int, world: int, rank: int
) -> None:
    full = torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3)
    with fake_world(rank, world):
        st = DTensorExtensions().chunk_tensor(full, rank, world, 1, dist.group.WORLD)
        layout = layout_of(st)
        local = st.local_shards()
    assert layout == chunk_layout((rows, 3), 0, list(range(world)))
    (shard,) = local
    box = Box(shard.metadata.shard_offsets, shard.metadata.shard_sizes)
    assert layout.boxes_of(rank) == (box,)
    assert torch.equal(shard.tensor, full[box.slices()])


@pytest.mark.rule("FSDP-6")
def test_chunk_tensor_refuses_0d() -> None:
    with fake_world(0, 2), pytest.raises(ConversionError, match="0-d"):
        DTensorExtensions().chunk_tensor(torch.tensor(1.0), 0, 2, 1, dist.group.WORLD)


@pytest.mark.rule("FSDP-6")
def test_pre_load_returns_the_local_chunk() -> None:
    full = torch.arange(10.0).reshape(5, 2)
    with fake_world(1, 2):
        ext = DTensorExtensions()
        st = ext.chunk_tensor(full, 1, 2, 1, dist.group.WORLD)
        tensor, shards = ext.pre_load_state_dict_transform(st)
    assert tensor is st
    assert len(shards) == 1
    assert torch.equal(shards[0].tensor, full[3:5])


@pytest.mark.rule("FSDP-8")
def test_flatten_keeps_entry_without_local_data() -> None:
    # 1 row over 2 ranks: rank 1 holds an empty chunk, still listed and kept.
    with fake_world(1, 2):
        st = DTensorExtensions().chunk_tensor(torch.ones(1, 3), 1, 2, 1, dist.group.WORLD)
        out = flatten_sharded_tensors({"a": {"w": st}, "n": 3})
    assert out["n"] == 3
    assert layout_of(out["a"]["w"]).boxes_of(1) == (Box((1, 0), (0, 3)),)


@pytest.mark.rule("FSDP-8")
@known_failure(
    reason="upstream: checkpoint/_sharded_tensor_utils.py _flatten_sharded_tensors drops a "
    "ShardedTensor with no local shard on this rank",
    raises=AssertionError,
    match=r"'w' in \{\}",
)
def test_upstream_flatten_keeps_entry_without_local_shard() -> None:
    from torch.distributed.checkpoint._sharded_tensor_utils import _flatten_sharded_tensors
    from torch.distributed.fsdp._shard_utils import _create_chunk_sharded_tensor

    with fake_world(1, 2):
        st = _create_chunk_sharded_tensor(torch.ones(1, 3), 1, 2, 1, dist.group.WORLD)
        out = _flatten_sharded_tensors({"w": st})
    assert "w" in out


@pytest.mark.rule("FSDP-7")
def test_install_without_model_replaces_the_class_fsdp_instantiates() -> None:
    from torch.distributed.fsdp import _init_utils

    saved = _init_utils.DTensorExtensions
    try:
        ext = install()
        assert _init_utils.DTensorExtensions(None) is ext
    finally:
        _init_utils.DTensorExtensions = saved


@pytest.mark.rule("FSDP-7")
def test_install_on_a_torch_with_a_global_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.fsdp import _fsdp_extensions, _init_utils

    monkeypatch.delattr(_init_utils, "_init_extension")
    monkeypatch.setattr(_fsdp_extensions, "_extensions", None)
    ext = install()
    assert _fsdp_extensions._extensions is ext


@pytest.mark.rule("FSDP-7")
def test_install_on_a_torch_without_hooks_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.fsdp import _fsdp_extensions, _init_utils

    monkeypatch.delattr(_init_utils, "_init_extension")
    monkeypatch.delattr(_fsdp_extensions, "_set_fsdp_extensions")
    with pytest.raises(RuntimeError, match="cannot install"):
        install()


@pytest.mark.rule("FSDP-7")
def test_install_on_an_unwrapped_model_raises() -> None:
    with pytest.raises(ValueError, match="no FSDP state"):
        install(torch.nn.Linear(2, 2))
