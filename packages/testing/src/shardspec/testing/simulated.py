"""Simulated worlds: W ranks as W threads of this process, on torch's threaded process group.

``torch.testing._internal.distributed.multi_threaded_pg`` (what torch's own DTensor tests run
on) gives each thread its own default process group of backend ``threaded``, whose
collectives (``all_to_all_single``, ``all_gather``, ``all_reduce``, scatter, broadcast) move
tensors between the threads. The named operations of :mod:`.ops` and rank functions run on it
unchanged, agreement check included, so a 2-core machine runs worlds of 8 to 1024 ranks: 3-D
and 4-D meshes, HSDP x TP, rank numbers above 255.

:class:`SimulatedPool` has the interface of :class:`~shardspec.testing.pool.RankPool`
(``run``, ``call``, ``call_all``, ``close``) and the same failure handling: a rank that raises
fails the call with its traceback (:class:`RankError`); a rank that hangs past the timeout, or
is left inside a collective a raising rank never joined, is released by the threaded group's
termination event, and the world is rebuilt for the next call (:class:`RankCrash` for a
hang). Only one simulated world runs collectives at a time (the driver is synchronous).
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .ops import Context, execute, function_name, resolve_function
from .results import RankCrash, RankError, RankFailure, RankResult, failure_from
from .timing import scaled, slowness

__all__ = ["SimulatedPool", "get_simulated_pool", "shutdown_simulated"]

_INSTALL_LOCK = threading.Lock()
_installed = False
_torchs_plugin: Any = None


def _install() -> None:
    # What torch's MultiThreadedTestCase does: a thread-local process-group world, and group
    # names registered per thread (every thread's default group is named "0").
    global _installed, _torchs_plugin
    with _INSTALL_LOCK:
        if not _installed:
            import torch.distributed as dist
            from torch.testing._internal.distributed import multi_threaded_pg

            torch._C._distributed_c10d._set_thread_isolation_mode(True)  # type: ignore[attr-defined]
            multi_threaded_pg._install_threaded_pg()  # type: ignore[no-untyped-call]
            # looked up by name at each call of ProcessLocalGroup.all_to_all_single
            multi_threaded_pg.AllToAllBase = _SparseAllToAllBase  # type: ignore[misc,assignment]
            # The threaded group registers no backend per device, so torch's code that asks
            # a group for its device (FSDP's _create_chunk_sharded_tensor through
            # _get_pg_default_device) raised "no backend has been registered" where a gloo
            # group answers cpu. Simulated ranks hold CPU tensors: say so, as gloo would.
            # ShardedTensor asks a group's backend name for the device of a rank that holds
            # no shard: "gloo" is the CPU, anything else CUDA (tensor_device, .to), so a
            # threaded rank with nothing of a ShardedTensor asked for CUDA where a gloo rank
            # answers cpu. torch keys nothing else on the name; dist.get_backend still says
            # "threaded" (it reads the name the group was made with).
            multi_threaded_pg.ProcessLocalGroup.getBackendName = _gloo_name  # type: ignore[method-assign]
            plugins = dist.Backend._plugins  # type: ignore[attr-defined]
            _torchs_plugin = plugins["THREADED"]
            if _backend_constructible():
                plugins["THREADED"] = _torchs_plugin._replace(
                    creator_fn=_with_a_cpu_backend(_torchs_plugin.creator_fn)
                )
            else:  # torch 2.13 cannot make a Backend in Python, nor records such a group
                multi_threaded_pg.ProcessLocalGroup._device_types = property(  # type: ignore[method-assign,assignment]
                    lambda self: [torch.device("cpu")]
                )
            _installed = True


class _ThreadedCpuBackend(torch._C._distributed_c10d.Backend):  # type: ignore[misc,name-defined]
    """The name a threaded group's CPU backend reports (gloo's: see _install). Its collectives
    are the base class's, which refuse: every collective of a threaded group is its own Python
    method."""

    def getBackendName(self) -> str:  # the C++ virtual it overrides
        return _gloo_name(self)


def _gloo_name(self: Any) -> str:
    """What a simulated group's backend calls itself: what ShardedTensor keys its CPU on."""
    return "gloo"


def _backend_constructible() -> bool:
    try:
        _ThreadedCpuBackend(0, 1)
    except TypeError:  # torch < 2.14: "No constructor defined"
        return False
    return True


