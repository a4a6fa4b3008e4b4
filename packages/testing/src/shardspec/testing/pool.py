"""The rank pool: W long-lived ranks with a process group, driven one call at a time.

Spawning a process group costs seconds; a property test needs hundreds of examples. So each
world size gets W worker processes (``python -m shardspec.testing.worker``) started once, each
with an initialised process group (gloo on loopback, or NCCL with one GPU per rank), and the
driver (the pytest process) sends each call to them over :mod:`.protocol` (JSON + raw bytes,
no pickle anywhere):

- :meth:`RankPool.run` runs a *named operation* (``"area.name"`` from the registry in
  :mod:`.ops`, filled by the modules named in ``ops=``) with JSON arguments and tensors and
  returns one :class:`RankResult` per rank;
- :meth:`RankPool.call` runs a *rank function* named ``"module:function"`` (or given as a
  module-level function, of which only the name travels) as ``function(rank, world, *args)``
  with arguments and result carried by :mod:`.values`; :meth:`RankPool.call_all` returns each
  rank's value or :class:`RankFailure` instead of raising.

Failure handling, which is what makes the pool usable under Hypothesis:

- A rank raises: :class:`RankError` (an ``AssertionError``) carrying every failing rank's
  traceback and the example, so Hypothesis shrinks it like any failure. Collective operations
  validate their inputs on every rank first and agree on the outcome with one small
  all-reduce, so one rank refusing its inputs never leaves the others inside a collective. A
  rank that raises *inside* a collective (or in any operation or rank function: a peer's
  own operation may hold collectives it did not declare) may strand the others: they get
  ``error_grace`` seconds to answer, then the pool is restarted and the :class:`RankError`
  says so ("rank 0 raised ValueError: ...; rank 1 still waiting in a collective after 1.0 s").
- A rank dies or hangs: detected by end-of-stream or by the per-call timeout
  (``SHARDSPEC_POOL_TIMEOUT`` seconds, default 10); the pool is killed and restarted on the
  next call, and :class:`RankCrash` is raised with the example. ``RankCrash`` derives from
  ``BaseException`` on purpose: Hypothesis does not shrink it (each shrink step would cost a
  timeout plus a restart), while pytest still reports it as that test's failure and goes on.
- No orphans: workers run in their own process groups and are killed by group on teardown
  and at exit; each worker also asks the kernel to kill it when the driver dies
  (``PR_SET_PDEATHSIG``) and exits when its socket to the driver closes.

Loopback only: the driver listens on 127.0.0.1 port 0, binds the store's listening socket to
127.0.0.1 itself and hands it to ``TCPStore`` (which, given a host name, listens on every
interface), and the ranks' gloo pairs bind to the loopback device (``GLOO_SOCKET_IFNAME=lo``).
Ports come from the OS, so concurrent pools never collide; a random token authenticates the
workers that connect back.
"""

from __future__ import annotations

import atexit
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
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .devices import backend, default_timeout, device_type
from .loopback import loopback_store
from .ops import function_name
from .protocol import decode_tensor, encode_tensor, recv_frame, send_frame
from .timing import scaled, slowness
from .values import decode_value, encode_value

__all__ = [
    "PoolError",
    "RankCrash",
    "RankError",
    "RankFailure",
    "RankPool",
    "RankResult",
    "get_pool",
    "shutdown_pools",
]


class PoolError(RuntimeError):
    """The pool could not start (a worker failed to import, connect or join the group)."""


class RankError(AssertionError):
    """One or more ranks raised; the message carries every failing rank's traceback and the
    example, and :attr:`failures` each rank's :class:`RankFailure`."""

    def __init__(self, message: str, failures: Sequence[RankFailure] = ()) -> None:
        super().__init__(message)
        self.failures = list(failures)

    @property
    def rank(self) -> int:
        """The lowest rank that raised."""
        return self.failures[0].rank if self.failures else -1


class RankCrash(BaseException):
    """A rank died or hung; the pool was torn down and restarts on the next call."""


@dataclass
class RankResult:
    """What one rank returned from a named operation: a JSON value and tensors."""

    rank: int
    value: Any
    tensors: list[torch.Tensor] = field(default_factory=list)


@dataclass
class RankFailure:
    """What one rank raised: the exception's type name, message and traceback."""

    rank: int
    type_name: str
    message: str
    traceback: str
    phase: str


