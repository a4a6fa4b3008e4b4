"""While a pool runs, every socket its driver and ranks listen on is bound to loopback (read
from the OS socket table, /proc/net/tcp{,6}), gloo's pairs included."""

from __future__ import annotations

import os
import socket
import sys

import pytest
from testing_pool_cases import all_reduce_rank, pid

from shardspec.testing import get_pool
from shardspec.testing.loopback import listeners

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/net/tcp (Linux only)"
)


def test_the_socket_table_reader_sees_a_listener_on_every_interface() -> None:
    # The check below can only fail if the reader tells loopback from the rest.
    with (
        socket.create_server(("0.0.0.0", 0)) as wide,
        socket.create_server(("127.0.0.1", 0)) as lo,
    ):
        ports = wide.getsockname()[1], lo.getsockname()[1]
        mine = {(str(x.address), x.port, x.loopback) for x in listeners([os.getpid()])}
    assert ("0.0.0.0", ports[0], False) in mine
    assert ("127.0.0.1", ports[1], True) in mine


@pytest.mark.rule("CONF-9")
def test_no_listener_of_a_running_pool_is_outside_loopback() -> None:
    pool = get_pool(2, timeout=120, local_size=1, env={"SHARDSPEC_PROBE": "x"})
    assert pool.call(all_reduce_rank) == [(0, 2, 1.0), (1, 2, 1.0)]  # gloo pairs connected
    ranks = pool.call(pid)
    found = listeners([os.getpid(), *ranks])
    wide = [f"{x.address}:{x.port}" for x in found if not x.loopback]
    assert not wide, f"listening outside loopback: {wide}"
    # the driver's listener and the store at least; gloo's on the ranks
    assert len([x for x in found if x.inode]) >= 2, found
    assert listeners(ranks), "the ranks' gloo listeners were not found in the socket table"
