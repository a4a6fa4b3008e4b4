"""ByteCheckpoint (``bytecheckpoint`` 0.0.2) as the suite runs it: imported, and held to
loopback before its first save.

Its save starts a gRPC coordinator on rank 0 (``bytecheckpoint.distributed.rpc_context``
calls ``server_lib.start_server_in_new_process``): a spawned process whose server binds
``[::]:0`` (every interface) and advertises the address a UDP ``connect`` to a public host
picks (``server_lib.get_host_ip``). Patching the parent's module would not reach that spawned
process, so :func:`hold_to_loopback` replaces the starter: the same ``ReportServicer``, served
by a thread of rank 0's own process on ``127.0.0.1`` only, its address ``127.0.0.1:PORT``; the
address discovery answers ``127.0.0.1`` without opening a socket. Nothing is sent off the
machine, and no process outlives the rank. :func:`coordinator_listeners` reads the OS socket
table for what the rank listens on (every address must be loopback).

Imported only where ``SHARDSPEC_IMPL=bytecheckpoint`` is selected (the pool's ranks, the
world functions of ``ops_bytecheckpoint``) and by the checkpoint generator of
``packages/checkpoint/tests/data/bytecheckpoint-0.0.2-fsdp2-uneven``; the default suite never
imports it.
"""

from __future__ import annotations

import os
import threading
from typing import Any

__all__ = ["LOOPBACK", "coordinator_listeners", "hold_to_loopback", "version"]

LOOPBACK = "127.0.0.1"
_HELD = threading.Lock()
_servers: list[Any] = []


def version() -> str:
    from importlib.metadata import version as dist_version

    return dist_version("bytecheckpoint")


def hold_to_loopback() -> None:
    """Patch ByteCheckpoint so that its coordinator listens on 127.0.0.1 in this process
    and advertises that address (idempotent)."""
    with _HELD:
        from bytecheckpoint.utilities.server import server_lib

        if getattr(server_lib, "_shardspec_loopback", False):
            return
        server_lib.get_host_ip = lambda: LOOPBACK
        server_lib._get_local_ip = lambda: LOOPBACK
        server_lib.start_server_in_new_process = _start_loopback_server
        server_lib._shardspec_loopback = True


def _start_loopback_server(world_size: int) -> str:
    """What ``server_lib.start_server_in_new_process`` returns (the coordinator's address),
    from a server on a daemon thread of this process bound to 127.0.0.1."""
    import asyncio

    import grpc
    from bytecheckpoint.utilities.server import report_service_pb2_grpc, server_lib

    ready = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        try:
            server = grpc.aio.server(options=server_lib._GRPC_OPTIONS)
            report_service_pb2_grpc.add_ByteCheckpointReportServiceServicer_to_server(
                server_lib.ReportServicer(world_size), server
            )
            port = server.add_insecure_port(f"{LOOPBACK}:0")
            if not port:
                raise OSError(f"gRPC could not bind {LOOPBACK}:0")
            await server.start()
            _servers.append(server)
            box["addr"] = f"{LOOPBACK}:{port}"
        except BaseException as e:  # reported to the caller below
            box["error"] = e
            ready.set()
            return
        ready.set()
        await server.wait_for_termination()

    thread = threading.Thread(
        target=lambda: asyncio.run(serve()), name="bytecheckpoint-coordinator", daemon=True
    )
    thread.start()
    if not ready.wait(60):
        raise TimeoutError("ByteCheckpoint's coordinator did not start within 60 s")
    if "error" in box:
        raise box["error"]
    return str(box["addr"])


def coordinator_listeners() -> list[str]:
    """The addresses this process listens on that are not loopback (must be empty)."""
    from shardspec.testing.loopback import listeners

    return [f"{x.address}:{x.port}" for x in listeners([os.getpid()]) if not x.loopback]
