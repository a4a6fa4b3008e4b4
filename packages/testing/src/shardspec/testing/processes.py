"""A pool's ranks as processes: :class:`LocalRanks` starts W worker processes on this host
(forked from a server that imported torch once, :mod:`.forked`, or ``python -m
shardspec.testing.worker``), takes their connections back over loopback, watches
that they live and kills them by process group; ``launched.LaunchedRanks`` has the same
shape for the ranks of a ``torchrun`` job.

No orphans: workers run in their own process groups and are killed by group on teardown and
at exit; each worker also asks the kernel to kill it when its parent dies (the driver, or the
fork server, which exits with the driver: ``PR_SET_PDEATHSIG``) and exits when its socket to
the driver closes.

Loopback only: the driver listens on 127.0.0.1 port 0, binds the store's listening socket to
127.0.0.1 itself and hands it to ``TCPStore`` (which, given a host name, listens on every
interface), and the ranks' gloo pairs bind to the loopback device (``GLOO_SOCKET_IFNAME=lo``).
Ports come from the OS, so concurrent pools never collide; a random token authenticates the
workers that connect back.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .forked import fork_refused, start_rank
from .loopback import loopback_store
from .protocol import recv_frame, send_frame
from .results import PoolError, RankCrash
from .timing import scaled

__all__ = ["LocalRanks", "Process", "Ranks", "Worker", "tail"]


class Process(Protocol):
    """What the pool asks of a rank's process: a ``subprocess.Popen``, or a launcher rank."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | Any: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int | Any: ...

    def kill(self) -> None: ...


@dataclass
class Worker:
    """One rank: its process, its output log (None where another process owns it) and its
    socket to the driver."""

    rank: int
    proc: Process
    log: Path | None
    sock: socket.socket | None = None


class Ranks(Protocol):
    """The ranks a pool drives: started, killed (a crash; restarted on the next call) or
    closed (the pool is done)."""

    workers: list[Worker]

    @property
    def running(self) -> bool: ...

    def start(self) -> None: ...

    def kill(self) -> None: ...

    def close(self) -> None: ...


def tail(path: Path | None, n: int = 15) -> str:
    """The last ``n`` lines of a rank's log ("" when it has none)."""
    if path is None:
        return ""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


