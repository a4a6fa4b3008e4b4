"""The rank pool: W long-lived ranks with a process group, driven one call at a time.

Spawning a process group costs seconds; a property test needs hundreds of examples. So each
world size gets W worker processes (:mod:`.processes`) started once, each with an initialised
process group (gloo on loopback, or NCCL with one GPU per rank), and the driver (the pytest
process) sends each call to them over :mod:`.protocol` (JSON + raw bytes, no pickle anywhere):

- :meth:`RankPool.run` runs a *named operation* (``"area.name"`` from the registry in
  :mod:`.ops`, filled by the modules named in ``ops=``) with JSON arguments and tensors and
  returns one :class:`RankResult` per rank;
- :meth:`RankPool.call` runs a *rank function* named ``"module:function"`` (or given as a
  module-level function, of which only the name travels) as ``function(rank, world, *args)``
  with arguments and result carried by :mod:`.values`; :meth:`RankPool.call_all` returns each
  rank's value or :class:`RankFailure` instead of raising.

Failure handling, which is what makes the pool usable under Hypothesis (:mod:`.dispatch`
tells the cases apart):

- A rank raises: :class:`RankError` (an ``AssertionError``) carrying every failing rank's
  traceback and the example, so Hypothesis shrinks it like any failure. A rank that raises
  inside a collective (or in any operation or rank function: a peer's own operation may hold
  collectives it did not declare) may strand the others: they get ``error_grace`` seconds to
  answer, then the pool is restarted and the :class:`RankError` says so ("rank 0 raised
  ValueError: ...; rank 1 still waiting in a collective after 1.0 s").
- A rank dies or hangs: detected by end-of-stream or by the per-call timeout
  (``SHARDSPEC_POOL_TIMEOUT`` seconds, default 10); the pool is killed and restarted on the
  next call, and :class:`RankCrash` is raised with the example. ``RankCrash`` derives from
  ``BaseException`` on purpose: Hypothesis does not shrink it (each shrink step would cost a
  timeout plus a restart), while pytest still reports it as that test's failure and goes on.
"""

from __future__ import annotations

import atexit
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .devices import backend, default_timeout, device_type
from .dispatch import Frame, error_message, exchange
from .ops import function_name
from .processes import LocalRanks, Ranks
from .protocol import decode_tensor, encode_tensor
from .results import RankCrash, RankError, RankFailure, RankResult, failure_from
from .timing import slowness
from .values import decode_value, encode_value

__all__ = ["RankPool", "close_pools"]


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
        self.ranks = self._new_ranks()
        self.generation = 0  # how many times the pool has (re)started
        self.examples = 0
        _LIVE.add(self)

    def _new_ranks(self) -> Ranks:
        """The ranks this pool drives: worker processes on this host."""
        settings = {
            "SHARDSPEC_POOL_WORLD": str(self.world_size),
            "SHARDSPEC_POOL_BACKEND": self.backend,
            "SHARDSPEC_POOL_DEVICE": self.device,
            "SHARDSPEC_POOL_OPS": ",".join(self.ops),
        }
        return LocalRanks(
            self.world_size, settings=settings, env=self.env, startup_timeout=self.startup_timeout
        )

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.ranks.running

    @property
    def alive(self) -> bool:
        """Whether every rank's process is running."""
        return self.running and all(w.proc.poll() is None for w in self.ranks.workers)

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.ranks.workers]

    def start(self) -> None:
        if self.running:
            return
        self.ranks.start()
        self.generation += 1

    def close(self) -> None:
        """Stop the ranks (politely, then by force)."""
        self.ranks.close()

    def restart(self) -> None:
        self.ranks.kill()
        self.start()

    def __enter__(self) -> RankPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls ---------------------------------------------------------------------------
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
        frames: list[Frame] = []
        for rank in range(self.world_size):
            ts = per_rank_tensors[rank] if per_rank_tensors is not None else tensors
            descs, bufs = [], []
            for t in ts:
                d, b = encode_tensor(t)
                descs.append(d)
                bufs.append(b)
            frames.append(({"kind": "run", "op": op, "args": args, "tensors": descs}, bufs))
        replies, outs = self._exchange(frames, desc, timeout)
        errors = {r: h for r, h in replies.items() if not h.get("ok")}
        if errors:
            raise RankError(
                error_message(op, desc, errors, replies, self.world_size),
                [failure_from(r, h) for r, h in sorted(errors.items()) if not h.get("aborted")],
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
        frames: list[Frame] = []
        for rank in range(self.world_size):
            bufs: list[bytes] = []
            full = (*per_rank[rank], *args) if per_rank is not None else args
            tree = encode_value(list(full), bufs, f"the arguments of {name}")
            frames.append(({"kind": "call", "fn": name, "args": tree}, bufs))
        replies, outs = self._exchange(frames, name, timeout)
        stuck = sorted(set(range(self.world_size)) - set(replies))
        if stuck:
            failed = {r: h for r, h in replies.items() if not h.get("ok")}
            raise RankError(
                error_message(name, name, failed, replies, self.world_size)
                + "\n(the pool was restarted)",
                [failure_from(r, h) for r, h in sorted(failed.items())],
            )
        return [
            decode_value(replies[r].get("value"), outs[r])
            if replies[r].get("ok")
            else failure_from(r, replies[r])
            for r in range(self.world_size)
        ]

    def _exchange(
        self, frames: list[Frame], desc: str, timeout: float | None
    ) -> tuple[dict[int, dict[str, Any]], dict[int, list[bytearray]]]:
        """One call on every rank (:func:`.dispatch.exchange`), starting the pool first and
        killing it after a crash or a collective left half-done, to restart on the next call."""
        if not self.running:
            self.start()
        self.examples += 1
        timeout = self.timeout if timeout is None else timeout
        grace = min(1.0, timeout) if self.error_grace is None else self.error_grace
        try:
            done = exchange(
                self.ranks.workers, frames, desc, timeout=timeout, grace=grace, factor=slowness()
            )
        except RankCrash:
            self.ranks.kill()
            raise
        if done.restart:
            self.ranks.kill()
        return done.replies, done.outs


_LIVE: weakref.WeakSet[RankPool] = weakref.WeakSet()


def close_pools() -> None:
    """Close every pool of this process (at exit, and from ``shutdown_pools``)."""
    for pool in list(_LIVE):
        pool.close()


atexit.register(close_pools)
