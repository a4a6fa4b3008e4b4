"""A pool of local gloo ranks for tests: start W processes once, run many checks on them.

Spawning a gloo world costs seconds, so a test module (or session) starts one
:class:`RankPool` and sends it every check::

    with RankPool(4, timeout=120) as pool:
        results = pool.run(check, shape, dtype)  # check(rank, world, shape, dtype) per rank

``fn`` must be a module-level function the ranks can import (the rank processes are started
with ``spawn`` and inherit the driver's ``sys.path``). Its first two arguments are the rank
and the world size; the default process group (gloo) is initialised before it runs and stays
up between calls.

What the pool guarantees:

- Free ports: the driver owns the ``TCPStore`` (loopback, port chosen by the OS), so
  concurrent test runs never race for a port.
- Errors: any exception on a rank, ``BaseException`` included (DCP's ``CheckpointException``
  is one), comes back as :class:`RankError` with the rank's traceback; :meth:`RankPool.run_all`
  returns it per rank instead.
- Hangs: a call that does not complete within ``timeout`` seconds, or whose other ranks do
  not answer within ``error_grace`` seconds of a rank's error (they are probably stuck in a
  collective the failed rank never joined), kills the pool and raises. The next call starts
  a fresh pool.
- Death: a rank whose process exits mid-call (a gloo abort kills the process) raises
  :class:`RankDied`, and the pool is killed.
- No orphans: :meth:`RankPool.close` (also on leaving a ``with`` block) stops every rank,
  killing those that do not exit; the processes are daemonic, so they also die with the driver.

Security: functions, arguments and results travel between the driver and its own child
processes as pickles over ``multiprocessing`` pipes. This is for local tests only; never
point it at data or peers you do not trust.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection, wait
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed import TCPStore  # type: ignore[attr-defined]

__all__ = ["RankDied", "RankError", "RankPool"]


class RankError(Exception):
    """An exception raised on a rank, carried back to the driver with its traceback."""

    def __init__(self, rank: int, type_name: str, message: str, tb: str) -> None:
        super().__init__(f"rank {rank} raised {type_name}: {message}\n{tb}")
        self.rank = rank
        self.type_name = type_name
        self.message = message
        self.traceback = tb


class RankDied(RuntimeError):
    """A rank's process exited during a call (a gloo abort kills the process)."""


