"""A pooled rank releases the process groups a call built and nothing keeps, when the next
call arrives (CONF-1): a session of examples that build meshes does not pile up groups and
their gloo threads, while the meshes ``Context.mesh`` keeps (the 8 used last) and the groups an
operation caches stay usable."""

from __future__ import annotations

import itertools

import pytest
from testing_group_ops import build_meshes

from shardspec.testing import RankPool, get_pool
from shardspec.testing.ops import Context

WORLD = 2


@pytest.fixture
def pool() -> RankPool:
    return get_pool(WORLD, timeout=120, local_size=1, ops=("testing_group_ops",))


@pytest.mark.rule("CONF-1")
def test_groups_a_rank_function_built_are_gone_by_the_next_call(pool: RankPool) -> None:
    answers = [pool.call(build_meshes, 3) for _ in range(8)]
    # Each call builds 6 groups a rank (per mesh pair, a size-1 dim of each and the flattened
    # dim: dims over the whole world reuse the default group); none is left when the next call
    # starts. Each group starts gloo threads (at least 2) that end a little after it is
    # destroyed, so the count wobbles, but kept groups would add 12 or more a call: 84 by the
    # last call.
    for rank in range(WORLD):
        assert [a[rank][0] for a in answers[1:]] == [0] * 7
        threads = [a[rank][1] for a in answers]
        assert max(threads) < threads[0] + 2 * 12, threads


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
            # no more groups than the kept meshes hold (3 at most a mesh here)
            assert v["groups_at_entry"] <= 3 * Context.MESHES_KEPT
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