@dataclass
class _Worker:
    rank: int
    proc: subprocess.Popen[bytes]
    log: Path | None
    sock: socket.socket | None = None


def _tail(path: Path | None, n: int = 15) -> str:
    if path is None:
        return ""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def _failure(rank: int, reply: dict[str, Any]) -> RankFailure:
    tb = str(reply.get("error", ""))
    last = tb.strip().splitlines()[-1] if tb.strip() else ""
    type_name, _, message = last.partition(": ")
    return RankFailure(
        rank,
        str(reply.get("type", type_name)),
        str(reply.get("message", message)),
        tb,
        str(reply.get("phase", "")),
    )


def _stranded(
    raised: dict[int, dict[str, Any]], stuck: list[int], replies: dict[int, dict[str, Any]]
) -> str:
    """The finding when ranks raised and left the others in a collective: "rank 0 raised
    ValueError: msg; rank 1 still waiting in a collective after 1.0 s"."""
    said = []
    for r, h in sorted(raised.items()):
        f = _failure(r, h)
        said.append(f"rank {r} raised {f.type_name}: {f.message.strip()}")
    waited = max((float(h.get("stranded_s", 0.0)) for h in replies.values()), default=0.0)
    who = f"rank {stuck[0]}" if len(stuck) == 1 else f"ranks {stuck}"
    return f"{'; '.join(said)}; {who} still waiting in a collective after {waited:.1f} s"


