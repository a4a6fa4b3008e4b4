"""Start W gloo ranks once and run many checks on them (spawning a world costs seconds).

The driver owns the TCPStore (port chosen by the OS, loopback only). ``run`` sends every
rank a module-level function and arguments over a pipe and waits, with a timeout, for every
answer; an exception on a rank comes back as :class:`RankError` with its traceback; a rank
that does not answer fails the call and the pool is killed (no orphans).
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class RankError(Exception):
    def __init__(self, rank: int, type_name: str, message: str, tb: str) -> None:
        super().__init__(f"rank {rank} raised {type_name}: {message}\n{tb}")
        self.rank, self.type_name, self.message = rank, type_name, message


def _worker(rank: int, world: int, port: int, local_size: int, conn: Any) -> None:
    # TorchRec reads the host size from LOCAL_WORLD_SIZE (table_row_wise, grid_shard).
    os.environ["LOCAL_WORLD_SIZE"] = str(local_size)
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
            except BaseException as e:  # CheckpointException is a BaseException
                conn.send(("err", type(e).__name__, str(e), traceback.format_exc()))
    finally:
        dist.destroy_process_group()


class RankPool:
    def __init__(self, world: int, *, local_size: int | None = None, timeout: float = 300.0):
        self.world, self.local_size, self.timeout = world, local_size or world, timeout
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        self._start()

    def _start(self) -> None:
        self._store = dist.TCPStore(
            "127.0.0.1", 0, self.world + 1, is_master=True, wait_for_workers=False
        )
        ctx = mp.get_context("spawn")
        for r in range(self.world):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=_worker,
                args=(r, self.world, self._store.port, self.local_size, child),
                daemon=True,
            )
            p.start()
            self._conns.append(parent)
            self._procs.append(p)

    def run(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """``fn(rank, world, *args)`` on every rank; the results by rank.

        A rank that raises while the others wait in a collective would hang them: once one
        rank has answered with an error, the others get a short grace period, then the pool
        is killed and restarted for the next call, and the error is raised.
        """
        if not self._procs:
            self._start()
        for conn in self._conns:
            conn.send((fn, args))
        answers: dict[int, Any] = {}
        deadline = time.monotonic() + self.timeout
        while len(answers) < self.world:
            pending = [c for r, c in enumerate(self._conns) if r not in answers]
            left = deadline - time.monotonic()
            if any(a[0] == "err" for a in answers.values()):
                left = min(left, 15.0)
            ready = wait(pending, timeout=max(left, 0))
            if not ready:
                self.close(force=True)
                errors = [RankError(r, *a[1:]) for r, a in answers.items() if a[0] == "err"]
                if errors:
                    raise errors[0]
                missing = sorted(set(range(self.world)) - set(answers))
                raise TimeoutError(f"ranks {missing} did not answer within {self.timeout} s")
            for c in ready:
                answers[self._conns.index(c)] = c.recv()  # type: ignore[union-attr]
        errors = [RankError(r, *answers[r][1:]) for r in sorted(answers) if answers[r][0] == "err"]
        if errors:
            raise errors[0]
        return [answers[r][1] for r in range(self.world)]

    def close(self, *, force: bool = False) -> None:
        if not force:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.send(None)
        for p in self._procs:
            p.join(timeout=0 if force else 20)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self._conns, self._procs = [], []
