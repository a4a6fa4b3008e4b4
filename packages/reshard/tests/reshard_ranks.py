"""A small pool of gloo ranks for the executor tests: start W processes once, run many cases.

Spawning 4 gloo ranks costs seconds, so a test module starts one pool and dispatches every
case to it. The driver holds the TCPStore (port chosen by the OS, loopback only), so
concurrent test runs never race for a port. Each call sends every rank a module-level
function and its arguments over a pipe and waits (with a timeout) for all answers; a rank
that hangs or dies fails the call with a clear error and the pool is shut down.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class RankError(Exception):
    """An exception raised on a rank, carried back to the driver (type name and message)."""

    def __init__(self, rank: int, type_name: str, message: str, tb: str) -> None:
        super().__init__(f"rank {rank} raised {type_name}: {message}\n{tb}")
        self.rank = rank
        self.type_name = type_name
        self.message = message


def _worker(rank: int, world: int, port: int, conn: Any) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        while True:
            msg = conn.recv()
            if msg is None:
                break
            fn, args = msg
            try:
                conn.send(("ok", fn(rank, world, *args)))
            except Exception as e:
                conn.send(("err", type(e).__name__, str(e), traceback.format_exc()))
    finally:
        dist.destroy_process_group()


class RankDied(Exception):
    """A rank's process exited mid-call (a gloo abort kills the process)."""


class RankPool:
    def __init__(self, world: int, *, timeout: float = 120.0) -> None:
        self.world = world
        self.timeout = timeout
        # world + 1 participants: the ranks and this driver, which owns the listening socket.
        self._store = dist.TCPStore(
            "127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False
        )
        ctx = mp.get_context("spawn")
        self._conns = []
        self._procs = []
        for r in range(world):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(r, world, self._store.port, child), daemon=True)
            p.start()
            self._conns.append(parent)
            self._procs.append(p)

    def run(
        self, fn: Callable[..., Any], per_rank: Sequence[tuple[Any, ...]] | None = None, *args: Any
    ) -> list[Any]:
        """``fn(rank, world, *per_rank[rank])`` (or ``*args``) on every rank; results by rank.

        Raises the first rank's RankError if any rank raised; TimeoutError (after shutting
        the pool down) if a rank does not answer in time.
        """
        for r, conn in enumerate(self._conns):
            conn.send((fn, per_rank[r] if per_rank is not None else args))
        answers = []
        for r, conn in enumerate(self._conns):
            answers.append(self._answer(r, conn))
        errors = [RankError(r, *a[1:]) for r, a in enumerate(answers) if a[0] == "err"]
        if errors:
            raise errors[0]
        return [a[1] for a in answers]

    def run_all(
        self, fn: Callable[..., Any], per_rank: Sequence[tuple[Any, ...]] | None = None, *args: Any
    ) -> list[tuple[str, Any]]:
        """Like :meth:`run`, but returns every rank's ("ok", value) or ("err", type, message)."""
        for r, conn in enumerate(self._conns):
            conn.send((fn, per_rank[r] if per_rank is not None else args))
        answers = []
        for r, conn in enumerate(self._conns):
            a = self._answer(r, conn)
            answers.append(("ok", a[1]) if a[0] == "ok" else ("err", a[1], a[2]))
        return answers

    def _answer(self, rank: int, conn: Any) -> Any:
        try:
            ready = conn.poll(self.timeout)
            if ready:
                return conn.recv()
        except (EOFError, ConnectionError) as e:
            self.close(force=True)
            raise RankDied(f"rank {rank} died (its process exited): {e!r}") from None
        self.close(force=True)
        raise TimeoutError(f"rank {rank} did not answer within {self.timeout} s (hang?)")

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    def close(self, *, force: bool = False) -> None:
        if not force:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.send(None)
        for p in self._procs:
            p.join(timeout=0 if force else 10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self._conns = []
        self._procs = []