class LocalRanks:
    """``world_size`` worker processes on this host with an initialised process group.

    ``settings`` are the ``SHARDSPEC_POOL_*`` values of the pool (world, backend, device, ops)
    and ``env`` the caller's additions to the environment; ``startup_timeout`` bounds the
    start, stretched by :func:`~shardspec.testing.timing.scaled`.
    """

    def __init__(
        self,
        world_size: int,
        *,
        settings: Mapping[str, str],
        env: Mapping[str, str],
        startup_timeout: float,
    ) -> None:
        self.world_size = world_size
        self.settings = dict(settings)
        self.env = dict(env)
        self.startup_timeout = startup_timeout
        self.workers: list[Worker] = []
        self._store: Any = None
        self._listener: socket.socket | None = None
        self._logdir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def running(self) -> bool:
        return bool(self.workers)

    def start(self) -> None:
        # Limits are written for an idle machine; a loaded one gets proportionally longer.
        deadline = time.monotonic() + scaled(self.startup_timeout)
        token = secrets.token_hex(16)
        self._logdir = tempfile.TemporaryDirectory(prefix=f"shardspec-pool-w{self.world_size}-")
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=self.world_size)
        port = self._listener.getsockname()[1]
        self._store = loopback_store()
        env = dict(os.environ)
        env.update(self.env)
        env.update(
            SHARDSPEC_POOL_ADDR=f"127.0.0.1:{port}",
            SHARDSPEC_POOL_TOKEN=token,
            SHARDSPEC_POOL_STORE=f"127.0.0.1:{self._store.port}",
            **self.settings,
            SHARDSPEC_POOL_SYSPATH=json.dumps([p for p in sys.path if p]),
            GLOO_SOCKET_IFNAME="lo",
            OMP_NUM_THREADS="1",
        )
        cwd = os.getcwd()
        forks = fork_refused(self.env, self.settings.get("SHARDSPEC_POOL_DEVICE", "cpu")) is None
        try:
            for rank in range(self.world_size):
                log = Path(self._logdir.name) / f"rank{rank}.log"
                rank_env = {**env, "SHARDSPEC_POOL_RANK": str(rank)}
                proc: Process
                with open(log, "wb") as fh:
                    if forks:
                        proc = start_rank(rank_env, cwd, str(log))
                    else:
                        proc = subprocess.Popen(
                            [sys.executable, "-m", "shardspec.testing.worker"],
                            env=rank_env,
                            cwd=cwd,
                            stdin=subprocess.DEVNULL,
                            stdout=fh,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                self.workers.append(Worker(rank, proc, log))
            self._accept(token, deadline)
            for w in self.workers:
                header, _ = self._recv(w, deadline, what="start-up")
                if header.get("kind") != "ready":
                    raise PoolError(f"rank {w.rank} sent {header!r} instead of ready")
        except BaseException as e:
            logs = self._logs()
            self.kill()
            if isinstance(e, PoolError | RankCrash | TimeoutError | EOFError | OSError):
                raise PoolError(
                    f"a pool of {self.world_size} did not start: {e!r}\n{logs}"
                ) from None
            raise

    def _accept(self, token: str, deadline: float) -> None:
        assert self._listener is not None
        pending = {w.rank: w for w in self.workers}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PoolError(
                    f"ranks {sorted(pending)} of a pool of {self.world_size} did not connect "
                    f"within {self.startup_timeout:.0f} s"
                )
            self._check_alive(pending.values(), "start-up")
            self._listener.settimeout(min(left, 0.5))
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(max(deadline - time.monotonic(), 0.1))
            try:
                hello, _ = recv_frame(conn)
            except (OSError, EOFError, ValueError):
                conn.close()
                continue
            rank = hello.get("rank")
            if hello.get("token") != token or rank not in pending:
                conn.close()  # not one of ours
                continue
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pending.pop(rank).sock = conn

    def _check_alive(self, workers: Iterable[Worker], what: str) -> None:
        for w in workers:
            code = w.proc.poll()
            if code is not None:
                raise PoolError(
                    f"rank {w.rank} exited with code {code} during {what}:\n{tail(w.log)}"
                )

    def _recv(
        self, w: Worker, deadline: float, what: str
    ) -> tuple[dict[str, Any], list[bytearray]]:
        assert w.sock is not None
        sel = selectors.DefaultSelector()
        sel.register(w.sock, selectors.EVENT_READ)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no answer during {what}")
                if sel.select(min(left, 0.25)):
                    break
                if w.proc.poll() is not None:
                    raise EOFError(f"rank {w.rank} exited during {what}")
        finally:
            sel.close()
        w.sock.settimeout(max(deadline - time.monotonic(), 0.05))
        try:
            return recv_frame(w.sock)
        finally:
            w.sock.settimeout(None)

    def _logs(self) -> str:
        parts = []
        for w in self.workers:
            text = tail(w.log)
            if text:
                parts.append(f"--- rank {w.rank} output ---\n{text}")
        return "\n".join(parts)

    def kill(self) -> None:
        for w in self.workers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(w.proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                w.proc.kill()
        for w in self.workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(timeout=10)
            if w.sock is not None:
                w.sock.close()
        self.workers = []
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self._store = None
        if self._logdir is not None:
            self._logdir.cleanup()
            self._logdir = None

    def close(self) -> None:
        """Stop the ranks (politely, then by force)."""
        for w in self.workers:
            if w.sock is not None:
                with contextlib.suppress(OSError):
                    send_frame(w.sock, {"kind": "exit"})
        t_end = time.monotonic() + 2
        for w in self.workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(timeout=max(t_end - time.monotonic(), 0.01))
        self.kill()
