"""Launched mode: the suite under ``torchrun``; launcher rank 0 drives, the others are the ranks.

``torchrun [--nnodes N --rdzv-backend c10d --rdzv-endpoint HOST:PORT | --standalone]
--nproc-per-node P -m shardspec.testing.launched [pytest arguments]`` runs pytest on launcher
rank 0 only. Every other launcher rank connects to it and serves as a rank of the pools: a pool
of W ranks is launcher ranks 1..W, whose process group is formed (gloo on CPU, NCCL with the
GPU of their ``LOCAL_RANK``) through the launcher's own rendezvous store, and formed again
when the driver asks for another world size. The ranks belong to the launcher, so a rank that
dies or hangs cannot be restarted: the call fails with :class:`RankCrash` and every later one
with :class:`PoolError`; relaunch.

Sockets: on one node the driver listens on 127.0.0.1 and gloo binds to ``lo``; across nodes it
listens on ``SHARDSPEC_DRIVER_HOST`` (default: this host's name), which the other nodes must
reach, and the process groups use the launcher's rendezvous.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import sys
import time
from datetime import timedelta
from typing import Any

from .devices import backend, device_type
from .pool import RankPool
from .processes import Ranks, Worker
from .protocol import recv_frame, send_frame
from .results import PoolError
from .timing import scaled

__all__ = ["LaunchedPool", "LaunchedRanks", "is_launched", "launched_world", "main"]

_KEY = "shardspec/driver"


def is_launched() -> bool:
    """Whether this process is the driver of a launched run."""
    return os.environ.get("SHARDSPEC_LAUNCHED") == "1"


def launched_world() -> int:
    """How many ranks a launched run has besides its driver."""
    return int(os.environ.get("WORLD_SIZE", "1")) - 1


def _single_node() -> bool:
    return os.environ.get("LOCAL_WORLD_SIZE", "1") == os.environ.get("WORLD_SIZE", "1")


def _launcher_store() -> Any:
    import torch.distributed as dist

    store = dist.TCPStore(  # type: ignore[attr-defined]
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        None,
        False,
        timeout=timedelta(seconds=1800),
    )
    return dist.PrefixStore("shardspec", store)  # type: ignore[attr-defined]


class _Remote:
    """A launcher rank as the pool sees a process: alive until its socket says otherwise, and
    not the driver's to wait for or kill (the launcher owns it)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        return self.returncode

    def kill(self) -> None:
        pass


class _Hub:
    """The driver's connections to every other launcher rank, and which world they form."""

    def __init__(self, listener: socket.socket, token: str, size: int) -> None:
        self.listener = listener
        self.token = token
        self.size = size
        self.conns: list[socket.socket] = []
        self.pids: list[int] = []
        self.current = 0  # the world size formed now (0: none)
        self.generation = 0
        self.broken: str | None = None

    def connect(self, deadline: float) -> None:
        pending: dict[int, tuple[socket.socket, int]] = {}
        while len(pending) < self.size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PoolError(
                    f"launcher ranks {sorted(set(range(1, self.size + 1)) - set(pending))} "
                    "did not connect to the driver"
                )
            self.listener.settimeout(min(left, 1.0))
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(30)
            hello, _ = recv_frame(conn)
            if hello.get("token") != self.token:
                conn.close()
                continue
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pending[int(hello["rank"])] = (conn, int(hello["pid"]))
        self.conns = [pending[r][0] for r in sorted(pending)]
        self.pids = [pending[r][1] for r in sorted(pending)]

    def form(self, world: int, ops: tuple[str, ...], timeout: float) -> None:
        """Launcher ranks 1..world form a process group of ``world`` ranks; the rest idle."""
        if self.broken is not None:
            raise PoolError(self.broken)
        if not self.conns:
            self.connect(time.monotonic() + timeout)
        self.generation += 1
        frame = {"kind": "world", "size": world, "gen": self.generation, "ops": list(ops)}
        for conn in self.conns:
            send_frame(conn, frame)
        deadline = time.monotonic() + timeout
        for i, conn in enumerate(self.conns):
            conn.settimeout(max(deadline - time.monotonic(), 0.1))
            try:
                header, _ = recv_frame(conn)
            except (OSError, EOFError) as e:
                self.broken = f"launcher rank {i + 1} did not re-form the world ({e!r}); relaunch"
                raise PoolError(self.broken) from None
            finally:
                conn.settimeout(None)
            if header.get("kind") not in ("ready", "idle"):
                self.broken = f"launcher rank {i + 1}: {header.get('error', header)}"
                raise PoolError(self.broken)
        self.current = world


_HUB: _Hub | None = None


