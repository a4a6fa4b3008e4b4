"""One call on every rank of a pool: send each rank its frame, gather the replies under the
call's deadline, and tell a rank that raised from one that died or hung.

- A rank raises: its reply says so. Collective operations validate their inputs on every rank
  first and agree on the outcome with one small all-reduce, so one rank refusing its inputs
  never leaves the others inside a collective. A rank that raises *inside* a collective may
  strand the others: they get ``grace`` seconds to answer, then the replies so far come back
  and the ranks must be restarted (:attr:`Exchange.restart`).
- A rank dies or hangs: detected by end-of-stream or by the call's deadline; :func:`exchange`
  raises :class:`~shardspec.testing.results.RankCrash` with the example and the ranks' output,
  and the pool kills its ranks.

The limits catch hangs, they do not measure speed: on a loaded machine they stretch by
``factor`` (:func:`shardspec.testing.slowness`), so load never fails a call that would pass
on an idle one.
"""

from __future__ import annotations

import contextlib
import selectors
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from .processes import Worker, tail
from .protocol import recv_frame, send_frame
from .results import RankCrash, failure_from

__all__ = ["Exchange", "Frame", "error_message", "exchange"]

# A message to one rank: its JSON header and raw buffers.
Frame = tuple[dict[str, Any], list[bytes]]


@dataclass
class Exchange:
    """The replies of one call by rank (a rank stuck in a collective has none), the buffers
    that came with them, and whether the ranks must be restarted: a rank raised inside a
    collective and left the others waiting or data in flight."""

    replies: dict[int, dict[str, Any]]
    outs: dict[int, list[bytearray]]
    restart: bool