def _with_a_cpu_backend(create: Callable[..., Any]) -> Callable[..., Any]:
    """torch's threaded-group creator returns a ProcessGroup subclass, which torch takes
    instead of its own group with no backend registered on it: it answers no device, and has
    no group name, which lives on the backends. torch 2.15's init_process_group attaches its
    flight recorder to a group that answers a device, and the recorder reads the name
    ("ProcessGroup name not set"). Register a CPU backend on the group as torch does for a
    group it builds itself (default backend type, backend per device), so that the device
    answer is true and torch's own _set_group_name has a place to put the name."""

    def creator(store: Any, rank: int, world_size: int, timeout: Any) -> Any:
        from torch._C._distributed_c10d import ProcessGroup

        pg = create(store, rank, world_size, timeout)
        custom = ProcessGroup.BackendType.CUSTOM
        pg._set_default_backend(custom)
        pg._register_backend(torch.device("cpu"), custom, _ThreadedCpuBackend(rank, world_size))
        return pg

    return creator


def _sizes(n: int, sizes: Any, world: int) -> list[int]:
    if sizes is None or len(sizes) == 0:
        return [n // world] * world
    if isinstance(sizes, list):
        return sizes  # as the caller passed them: no copy for each of the world's ranks
    return [int(x) for x in sizes]


def _offsets(sizes: list[int]) -> list[int]:
    return [0, *itertools.accumulate(sizes)]


class _SparseAllToAllBase:
    """torch's threaded ``all_to_all_single`` (``AllToAllBase.work``) recomputes both
    cumulative sums as tensors for each of the W*W rank pairs, which makes one collective of
    1024 ranks take minutes. Same copies, in the same places, with the offsets computed once
    per rank and the empty pairs (most of them, for a resharding) skipped."""

    @torch.no_grad()
    def work(self, data: list[Any]) -> None:
        world = len(data)
        ins = [
            (inp, _offsets(_sizes(inp.size(0), in_sizes, world))) for _, inp, _, in_sizes in data
        ]
        for dst, (out, _, out_sizes, _) in enumerate(data):
            lo = 0
            for src, n in enumerate(_sizes(out.size(0), out_sizes, world)):
                if n:
                    inp, in_off = ins[src]
                    out[lo : lo + n].detach().copy_(inp[in_off[dst] : in_off[dst + 1]])
                    lo += n


def _uninstall() -> None:
    global _installed
    with _INSTALL_LOCK:
        if _installed:
            import torch.distributed as dist
            from torch.testing._internal.distributed import multi_threaded_pg

            multi_threaded_pg._uninstall_threaded_pg()  # type: ignore[no-untyped-call]
            dist.Backend._plugins["THREADED"] = _torchs_plugin  # type: ignore[attr-defined]
            torch._C._distributed_c10d._set_thread_isolation_mode(False)  # type: ignore[attr-defined]
            _installed = False


def _process_local_group() -> Any:
    from torch.testing._internal.distributed.multi_threaded_pg import ProcessLocalGroup

    return ProcessLocalGroup


class SimulatedPool:
    """``world_size`` ranks as threads with a ``threaded`` process group, reused per call."""

    backend = "threaded"

    def __init__(
        self,
        world_size: int,
        *,
        timeout: float | None = None,
        ops: Sequence[str] = (),
        error_grace: float = 2.0,
    ) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        # Every collective of a simulated world runs its W*W bookkeeping on one core.
        self.timeout = 120.0 + 0.5 * world_size if timeout is None else timeout
        self.error_grace = error_grace
        self.ops = tuple(ops)
        self.generation = 0
        self.examples = 0
        self._threads: list[threading.Thread] = []
        self._inboxes: list[queue.Queue[Any]] = []
        self._outbox: queue.Queue[tuple[int, int, dict[str, Any]]] = queue.Queue()
        self._call_id = 0

    @property
    def running(self) -> bool:
        return bool(self._threads)

    def start(self) -> None:
        if self.running:
            return
        _install()
        for module in self.ops:
            __import__(module)
        import torch.distributed as dist

        _process_local_group().reset()
        store = dist.HashStore()  # type: ignore[attr-defined]
        ready: queue.Queue[tuple[int, str | None]] = queue.Queue()
        self._inboxes = [queue.Queue() for _ in range(self.world_size)]
        self._outbox = queue.Queue()
        self._threads = [
            threading.Thread(
                target=self._serve,
                args=(rank, store, self._inboxes[rank], ready),
                name=f"shardspec-sim-{self.world_size}-{rank}",
                daemon=True,
            )
            for rank in range(self.world_size)
        ]
        for t in self._threads:
            t.start()
        errors = []
        for _ in range(self.world_size):
            rank, err = ready.get(timeout=scaled(max(self.timeout, 60.0)))
            if err is not None:
                errors.append(f"rank {rank}: {err}")
        if errors:
            self._terminate()
            raise RuntimeError("a simulated world did not start:\n" + "\n".join(errors))
        self.generation += 1

    def _serve(
        self, rank: int, store: Any, inbox: queue.Queue[Any], ready: queue.Queue[Any]
    ) -> None:
        import torch.distributed as dist

        try:
            dist.init_process_group("threaded", rank=rank, world_size=self.world_size, store=store)
            ctx = Context(rank=rank, world=self.world_size, backend=self.backend)
        except BaseException:
            ready.put((rank, traceback.format_exc()))
            return
        ready.put((rank, None))
        while True:
            task = inbox.get()
            if task is None:
                break
            call_id, kind, payload = task
            try:
                reply = self._answer(ctx, kind, payload)
            except SystemExit:  # the threaded group's termination event: the world is gone
                return
            self._outbox.put((call_id, rank, reply))
        with contextlib.suppress(Exception):
            dist.destroy_process_group()

    @staticmethod
    def _answer(ctx: Context, kind: str, payload: Any) -> dict[str, Any]:
        if kind == "run":
            op, args, tensors = payload
            phase, out = execute(ctx, op, args, [t.clone() for t in tensors])
            if out.error is not None or out.aborted:
                return {
                    "ok": False,
                    "phase": phase,
                    "error": out.error or "",
                    "aborted": out.aborted,
                }
            return {"ok": True, "value": out.value, "tensors": out.tensors}
        name, args = payload
        try:
            value = resolve_function(name)(ctx.rank, ctx.world, *args)
        except Exception as e:
            return {
                "ok": False,
                "phase": "call",
                "type": type(e).__name__,
                "message": str(e),
                "error": traceback.format_exc(),
            }
        return {"ok": True, "value": value}

    def _terminate(self) -> None:
        """Release every thread (those inside a collective exit through SystemExit)."""
        group = _process_local_group()
        group.exception_handle(RuntimeError("simulated world torn down"))
        for inbox in self._inboxes:
            inbox.put(None)
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []
        group.reset()

    def close(self) -> None:
        if self.running:
            self._terminate()

    def _dispatch(
        self, kind: str, payloads: list[Any], desc: str, timeout: float | None
    ) -> dict[int, dict[str, Any]]:
        if not self.running:
            self.start()
        self.examples += 1
        self._call_id += 1
        call_id = self._call_id
        for rank, payload in enumerate(payloads):
            self._inboxes[rank].put((call_id, kind, payload))
        # Stretched on a loaded machine (shardspec.testing.slowness): a limit catches hangs.
        factor = slowness()
        deadline = time.monotonic() + factor * (self.timeout if timeout is None else timeout)
        replies: dict[int, dict[str, Any]] = {}
        raised = False
        while len(replies) < self.world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                got_id, rank, reply = self._outbox.get(timeout=left)
            except queue.Empty:
                break
            if got_id != call_id:
                continue  # a late answer of a call that was given up
            replies[rank] = reply
            if not reply["ok"] and reply.get("phase") in ("collective", "call") and not raised:
                raised = True
                deadline = min(deadline, time.monotonic() + self.error_grace * factor)
        if len(replies) < self.world_size:
            missing = sorted(set(range(self.world_size)) - set(replies))
            self._terminate()
            if not raised:
                shown = missing if len(missing) <= 16 else [*missing[:16], "..."]
                raise RankCrash(
                    f"rank(s) {shown} of a simulated world of {self.world_size} did not answer "
                    f"within {self.timeout if timeout is None else timeout:g} s (x{factor:.1f} "
                    f"for this machine's load) [{desc}]; the world was torn down and restarts "
                    "on the next call"
                )
        return replies

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
        """Like :meth:`RankPool.run <shardspec.testing.pool.RankPool.run>`."""
        args = dict(args or {})
        desc = example if example is not None else f"{op}({args})"
        if per_rank_tensors is not None and len(per_rank_tensors) != self.world_size:
            raise ValueError(
                f"per_rank_tensors has {len(per_rank_tensors)} entries for {self.world_size} ranks"
            )
        payloads = [
            (op, args, list(per_rank_tensors[r] if per_rank_tensors is not None else tensors))
            for r in range(self.world_size)
        ]
        replies = self._dispatch("run", payloads, desc, timeout)
        errors = {r: h for r, h in replies.items() if not h["ok"]}
        if errors or len(replies) < self.world_size:
            raised = {r: h for r, h in errors.items() if not h.get("aborted")}
            lines = [f"{len(raised)} of {self.world_size} rank(s) raised in {op!r} [{desc}]"]
            for r, h in sorted(raised.items())[:8]:
                lines.append(f"--- rank {r} ({h.get('phase')}) ---\n{h.get('error', '').rstrip()}")
            if len(raised) > 8:
                lines.append(f"... and {len(raised) - 8} more ranks")
            stuck = self.world_size - len(replies)
            if stuck:
                lines.append(f"{stuck} ranks were left waiting in the collective (world rebuilt)")
            failures = [failure_from(r, h) for r, h in sorted(raised.items())]
            raise RankError("\n".join(lines), failures)
        return [
            RankResult(r, replies[r]["value"], replies[r]["tensors"])
            for r in range(self.world_size)
        ]

    def call_all(
        self,
        fn: Callable[..., Any] | str,
        *args: Any,
        per_rank: Sequence[Sequence[Any]] | None = None,
        timeout: float | None = None,
    ) -> list[Any]:
        """Like :meth:`RankPool.call_all <shardspec.testing.pool.RankPool.call_all>`."""
        name = function_name(fn)
        if per_rank is not None and len(per_rank) != self.world_size:
            raise ValueError(f"per_rank has {len(per_rank)} entries for {self.world_size} ranks")
        payloads = [
            (name, (*per_rank[r], *args) if per_rank is not None else args)
            for r in range(self.world_size)
        ]
        replies = self._dispatch("call", payloads, name, timeout)
        out: list[Any] = []
        for r in range(self.world_size):
            h = replies.get(r)
            if h is None:
                out.append(RankFailure(r, "Stuck", "left waiting in a collective", "", "call"))
            elif h["ok"]:
                out.append(h["value"])
            else:
                out.append(RankFailure(r, h["type"], h["message"], h["error"], "call"))
        return out

    def call(
        self,
        fn: Callable[..., Any] | str,
        *args: Any,
        per_rank: Sequence[Sequence[Any]] | None = None,
        timeout: float | None = None,
    ) -> list[Any]:
        """Like :meth:`RankPool.call <shardspec.testing.pool.RankPool.call>`."""
        answers = self.call_all(fn, *args, per_rank=per_rank, timeout=timeout)
        failures = [a for a in answers if isinstance(a, RankFailure)]
        if failures:
            lines = [f"{len(failures)} of {self.world_size} rank(s) raised in {function_name(fn)}"]
            for f in failures[:8]:
                lines.append(f"--- rank {f.rank} raised {f.type_name}: {f.message}\n{f.traceback}")
            raise RankError("\n".join(lines), failures)
        return answers


_SIMULATED: dict[tuple[int, tuple[str, ...]], SimulatedPool] = {}


def get_simulated_pool(world_size: int, *, ops: Sequence[str] = ()) -> SimulatedPool:
    """The process-wide simulated world of ``world_size`` ranks. Other simulated worlds are
    closed first: their threads would sit idle holding memory, and the threaded group keeps
    one table of collectives in flight for all of them."""
    key = (world_size, tuple(ops))
    for other_key, other in list(_SIMULATED.items()):
        if other_key != key:
            other.close()
            del _SIMULATED[other_key]
    pool = _SIMULATED.get(key)
    if pool is None:
        pool = _SIMULATED[key] = SimulatedPool(world_size, ops=ops)
    return pool


def shutdown_simulated() -> None:
    for pool in _SIMULATED.values():
        pool.close()
    _SIMULATED.clear()
    _uninstall()