class RankPool:
    """``world_size`` ranks with a process group, reused for every call.

    Options: ``timeout`` per call (default ``SHARDSPEC_POOL_TIMEOUT`` or 10 s); ``error_grace``
    seconds the other ranks get to answer once one rank raised inside a collective (default
    ``min(1, timeout)``); ``ops`` modules the ranks import to register named operations;
    ``local_size`` sets ``LOCAL_WORLD_SIZE`` (ranks per host, e.g. for TorchRec's host-aware
    sharding); ``env`` adds environment variables; ``backend_name`` / ``device`` override
    ``SHARDSPEC_BACKEND`` / ``SHARDSPEC_DEVICE``. The pool starts on first use and restarts
    itself after a crash.
    """

    def __init__(
        self,
        world_size: int,
        *,
        timeout: float | None = None,
        startup_timeout: float = 180.0,
        error_grace: float | None = None,
        backend_name: str | None = None,
        device: str | None = None,
        ops: Sequence[str] = (),
        local_size: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if local_size is not None and not 1 <= local_size <= world_size:
            raise ValueError(f"local_size must be in [1, {world_size}], got {local_size}")
        self.world_size = world_size
        self.timeout = default_timeout() if timeout is None else timeout
        self.startup_timeout = startup_timeout
        self.error_grace = error_grace
        self.backend = backend_name or backend()
        self.device = device or device_type(self.backend)
        self.ops = tuple(ops)
        self.env = dict(env or {})
        if local_size is not None:
            self.env["LOCAL_WORLD_SIZE"] = str(local_size)
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

    @property
    def alive(self) -> bool:
        """Whether every rank's process is running."""
        return self.running and all(w.proc.poll() is None for w in self.workers)

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers]

    def start(self) -> None:
        if self.running:
            return
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
            SHARDSPEC_POOL_WORLD=str(self.world_size),
            SHARDSPEC_POOL_BACKEND=self.backend,
            SHARDSPEC_POOL_DEVICE=self.device,
            SHARDSPEC_POOL_OPS=",".join(self.ops),
            SHARDSPEC_POOL_SYSPATH=json.dumps([p for p in sys.path if p]),
            GLOO_SOCKET_IFNAME="lo",
            OMP_NUM_THREADS="1",
        )
        cwd = os.getcwd()
        try:
            for rank in range(self.world_size):
                log = Path(self._logdir.name) / f"rank{rank}.log"
                with open(log, "wb") as fh:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", "shardspec.testing.worker"],
                        env={**env, "SHARDSPEC_POOL_RANK": str(rank)},
                        cwd=cwd,
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
            if isinstance(e, PoolError | RankCrash | TimeoutError | EOFError | OSError):
                raise PoolError(
                    f"a pool of {self.world_size} did not start: {e!r}\n{logs}"
                ) from None
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
        """Run the named operation ``op`` on every rank; return each rank's result, in rank
        order. ``example`` describes the example in failure messages (default: op and args)."""
        args = dict(args or {})
        desc = example if example is not None else f"{op}({args})"
        if per_rank_tensors is not None and len(per_rank_tensors) != self.world_size:
            raise ValueError(
                f"per_rank_tensors has {len(per_rank_tensors)} entries for {self.world_size} ranks"
            )
        frames = []
        for rank in range(self.world_size):
            ts = per_rank_tensors[rank] if per_rank_tensors is not None else tensors
            descs, bufs = [], []
            for t in ts:
                d, b = encode_tensor(t)
                descs.append(d)
                bufs.append(b)
            frames.append(({"kind": "run", "op": op, "args": args, "tensors": descs}, bufs))
        replies, outs = self._dispatch(frames, desc, timeout)
        errors = {r: h for r, h in replies.items() if not h.get("ok")}
        if errors:
            raise RankError(
                self._error_message(op, desc, errors, replies),
                [_failure(r, h) for r, h in sorted(errors.items()) if not h.get("aborted")],
            )
        return [
            RankResult(
                r,
                replies[r].get("value"),
                [decode_tensor(d, b) for d, b in zip(replies[r].get("tensors", []), outs[r])],
            )
            for r in range(self.world_size)
        ]

    def call(
        self,
        fn: Callable[..., Any] | str,
        *args: Any,
        per_rank: Sequence[Sequence[Any]] | None = None,
        timeout: float | None = None,
    ) -> list[Any]:
        """``fn(rank, world, *per_rank[rank], *args)`` on every rank; the results by rank.
        Raises :class:`RankError` naming every rank that raised."""
        answers = self.call_all(fn, *args, per_rank=per_rank, timeout=timeout)
        failures = [a for a in answers if isinstance(a, RankFailure)]
        if failures:
            name = function_name(fn)
            lines = [f"{len(failures)} of {self.world_size} rank(s) raised in {name}"]
            for f in failures:
                lines.append(f"--- rank {f.rank} raised {f.type_name}: {f.message}\n{f.traceback}")
            raise RankError("\n".join(lines), failures)
        return answers

    def call_all(
        self,
        fn: Callable[..., Any] | str,
        *args: Any,
        per_rank: Sequence[Sequence[Any]] | None = None,
        timeout: float | None = None,
    ) -> list[Any]:
        """Like :meth:`call`, but returns each rank's value or :class:`RankFailure`, for tests
        that expect ranks to raise."""
        name = function_name(fn)
        if per_rank is not None and len(per_rank) != self.world_size:
            raise ValueError(f"per_rank has {len(per_rank)} entries for {self.world_size} ranks")
        frames = []
        for rank in range(self.world_size):
            bufs: list[bytes] = []
            full = (*per_rank[rank], *args) if per_rank is not None else args
            tree = encode_value(list(full), bufs, f"the arguments of {name}")
            frames.append(({"kind": "call", "fn": name, "args": tree}, bufs))
        replies, outs = self._dispatch(frames, name, timeout)
        stuck = sorted(set(range(self.world_size)) - set(replies))
        if stuck:
            failed = {r: h for r, h in replies.items() if not h.get("ok")}
            raise RankError(
                self._error_message(name, name, failed, replies) + "\n(the pool was restarted)",
                [_failure(r, h) for r, h in sorted(failed.items())],
            )
        return [
            decode_value(replies[r].get("value"), outs[r])
            if replies[r].get("ok")
            else _failure(r, replies[r])
            for r in range(self.world_size)
        ]

    def _dispatch(
        self,
        frames: list[tuple[dict[str, Any], list[bytes]]],
        desc: str,
        timeout: float | None,
    ) -> tuple[dict[int, dict[str, Any]], dict[int, list[bytearray]]]:
        """Send each rank its frame and gather the replies. A dead or silent rank is a
        :class:`RankCrash`; when a rank raised inside a collective and others stay silent
        past the grace period, the replies so far come back (without theirs) and the pool is
        killed, to restart on the next call."""
        if not self.running:
            self.start()
        self.examples += 1
        timeout = self.timeout if timeout is None else timeout
        grace = min(1.0, timeout) if self.error_grace is None else self.error_grace
        # The limits catch hangs, they do not measure speed: on a loaded machine they stretch
        # by how slowly it answers now (shardspec.testing.slowness), so load never fails a
        # call that would pass on an idle one.
        factor = slowness()
        grace *= factor
        deadline = time.monotonic() + timeout * factor
        try:
            for w, (header, bufs) in zip(self.workers, frames):
                assert w.sock is not None
                send_frame(w.sock, header, bufs)
        except OSError as e:
            self._crash(f"sending to a rank failed ({e})", desc, [])

        replies: dict[int, dict[str, Any]] = {}
        outs: dict[int, list[bytearray]] = {}
        sel = selectors.DefaultSelector()
        for w in self.workers:
            assert w.sock is not None
            sel.register(w.sock, selectors.EVENT_READ, w)
        failed_in_collective = False
        raised_at = 0.0
        try:
            while len(replies) < self.world_size:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(self.world_size)) - set(replies))
                    if failed_in_collective:
                        break  # a rank raised and left the others stuck: report the raise
                    self._crash(
                        f"rank(s) {missing} did not answer within {timeout:g} s "
                        f"(SHARDSPEC_POOL_TIMEOUT; x{factor:.1f} for this machine's load: "
                        f"{timeout * factor:.0f} s)",
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
                        # readable already: read the frame, bounded by the call's deadline
                        w.sock.settimeout(max(deadline - time.monotonic(), 0.05))
                        header, got = recv_frame(w.sock)
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
                    outs[w.rank] = got
                    # "run": a non-collective operation that raised may still have left the
                    # others in a collective of its own (an adapter's, say)
                    if not header.get("ok") and header.get("phase") in (
                        "collective",
                        "call",
                        "run",
                    ):
                        if not failed_in_collective:
                            raised_at = time.monotonic()
                        failed_in_collective = True
                        # The others may be stuck in the collective this rank left: give them
                        # a moment to fail too, then restart rather than wait for the timeout.
                        deadline = min(deadline, time.monotonic() + grace)
        except TimeoutError:
            missing = sorted(set(range(self.world_size)) - set(replies))
            self._crash(f"rank(s) {missing} stopped mid-answer", desc, missing, replies)
        finally:
            sel.close()
        errors = [r for r, h in replies.items() if not h.get("ok")]
        stuck = len(replies) < self.world_size
        # Every rank raising alike (a deterministic error after the collectives, say) leaves
        # the group consistent; a named collective with some ranks done while others raised
        # may leave data in flight, and ranks stuck always do: the pool restarts then.
        named_split = (
            any(h.get("phase") == "collective" for h in replies.values())
            and len(errors) < self.world_size
        )
        if failed_in_collective and (stuck or named_split):
            waited = time.monotonic() - raised_at
            self._kill()
            for h in replies.values():
                h["restarted"] = True
                if stuck:
                    h["stranded_s"] = waited
        return replies, outs

    def _error_message(
        self,
        op: str,
        desc: str,
        errors: dict[int, dict[str, Any]],
        replies: dict[int, dict[str, Any]],
    ) -> str:
        raised = {r: h for r, h in errors.items() if not h.get("aborted")}
        lines = [f"{len(raised)} of {self.world_size} rank(s) raised in {op!r} [{desc}]"]
        for r, h in sorted(raised.items()):
            lines.append(f"--- rank {r} ({h.get('phase')}) ---\n{h.get('error', '').rstrip()}")
        aborted = sorted(set(errors) - set(raised))
        if aborted:
            lines.append(f"ranks {aborted} stopped before the collective because of the above")
        stuck = sorted(set(range(self.world_size)) - set(replies))
        if stuck:
            lines.append(_stranded(raised, stuck, replies))
        if any(h.get("restarted") for h in replies.values()):
            lines.append("(the pool was restarted: a rank left a collective half-done)")
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
            f"restarts on the next call{others}" + (f"\n{logs}" if logs else "")
        )


_LIVE: weakref.WeakSet[RankPool] = weakref.WeakSet()
_POOLS: dict[tuple[Any, ...], RankPool] = {}


def get_pool(world_size: int, **options: Any) -> RankPool:
    """The process-wide pool of ``world_size`` ranks with these :class:`RankPool` options
    (started on first use, shut down at exit or by :func:`shutdown_pools`)."""
    from .launched import LaunchedPool, is_launched

    key = (world_size, json.dumps(options, sort_keys=True, default=str))
    pool = _POOLS.get(key)
    if pool is None:
        kind = LaunchedPool if is_launched() else RankPool
        pool = _POOLS[key] = kind(world_size, **options)
    return pool


def shutdown_pools() -> None:
    for pool in list(_LIVE):
        pool.close()
    _POOLS.clear()


atexit.register(shutdown_pools)