def exchange(
    workers: Sequence[Worker],
    frames: Sequence[Frame],
    desc: str,
    *,
    timeout: float,
    grace: float,
    factor: float,
) -> Exchange:
    """Send ``frames[i]`` to ``workers[i]`` and gather the replies within ``timeout`` seconds
    (``grace`` once a rank raised inside a collective), both stretched by ``factor``. A dead
    or silent rank is a :class:`RankCrash` naming ``desc``."""
    world_size = len(workers)
    grace *= factor
    deadline = time.monotonic() + timeout * factor
    try:
        for w, (header, bufs) in zip(workers, frames):
            assert w.sock is not None
            send_frame(w.sock, header, bufs)
    except OSError as e:
        _crash(f"sending to a rank failed ({e})", desc, workers, [])

    replies: dict[int, dict[str, Any]] = {}
    outs: dict[int, list[bytearray]] = {}
    sel = selectors.DefaultSelector()
    for w in workers:
        assert w.sock is not None
        sel.register(w.sock, selectors.EVENT_READ, w)
    failed_in_collective = False
    raised_at = 0.0
    try:
        while len(replies) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(world_size)) - set(replies))
                if failed_in_collective:
                    break  # a rank raised and left the others stuck: report the raise
                _crash(
                    f"rank(s) {missing} did not answer within {timeout:g} s "
                    f"(SHARDSPEC_POOL_TIMEOUT; x{factor:.1f} for this machine's load: "
                    f"{timeout * factor:.0f} s)",
                    desc,
                    workers,
                    missing,
                    replies,
                )
            events = sel.select(min(left, 0.5))
            if not events:
                for w in workers:
                    if w.rank not in replies and w.proc.poll() is not None:
                        _crash(
                            f"rank {w.rank} died (exit code {w.proc.returncode})",
                            desc,
                            workers,
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
                    _crash(
                        f"rank {w.rank} died (exit code {code})", desc, workers, [w.rank], replies
                    )
                sel.unregister(w.sock)
                replies[w.rank] = header
                outs[w.rank] = got
                # "run": an operation declared non-collective that raised may still have left
                # the others in a collective of its own (an adapter's, say)
                if not header.get("ok") and header.get("phase") in ("collective", "call", "run"):
                    if not failed_in_collective:
                        raised_at = time.monotonic()
                    failed_in_collective = True
                    # The others may be stuck in the collective this rank left: give them
                    # a moment to fail too, then restart rather than wait for the timeout.
                    deadline = min(deadline, time.monotonic() + grace)
    except TimeoutError:
        missing = sorted(set(range(world_size)) - set(replies))
        _crash(f"rank(s) {missing} stopped mid-answer", desc, workers, missing, replies)
    finally:
        sel.close()
    errors = [r for r, h in replies.items() if not h.get("ok")]
    stuck = len(replies) < world_size
    # Every rank raising alike (a deterministic error after the collectives, say) leaves
    # the group consistent; a named collective with some ranks done while others raised
    # may leave data in flight, and ranks stuck always do: the pool restarts then.
    named_split = (
        any(h.get("phase") == "collective" for h in replies.values()) and len(errors) < world_size
    )
    restart = failed_in_collective and (stuck or named_split)
    if restart:
        waited = time.monotonic() - raised_at
        for h in replies.values():
            h["restarted"] = True
            if stuck:
                h["stranded_s"] = waited
    return Exchange(replies, outs, restart)


def error_message(
    op: str,
    desc: str,
    errors: dict[int, dict[str, Any]],
    replies: dict[int, dict[str, Any]],
    world_size: int,
) -> str:
    """What a :class:`~shardspec.testing.results.RankError` says: every rank that raised in
    ``op`` with its traceback, the ranks that stopped because of it and those left waiting."""
    raised = {r: h for r, h in errors.items() if not h.get("aborted")}
    lines = [f"{len(raised)} of {world_size} rank(s) raised in {op!r} [{desc}]"]
    for r, h in sorted(raised.items()):
        lines.append(f"--- rank {r} ({h.get('phase')}) ---\n{h.get('error', '').rstrip()}")
    aborted = sorted(set(errors) - set(raised))
    if aborted:
        lines.append(f"ranks {aborted} stopped before the collective because of the above")
    stuck = sorted(set(range(world_size)) - set(replies))
    if stuck:
        lines.append(_stranded(raised, stuck, replies))
    if any(h.get("restarted") for h in replies.values()):
        lines.append("(the pool was restarted: a rank left a collective half-done)")
    return "\n".join(lines)


def _stranded(
    raised: dict[int, dict[str, Any]], stuck: list[int], replies: dict[int, dict[str, Any]]
) -> str:
    """The finding when ranks raised and left the others in a collective: "rank 0 raised
    ValueError: msg; rank 1 still waiting in a collective after 1.0 s"."""
    said = []
    for r, h in sorted(raised.items()):
        f = failure_from(r, h)
        said.append(f"rank {r} raised {f.type_name}: {f.message.strip()}")
    waited = max((float(h.get("stranded_s", 0.0)) for h in replies.values()), default=0.0)
    who = f"rank {stuck[0]}" if len(stuck) == 1 else f"ranks {stuck}"
    return f"{'; '.join(said)}; {who} still waiting in a collective after {waited:.1f} s"


def _crash(
    what: str,
    desc: str,
    workers: Sequence[Worker],
    ranks: list[int],
    replies: dict[int, dict[str, Any]] | None = None,
) -> NoReturn:
    """Raise :class:`RankCrash`: ``what`` happened to ``ranks`` during ``desc``, with their
    output and what the other ranks raised. The caller kills the ranks."""
    logs = "\n".join(
        f"--- rank {w.rank} output ---\n{tail(w.log)}"
        for w in workers
        if w.rank in ranks and tail(w.log)
    )
    others = ""
    for r, h in sorted((replies or {}).items()):
        if not h.get("ok") and not h.get("aborted"):
            others += f"\n--- rank {r} raised ---\n{h.get('error', '').rstrip()}"
    raise RankCrash(
        f"{what} in a pool of {len(workers)} [{desc}]; the pool was torn down and "
        f"restarts on the next call{others}" + (f"\n{logs}" if logs else "")
    )
