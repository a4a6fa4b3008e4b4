"""A pooled rank releases the process groups its calls built and nothing holds (CONF-1): a
session of examples that build meshes does not pile up groups and their gloo threads, while
the meshes ``Context.mesh`` keeps (the 8 used last), the groups an operation caches, and the
groups and meshes a library keeps in its module stay usable."""

from __future__ import annotations

import itertools

import pytest
from testing_group_ops import build_meshes, cached_in_module

from shardspec.testing import RankPool, get_pool
from shardspec.testing.groups import RELEASE_ABOVE
from shardspec.testing.ops import Context

WORLD = 2


@pytest.fixture
def pool() -> RankPool:
    return get_pool(WORLD, timeout=120, local_size=1, ops=("testing_group_ops",))


@pytest.mark.rule("CONF-1")
def test_groups_a_rank_function_built_do_not_pile_up(pool: RankPool) -> None:
    answers = [pool.call(build_meshes, 3) for _ in range(16)]
    # Each call builds 6 groups a rank (per mesh pair, a size-1 dim of each and the flattened
    # dim: dims over the whole world reuse the default group) and keeps none. They pile up to
    # RELEASE_ABOVE, then go at the next call: kept, 16 calls would leave 90 at the last.
    # Each group starts gloo threads (at least 2) that end a little after it is destroyed.
    for rank in range(WORLD):
        groups = [a[rank][0] for a in answers]
        assert max(groups) <= RELEASE_ABOVE + 6, groups
        assert any(later < earlier for earlier, later in itertools.pairwise(groups)), groups
        threads = [a[rank][1] for a in answers]
        assert max(threads) < threads[0] + 4 * (RELEASE_ABOVE + 6), threads


@pytest.mark.rule("CONF-1")
def test_groups_a_library_keeps_in_a_module_survive_releases(pool: RankPool) -> None:
    first = pool.call(cached_in_module)
    for _ in range(12):  # past RELEASE_ABOVE: releases run in between
        pool.call(build_meshes, 2)
        # the module's group and its mesh's flattened dim, over both ranks, sum 1 + 2; its
        # mesh's size-1 dim the rank's own (plus 10 x the rank in each group)
        assert pool.call(cached_in_module) == first == [[3.0, 1.0, 3.0], [13.0, 2.0, 13.0]]


@pytest.mark.rule("CONF-1")
def test_context_keeps_the_meshes_used_last_and_they_stay_usable(pool: RankPool) -> None:
    keys = [
        (shape, order, flatten)
        for shape, order, flatten in itertools.product(
            [(2,), (1, 2), (2, 1)], [[0, 1], [1, 0]], [False, True]
        )
    ]
    assert len(keys) > Context.MESHES_KEPT
    asked = keys + keys[-3:] + keys[:2]
    ids = []
    for shape, order, flatten in asked:
        results = pool.run(
            "test.groups.mesh", {"shape": list(shape), "order": order, "flatten": flatten}
        )
        for r in results:
            v = r.value
            assert v["meshes_built"] <= Context.MESHES_KEPT
            # each dim's group sums rank + 1 over that dim's ranks: 1 + 2, or the rank's own
            for dim, size in enumerate(shape):
                assert v["sums"][dim] == (3.0 if size == 2 else r.rank + 1.0), (shape, order)
            assert v["coordinate"][shape.index(2)] == order.index(r.rank)
            # no more groups than the kept meshes hold (3 at most a mesh here) and those
            # that may pile up before a release
            assert v["groups_at_entry"] <= 3 * Context.MESHES_KEPT + RELEASE_ABOVE + 3
        ids.append(results[0].value["mesh_id"])
    # the last three keys, asked again at once, are the same meshes; the first two had been
    # evicted, were built again, and work (their sums above)
    n = len(keys)
    assert ids[n : n + 3] == ids[n - 3 : n]


@pytest.mark.rule("CONF-1")
def test_a_group_an_operation_caches_survives_other_calls(pool: RankPool) -> None:
    before = pool.run("test.groups.cached")
    pool.call(build_meshes, 2)
    after = pool.run("test.groups.cached")
    for b, a in zip(before, after):
        assert a.value["group_id"] == b.value["group_id"]
        assert a.value["sum"] == b.value["sum"] == 3.0
