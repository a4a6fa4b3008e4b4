import os
import sys

import pytest

# Test helpers of this package (torchrec_oracle, torchrec_strategies, torchrec_cases) are
# imported by name, also by the spawned ranks; names are unique across the monorepo because
# pytest runs every package's tests in one process.
sys.path.insert(0, os.path.dirname(__file__))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "torchrec: runs TorchRec models on gloo ranks (the `torchrec` nox session)"
    )


def _pool(world: int, local_size: int) -> object:
    from shardspec.testing import get_pool

    return get_pool(world, local_size=local_size, timeout=300)


# One world per size for the whole session: every multi-rank test shares it.
@pytest.fixture(scope="session")
def ranks2() -> object:
    return _pool(2, 2)


@pytest.fixture(scope="session")
def ranks4() -> object:
    # Two hosts of two ranks, so table_row_wise, table_column_wise and grid_shard have hosts.
    return _pool(4, 2)