def _worker(rank: int, world: int, port: int, env: dict[str, str], conn: Connection) -> None:
    os.environ.update(env)
    torch.set_num_threads(1)
    store = TCPStore("127.0.0.1", port, world + 1, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        while True:
            msg = conn.recv()
            if msg is None:
                break
            fn, args = msg
            try:
                answer: tuple[Any, ...] = ("ok", fn(rank, world, *args))
            except BaseException as e:  # DCP's CheckpointException is a BaseException
                answer = ("err", type(e).__name__, str(e), traceback.format_exc())
            try:
                conn.send(answer)
            except Exception as e:  # the result does not pickle: say so instead of dying
                conn.send(("err", type(e).__name__, f"cannot send the result: {e}", ""))
    finally:
        dist.destroy_process_group()


class RankPool:
    """``world`` gloo ranks in spawned processes, kept up between calls.

    ``local_size`` sets ``LOCAL_WORLD_SIZE`` on every rank (ranks per host, e.g. for
    TorchRec's host-aware sharding); ``env`` adds any other environment variables. Both are
    applied before the process group is created.
    """

    def __init__(
        self,
        world: int,
        *,
        timeout: float = 300.0,
        local_size: int | None = None,
        env: Mapping[str, str] | None = None,
        error_grace: float = 15.0,
    ) -> None:
        if world < 1:
            raise ValueError(f"world must be at least 1, got {world}")
        if local_size is not None and not 1 <= local_size <= world:
            raise ValueError(f"local_size must be in [1, {world}], got {local_size}")
        self.world = world
        self.timeout = timeout
        self.error_grace = error_grace
        self.env = dict(env or {})
        if local_size is not None:
            self.env["LOCAL_WORLD_SIZE"] = str(local_size)
        self._store: TCPStore | None = None
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        self._closed = False
        self._start()

    def _start(self) -> None:
        # world + 1 participants: the ranks and this driver, which owns the listening socket.
        self._store = TCPStore(
            "127.0.0.1", 0, self.world + 1, is_master=True, wait_for_workers=False
        )
        ctx = mp.get_context("spawn")
        for r in range(self.world):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=_worker,
                args=(r, self.world, self._store.port, self.env, child),
                daemon=True,
            )
            p.start()
            # Only the rank holds the child end, so its death shows as EOF on ours.
            child.close()
            self._conns.append(parent)
            self._procs.append(p)

    @property
    def alive(self) -> bool:
        """Whether every rank's process is running."""
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    def run(
        self,
        fn: Callable[..., Any],
        *args: Any,
        per_rank: Sequence[tuple[Any, ...]] | None = None,
    ) -> list[Any]:
        """``fn(rank, world, *per_rank[rank], *args)`` on every rank; the results by rank.

        Raises the lowest rank's :class:`RankError` if any rank raised; :class:`RankDied` or
        ``TimeoutError`` (after killing the pool) as described in the module docstring.
        """
        answers = self._call(fn, args, per_rank, raise_first_error=True)
        return [a[1] for a in answers]

    def run_all(
        self,
        fn: Callable[..., Any],
        *args: Any,
        per_rank: Sequence[tuple[Any, ...]] | None = None,
    ) -> list[tuple[Any, ...]]:
        """Like :meth:`run`, but returns every rank's ``("ok", value)`` or
        ``("err", type_name, message)``, for tests that expect ranks to raise."""
        answers = self._call(fn, args, per_rank, raise_first_error=False)
        return [a if a[0] == "ok" else a[:3] for a in answers]

    def _call(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        per_rank: Sequence[tuple[Any, ...]] | None,
        *,
        raise_first_error: bool,
    ) -> list[tuple[Any, ...]]:
        if self._closed:
            raise RuntimeError("the RankPool is closed")
        if per_rank is not None and len(per_rank) != self.world:
            raise ValueError(f"per_rank has {len(per_rank)} entries for {self.world} ranks")
        if not self._procs:
            self._start()  # the previous call killed the pool
        for r, conn in enumerate(self._conns):
            conn.send((fn, (*per_rank[r], *args) if per_rank is not None else args))
        answers = self._collect()
        errors = [RankError(r, *a[1:]) for r, a in enumerate(answers) if a[0] == "err"]
        if errors and raise_first_error:
            raise errors[0]
        return answers

    def _collect(self) -> list[tuple[Any, ...]]:
        answers: dict[int, tuple[Any, ...]] = {}
        deadline = time.monotonic() + self.timeout
        by_conn = {c: r for r, c in enumerate(self._conns)}
        by_sentinel = {p.sentinel: r for r, p in enumerate(self._procs)}
        while len(answers) < self.world:
            left = deadline - time.monotonic()
            if any(a[0] == "err" for a in answers.values()):
                left = min(left, self.error_grace)
            pending = [r for r in range(self.world) if r not in answers]
            waitables: list[Any] = [self._conns[r] for r in pending]
            waitables += [self._procs[r].sentinel for r in pending]
            ready = wait(waitables, timeout=max(left, 0.0))
            if not ready:
                self._stop(force=True)
                missing = [r for r in range(self.world) if r not in answers]
                errors = [RankError(r, *a[1:]) for r, a in sorted(answers.items()) if a[0] == "err"]
                if errors:
                    raise TimeoutError(
                        f"ranks {missing} did not answer within {self.error_grace} s of rank "
                        f"{errors[0].rank}'s error (stuck in a collective?); the pool was "
                        f"killed"
                    ) from errors[0]
                raise TimeoutError(
                    f"ranks {missing} did not answer within {self.timeout} s (hang?); "
                    f"the pool was killed"
                )
            for w in ready:
                r = by_conn[w] if isinstance(w, Connection) else by_sentinel[w]
                if r in answers:
                    continue
                conn = self._conns[r]
                try:
                    # A rank that answered and then exited leaves its answer in the pipe.
                    if conn.poll(0):
                        answers[r] = conn.recv()
                        continue
                except (EOFError, OSError):
                    pass
                if isinstance(w, Connection) or not self._procs[r].is_alive():
                    code = self._procs[r].exitcode
                    self._stop(force=True)
                    raise RankDied(f"rank {r} died during the call (exit code {code})")
        return [answers[r] for r in range(self.world)]

    def close(self, *, force: bool = False) -> None:
        """Stop every rank (asking them to leave the process group first unless ``force``)."""
        self._closed = True
        self._stop(force=force)

    def _stop(self, *, force: bool) -> None:
        if not force:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.send(None)
        for p in self._procs:
            p.join(timeout=0 if force else 20)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for conn in self._conns:
            conn.close()
        self._conns, self._procs, self._store = [], [], None

    def __enter__(self) -> RankPool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(force=exc_type is not None)