def _hub() -> _Hub:
    if _HUB is None:
        raise PoolError(
            "not a launched run: start it with `torchrun ... -m shardspec.testing.launched`"
        )
    return _HUB


class LaunchedRanks:
    """Launcher ranks 1..W of a ``torchrun`` job as a pool's ranks (see the module): started by
    forming their world, never restarted."""

    def __init__(self, world_size: int, ops: tuple[str, ...], startup_timeout: float) -> None:
        self.world_size = world_size
        self.ops = ops
        self.startup_timeout = startup_timeout
        self.workers: list[Worker] = []

    @property
    def running(self) -> bool:
        hub = _hub()
        return bool(self.workers) and hub.current == self.world_size and hub.broken is None

    def start(self) -> None:
        hub = _hub()
        if self.world_size > hub.size:
            raise PoolError(
                f"world size {self.world_size} needs {self.world_size} launcher ranks besides "
                f"the driver; this launch has {hub.size}"
            )
        hub.form(self.world_size, self.ops, scaled(self.startup_timeout))
        self.workers = [
            Worker(r, _Remote(hub.pids[r]), log=None, sock=hub.conns[r])
            for r in range(self.world_size)
        ]

    def kill(self) -> None:
        # Launcher ranks cannot be restarted: after a crash every later call fails clearly.
        if self.workers:
            _hub().broken = (
                "a launched rank died or hung, and launcher ranks cannot be restarted; relaunch"
            )
        self.workers = []

    def close(self) -> None:
        self.workers = []


class LaunchedPool(RankPool):
    """A pool whose ranks are launcher ranks 1..W of a ``torchrun`` job (see the module)."""

    def _new_ranks(self) -> Ranks:
        return LaunchedRanks(self.world_size, self.ops, self.startup_timeout)


def _serve(rank: int, store: Any) -> None:
    import torch
    import torch.distributed as dist

    from .ops import Context, warm_up
    from .worker import answer

    host, port, token = store.get(_KEY).decode().split(" ")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    send_frame(sock, {"token": token, "rank": rank, "pid": os.getpid()})
    name, device = backend(), device_type()
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.set_num_threads(1)
    ctx: Context | None = None
    while True:
        try:
            header, bufs = recv_frame(sock)
        except (EOFError, OSError):
            break
        kind = header.get("kind")
        if kind == "exit":
            break
        if kind == "world":
            try:
                if ctx is not None:
                    dist.barrier()  # gloo: every rank out of the last collective first
                    dist.destroy_process_group()
                    ctx = None
                index, size = rank - 1, int(header["size"])
                if index < size:
                    sub = dist.PrefixStore(f"world{header['gen']}", store)  # type: ignore[attr-defined]
                    dist.init_process_group(
                        name, store=sub, rank=index, world_size=size, timeout=timedelta(seconds=600)
                    )
                    for module in header.get("ops", []):
                        __import__(module)
                    ctx = Context(rank=index, world=size, backend=name, device_type=device)
                    warm_up(ctx)
                    send_frame(sock, {"kind": "ready"})
                else:
                    send_frame(sock, {"kind": "idle"})
            except Exception as e:
                send_frame(sock, {"kind": "failed", "error": repr(e)})
            continue
        if not answer(sock, ctx, header, bufs):
            break
    sock.close()


def main(argv: list[str] | None = None) -> int:
    """Launcher rank 0: run pytest with ``argv`` as the driver (or ``--script PATH ARGS``);
    other ranks: serve it."""
    args = sys.argv[1:] if argv is None else argv
    rank = int(os.environ["RANK"])
    if _single_node():
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = _launcher_store()
    if rank != 0:
        _serve(rank, store)
        os._exit(0)  # the driver owns the run; skip process-group teardown
    host = (
        "127.0.0.1"
        if _single_node()
        else os.environ.get("SHARDSPEC_DRIVER_HOST", socket.gethostname())
    )
    listener = socket.create_server((host, 0), backlog=launched_world() + 1)
    token = secrets.token_hex(16)
    store.set(_KEY, f"{host} {listener.getsockname()[1]} {token}")
    # pytest imports this module by name; `-m` ran it as __main__: the hub goes to the former
    from shardspec.testing import launched as this

    this._HUB = _Hub(listener, token, launched_world())
    os.environ["SHARDSPEC_LAUNCHED"] = "1"
    try:
        if args[:1] == ["--script"]:  # a driver script instead of pytest (the benchmark)
            import runpy

            sys.argv = [args[1], *args[2:]]
            runpy.run_path(args[1], run_name="__main__")
            return 0
        import pytest

        return int(pytest.main(args))
    finally:
        for conn in this._HUB.conns:
            with contextlib.suppress(OSError):
                send_frame(conn, {"kind": "exit"})


if __name__ == "__main__":
    sys.exit(main())
