"""The rank pool: W long-lived ranks with a process group, driven one example at a time.

Spawning a process group costs seconds; a property test needs hundreds of examples. So each
world size gets W worker processes (``python -m conformance.worker``) started once, each with
an initialised process group (gloo on 127.0.0.1, or NCCL with one GPU per rank), and the
driver (the pytest process) sends each example to them as an operation name from the table in
``conformance.ops`` plus JSON arguments plus raw tensor bytes (``conformance.protocol``: no
pickle anywhere). Each rank returns its outputs; the caller compares them with the reference.

Failure handling, which is what makes the pool usable under Hypothesis:

- A rank raises: :class:`RankError` (an ``AssertionError``) carrying every failing rank's
  traceback and the example, so Hypothesis shrinks it like any failure. Collective operations
  validate their inputs on every rank first and agree on the outcome with one small
  all-reduce, so one rank refusing its inputs never leaves the others inside a collective. A
  rank that raises *inside* a collective may strand the others: the pool is restarted.
- A rank dies or hangs: detected by end-of-stream or by the per-example timeout
  (``SHARDSPEC_POOL_TIMEOUT`` seconds, default 10); the pool is killed and restarted on the
  next example, and :class:`RankCrash` is raised with the example. ``RankCrash`` derives from
  ``BaseException`` on purpose: Hypothesis does not shrink it (each shrink step would cost a
  timeout plus a restart), while pytest still reports it as that test's failure and goes on.
- No orphans: workers run in their own process groups and are killed by group on teardown
  and at exit; each worker also asks the kernel to kill it when the driver dies
  (``PR_SET_PDEATHSIG``) and exits when its socket to the driver closes.

Ports: the driver listens on 127.0.0.1 port 0 and hosts the process group's TCPStore on port 0,
so concurrent pools (pytest-xdist workers, other users) never collide. A random token
authenticates the workers that connect back.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .protocol import decode_tensor, encode_tensor, recv_frame, send_frame

__all__ = [
    "PoolError",
    "RankCrash",
    "RankError",
    "RankPool",
    "RankResult",
    "backend",
    "default_timeout",
    "get_pool",
    "launcher_rank",
    "max_world_size",
    "rank_device",
    "shutdown_pools",
    "skip_reason",
]

ROOT = Path(__file__).resolve().parent.parent


def backend() -> str:
    """``nccl`` when asked for with ``SHARDSPEC_BACKEND=nccl``, else ``gloo``."""
    return os.environ.get("SHARDSPEC_BACKEND", "gloo")


def default_timeout() -> float:
    return float(os.environ.get("SHARDSPEC_POOL_TIMEOUT", "10"))


def _cuda_devices() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def max_world_size() -> int:
    """The largest world size the suite uses (``SHARDSPEC_MAX_WORLD``, default 4; on NCCL at
    most the number of GPUs)."""
    w = int(os.environ.get("SHARDSPEC_MAX_WORLD", "4"))
    if backend() == "nccl":
        w = min(w, _cuda_devices())
    return w


def skip_reason(
    world_size: int,
    *,
    backend_name: str | None = None,
    device_count: int | None = None,
    max_world: int | None = None,
) -> str | None:
    """Why a pool of ``world_size`` ranks cannot run here, or None when it can. NCCL needs one
    GPU per rank (ranks never share a device); every backend stops at SHARDSPEC_MAX_WORLD."""
    name = backend_name or backend()
    if name == "nccl":
        n = _cuda_devices() if device_count is None else device_count
        if world_size > n:
            return (
                f"world size {world_size} needs {world_size} CUDA GPUs under "
                f"SHARDSPEC_BACKEND=nccl (one per rank); this machine has {n}"
            )
    limit = int(os.environ.get("SHARDSPEC_MAX_WORLD", "4")) if max_world is None else max_world
    if world_size > limit:
        return f"world size {world_size} > SHARDSPEC_MAX_WORLD={limit}"
    return None


def rank_device(rank: int, backend_name: str) -> str:
    """The device of pool rank ``rank``: ``cuda:<rank>`` under NCCL (one GPU per rank, which
    :func:`skip_reason` guarantees exist), else ``cpu``."""
    return f"cuda:{rank}" if backend_name == "nccl" else "cpu"


def launcher_rank() -> int:
    """This process's rank when a launcher (torchrun) started it, else 0. The suite's driver is
    launcher rank 0; it starts its own pool of ranks, so other launcher ranks have nothing to
    do."""
    return int(os.environ.get("RANK", "0"))


class PoolError(RuntimeError):
    """The pool could not start (a worker failed to import, connect or join the group)."""


class RankError(AssertionError):
    """One or more ranks raised while running an example; carries their tracebacks."""


class RankCrash(BaseException):
    """A rank died or hung; the pool was torn down and restarts on the next example."""


@dataclass
class RankResult:
    """What one rank returned: a JSON value and tensors."""

    rank: int
    value: Any
    tensors: list[torch.Tensor] = field(default_factory=list)


@dataclass
class _Worker:
    rank: int
    proc: subprocess.Popen[bytes]
    log: Path
    sock: socket.socket | None = None


def _tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


class RankPool:
    """``world_size`` ranks with a process group, reused for every example.

    ``run(op, args, tensors)`` sends the same arguments to every rank (``per_rank_tensors``
    gives each rank its own tensors) and returns one :class:`RankResult` per rank, in rank
    order. The pool starts on first use and restarts itself after a crash.
    """

    def __init__(
        self,
        world_size: int,
        *,
        timeout: float | None = None,
        startup_timeout: float = 180.0,
        backend_name: str | None = None,
    ) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.timeout = default_timeout() if timeout is None else timeout
        self.startup_timeout = startup_timeout
        self.backend = backend_name or backend()
        self.workers: list[_Worker] = []
        self.generation = 0  # how many times the pool has (re)started
        self.examples = 0
        self._store: Any = None
        self._listener: socket.socket | None = None
        self._logdir: tempfile.TemporaryDirectory[str] | None = None
        _LIVE.add(self)

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return bool(self.workers)

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers]

    def start(self) -> None:
        if self.running:
            return
        import torch.distributed as dist

        deadline = time.monotonic() + self.startup_timeout
        token = secrets.token_hex(16)
        self._logdir = tempfile.TemporaryDirectory(prefix=f"shardspec-pool-w{self.world_size}-")
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=self.world_size)
        port = self._listener.getsockname()[1]
        store_host = "127.0.0.1"
        self._store = dist.TCPStore(store_host, 0, None, True, wait_for_workers=False)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        env.update(
            SHARDSPEC_POOL_ADDR=f"127.0.0.1:{port}",
            SHARDSPEC_POOL_TOKEN=token,
            SHARDSPEC_POOL_STORE=f"{store_host}:{self._store.port}",
            SHARDSPEC_POOL_WORLD=str(self.world_size),
            SHARDSPEC_POOL_BACKEND=self.backend,
            OMP_NUM_THREADS="1",
        )
        try:
            for rank in range(self.world_size):
                log = Path(self._logdir.name) / f"rank{rank}.log"
                with open(log, "wb") as fh:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", "conformance.worker"],
                        env={**env, "SHARDSPEC_POOL_RANK": str(rank)},
                        cwd=str(ROOT),
                        stdin=subprocess.DEVNULL,
                        stdout=fh,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                self.workers.append(_Worker(rank, proc, log))
            self._accept(token, deadline)
            for w in self.workers:
                header, _ = self._recv(w, deadline, what="start-up")
                if header.get("kind") != "ready":
                    raise PoolError(f"rank {w.rank} sent {header!r} instead of ready")
        except BaseException as e:
            logs = self._logs()
            self._kill()
            if isinstance(e, PoolError | RankCrash):
                raise PoolError(f"{e}\n{logs}") from None
            raise
        self.generation += 1

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

    def _check_alive(self, workers: Any, what: str) -> None:
        for w in workers:
            code = w.proc.poll()
            if code is not None:
                raise PoolError(
                    f"rank {w.rank} exited with code {code} during {what}:\n{_tail(w.log)}"
                )

    def _logs(self) -> str:
        parts = []
        for w in self.workers:
            tail = _tail(w.log)
            if tail:
                parts.append(f"--- rank {w.rank} output ---\n{tail}")
        return "\n".join(parts)

    def _kill(self) -> None:
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
        self._kill()

    def restart(self) -> None:
        self._kill()
        self.start()

    def __enter__(self) -> RankPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- dispatch ------------------------------------------------------------------------
    def _recv(
        self, w: _Worker, deadline: float, what: str
    ) -> tuple[dict[str, Any], list[bytearray]]:
        assert w.sock is not None
        sel = selectors.DefaultSelector()
        sel.register(w.sock, selectors.EVENT_READ)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                if sel.select(min(left, 0.25)):
                    break
                if w.proc.poll() is not None:
                    raise EOFError
        finally:
            sel.close()
        w.sock.settimeout(max(deadline - time.monotonic(), 0.05))
        try:
            return recv_frame(w.sock)
        finally:
            w.sock.settimeout(None)

    def run(
        self,
        op: str,
        args: dict[str, Any] | None = None,
        tensors: Sequence[torch.Tensor] = (),
        *,
        per_rank_tensors: Sequence[Sequence[torch.Tensor]] | None = None,
        example: str | None = None,
        timeout: float | None = None,
    ) -> list[RankResult]:
        """Run ``op`` on every rank; return each rank's result, in rank order.

        ``example`` describes the example in failure messages (default: op and args).
        """
        args = dict(args or {})
        desc = example if example is not None else f"{op}({args})"
        if not self.running:
            self.start()
        self.examples += 1
        timeout = self.timeout if timeout is None else timeout
        if per_rank_tensors is not None and len(per_rank_tensors) != self.world_size:
            raise ValueError(
                f"per_rank_tensors has {len(per_rank_tensors)} entries for {self.world_size} ranks"
            )
        frames = []
        for w in self.workers:
            ts = per_rank_tensors[w.rank] if per_rank_tensors is not None else tensors
            descs, bufs = [], []
            for t in ts:
                d, b = encode_tensor(t)
                descs.append(d)
                bufs.append(b)
            frames.append(({"kind": "run", "op": op, "args": args, "tensors": descs}, bufs))
        deadline = time.monotonic() + timeout
        try:
            for w, (header, bufs) in zip(self.workers, frames):
                assert w.sock is not None
                send_frame(w.sock, header, bufs)
        except OSError as e:
            self._crash(f"sending to a rank failed ({e})", desc, [])

        replies: dict[int, dict[str, Any]] = {}
        outs: dict[int, list[torch.Tensor]] = {}
        sel = selectors.DefaultSelector()
        by_fd = {}
        for w in self.workers:
            assert w.sock is not None
            sel.register(w.sock, selectors.EVENT_READ, w)
            by_fd[w.rank] = w
        failed_in_collective = False
        try:
            while len(replies) < self.world_size:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(by_fd) - set(replies))
                    if failed_in_collective:
                        break  # a rank raised and left the others stuck: report the raise
                    self._crash(
                        f"rank(s) {missing} did not answer within {timeout:g} s "
                        f"(SHARDSPEC_POOL_TIMEOUT)",
                        desc,
                        missing,
                        replies,
                    )
                events = sel.select(min(left, 0.5))
                if not events:
                    for w in self.workers:
                        if w.rank not in replies and w.proc.poll() is not None:
                            self._crash(
                                f"rank {w.rank} died (exit code {w.proc.returncode})",
                                desc,
                                [w.rank],
                                replies,
                            )
                    continue
                for key, _ in events:
                    w = key.data
                    try:
                        # readable already: read the frame, bounded by the example's deadline
                        w.sock.settimeout(max(deadline - time.monotonic(), 0.05))
                        header, bufs = recv_frame(w.sock)
                        w.sock.settimeout(None)
                    except TimeoutError:
                        raise
                    except (EOFError, OSError):
                        code = w.proc.poll()
                        if code is None:
                            with contextlib.suppress(subprocess.TimeoutExpired):
                                code = w.proc.wait(timeout=1)
                        self._crash(
                            f"rank {w.rank} died (exit code {code})", desc, [w.rank], replies
                        )
                    sel.unregister(w.sock)
                    replies[w.rank] = header
                    outs[w.rank] = [
                        decode_tensor(d, b) for d, b in zip(header.get("tensors", []), bufs)
                    ]
                    if not header.get("ok") and header.get("phase") == "collective":
                        failed_in_collective = True
                        # The others may be stuck in the collective this rank left: give them
                        # a moment to fail too, then restart rather than wait for the timeout.
                        deadline = min(deadline, time.monotonic() + min(1.0, timeout))
        except TimeoutError:
            missing = sorted(set(by_fd) - set(replies))
            self._crash(f"rank(s) {missing} stopped mid-answer", desc, missing, replies)
        finally:
            sel.close()
        errors = {r: h for r, h in replies.items() if not h.get("ok")}
        if errors:
            stuck = sorted(set(by_fd) - set(replies))
            # Every rank raising alike (a deterministic error after the collectives, say)
            # leaves the group consistent; some ranks stuck or done while others raised may
            # leave data in flight, so the pool restarts then.
            failed_in_collective = failed_in_collective and (
                bool(stuck) or len(errors) < self.world_size
            )
            if failed_in_collective:
                self._kill()  # the process group may be broken; restart on the next example
            message = self._error_message(op, desc, errors)
            if stuck:
                message += f"\nranks {stuck} were left waiting in the collective"
            if failed_in_collective:
                message += "\n(the pool was restarted: a rank left a collective half-done)"
            raise RankError(message)
        return [RankResult(r, replies[r].get("value"), outs[r]) for r in range(self.world_size)]

    def _error_message(self, op: str, desc: str, errors: dict[int, dict[str, Any]]) -> str:
        raised = {r: h for r, h in errors.items() if not h.get("aborted")}
        lines = [f"{len(raised)} of {self.world_size} rank(s) raised in {op!r} [{desc}]"]
        for r, h in sorted(raised.items()):
            lines.append(f"--- rank {r} ({h.get('phase')}) ---\n{h.get('error', '').rstrip()}")
        aborted = sorted(set(errors) - set(raised))
        if aborted:
            lines.append(f"ranks {aborted} stopped before the collective because of the above")
        return "\n".join(lines)

    def _crash(
        self,
        what: str,
        desc: str,
        ranks: list[int],
        replies: dict[int, dict[str, Any]] | None = None,
    ) -> Any:
        logs = "\n".join(
            f"--- rank {w.rank} output ---\n{_tail(w.log)}"
            for w in self.workers
            if w.rank in ranks and _tail(w.log)
        )
        others = ""
        for r, h in sorted((replies or {}).items()):
            if not h.get("ok") and not h.get("aborted"):
                others += f"\n--- rank {r} raised ---\n{h.get('error', '').rstrip()}"
        self._kill()
        raise RankCrash(
            f"{what} in a pool of {self.world_size} [{desc}]; the pool was torn down and "
            f"restarts on the next example{others}" + (f"\n{logs}" if logs else "")
        )


_LIVE: weakref.WeakSet[RankPool] = weakref.WeakSet()
_POOLS: dict[int, RankPool] = {}


def get_pool(world_size: int) -> RankPool:
    """The process-wide pool of ``world_size`` ranks (started on first use)."""
    pool = _POOLS.get(world_size)
    if pool is None:
        pool = _POOLS[world_size] = RankPool(world_size)
    return pool


def shutdown_pools() -> None:
    for pool in list(_LIVE):
        pool.close()
    _POOLS.clear()


atexit.register(shutdown_pools)
