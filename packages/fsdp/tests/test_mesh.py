"""Reading mesh dim roles off torch's meshes in one process (torch's fake process group): the
answers the hooks and the conversions act on when a mesh is not a named (dp, tp) slice."""

from __future__ import annotations

import pytest
from fsdp_fake import fake_world
from torch.distributed.device_mesh import init_device_mesh

from shardspec.fsdp.mesh import ranks_along, root_roles, submesh_dims
from shardspec.metadata import ConversionError


@pytest.mark.rule("FSDP-6", "FSDP-10")
def test_submesh_dims_by_name_and_refusals() -> None:
    with fake_world(3, 4):
        root = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        assert submesh_dims(root, root["tp"]) == [1]
        assert submesh_dims(root, root["dp"]) == [0]
        with pytest.raises(ConversionError, match="name the mesh dims"):
            submesh_dims(root, init_device_mesh("cpu", (4,)))
        with pytest.raises(ConversionError, match=r"'all' .* is not a dim of"):
            submesh_dims(root, init_device_mesh("cpu", (4,), mesh_dim_names=("all",)))


@pytest.mark.rule("FSDP-6", "FSDP-8")
def test_root_roles_finds_tp_and_fsdp_dims_or_none() -> None:
    # Rank 3 of a (2, 2) mesh: its dp line is ranks {1, 3}, its tp line {2, 3}.
    with fake_world(3, 4):
        root = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        roles = root_roles(root["tp"], [1, 3])
        assert roles is not None and roles[1:] == (1, 0)
        assert ranks_along(root, 0) == [1, 3]
        assert ranks_along(root, 1) == [2, 3]
        # TP first: the FSDP dim is found past it.
        swapped = init_device_mesh("cpu", (2, 2), mesh_dim_names=("tp", "dp"))
        roles = root_roles(swapped["tp"], [2, 3])
        assert roles is not None and roles[1:] == (0, 1)
        # No layout to attach: no TP mesh, a 1-D mesh that is its own root, FSDP ranks that are
        # no line of the mesh.
        assert root_roles(None, [1, 3]) is None
        assert root_roles(init_device_mesh("cpu", (4,), mesh_dim_names=("tp",)), [3]) is None
        assert root_roles(root["tp"], [0, 1]) is None
