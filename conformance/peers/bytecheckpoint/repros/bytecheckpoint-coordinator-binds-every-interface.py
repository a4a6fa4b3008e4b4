"""ByteCheckpoint 0.0.2's save starts a gRPC coordinator that binds every interface and
advertises the address a UDP connect to a public host picks.

Install: pip install torch==2.13.0 && pip install --no-deps bytecheckpoint==0.0.2 mmh3==4.1.0
universal-pathlib cachetools safetensors numpy typing-extensions grpcio==1.69.0 protobuf==3.20.3
(ByteCheckpoint 0.0.2 pins torch<=2.5.0). Run: python this-file.py. Nothing leaves the machine
and nothing listens beyond 127.0.0.1: the address it asks gRPC to bind is recorded and
127.0.0.1 bound instead, and its address discovery is read, not run.
"""

import inspect
import sys

DEFECT = {
    "id": "bytecheckpoint-coordinator-binds-every-interface",
    "title": "ByteCheckpoint 0.0.2's save coordinator (gRPC, unauthenticated) listens on every "
    "interface and advertises the address of a UDP connect to 8.8.8.8",
    "area": "checkpoint_libraries",
    "rule": "CONF-9",
    "upstream": None,
    "issue_text": """### The save coordinator listens on every interface

The first `bytecheckpoint.save` on a process group starts, on rank 0, a gRPC server for its
gather/broadcast barrier (`distributed/rpc_context.setup_rpc_service` ->
`server_lib.start_server_in_new_process` -> `async_serve`), which calls
`server.add_insecure_port("[::]:0")`: an unauthenticated service on every interface of the
node, whose `GetStatus` answers a pickle of its state to anyone who connects. The address
given to the other ranks comes from `get_host_ip()`, a UDP `connect(("8.8.8.8", 80))`: on a
node without a route to that host the save fails, and on one with several interfaces it picks
the one routed to the internet, not the one the job's ranks share. Repro: this file,
bytecheckpoint 0.0.2, torch 2.13.0 (it records the bind address and binds 127.0.0.1 instead).

Expected: bind the address the job's own rendezvous uses (e.g. `MASTER_ADDR`, or the address
of the process group's store), or let the caller choose it; or do the barrier with the
process group it already has.""",
    "nproc": 1,
    "impl": "bytecheckpoint",
    "needs": ["bytecheckpoint"],
    "torch_does": "its coordinator asks gRPC to bind [::]:0 (every interface) and advertises "
    "the address of a UDP connect to 8.8.8.8",
    "spec_says": "every socket the suite's ranks listen on is bound to a loopback address",
    "tests": [],
}

try:
    import grpc
    from bytecheckpoint.utilities.server import server_lib
except (ImportError, OSError) as e:
    print(f"SKIPPED bytecheckpoint does not load ({type(e).__name__}: {e})")
    sys.exit(0)

asked, real_server = [], grpc.aio.server


class Recorded:  # the server it builds, bound to 127.0.0.1 whatever it asks for
    def __init__(self, inner):
        self.inner = inner

    def add_insecure_port(self, address):
        asked.append(address)
        return self.inner.add_insecure_port("127.0.0.1:0")

    def __getattr__(self, name):
        return getattr(self.inner, name)


grpc.aio.server = lambda *a, **k: Recorded(real_server(*a, **k))
server_lib._get_local_ip = lambda: "127.0.0.1"  # its discovery is read below, not run
server_lib.serve(server_lib.ReportServicer(1))  # async_serve, on a thread of this process
discovery = inspect.getsource(server_lib.get_host_ip)
host = asked[0].rsplit(":", 1)[0] if asked else None
public = "8.8.8.8" in discovery and "SOCK_DGRAM" in discovery
print(f"it asked to bind {asked}; its address discovery: {discovery.strip().splitlines()[2:4]}")
if host not in ("127.0.0.1", "[::1]", "localhost") or public:
    print(
        f"DIVERGES rank 0: ByteCheckpoint's coordinator asks to bind {asked[0] if asked else '?'}"
        f" (every interface){' and advertises a UDP connect to 8.8.8.8' if public else ''}; "
        "the spec says it listens on loopback only (or where the job says)"
    )
    sys.exit(1)
