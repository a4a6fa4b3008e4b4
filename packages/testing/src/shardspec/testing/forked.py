"""A pool's ranks forked from a server that imported torch once (:func:`start_rank`).

A rank started as ``python -m shardspec.testing.worker`` spends 3-6 CPU seconds importing
torch and torch.distributed before it says a word, and a driver starts ranks many times: every
new world size, and every restart after a crash, a hang or a known defect that killed its
ranks. CPU ranks are therefore forked, by default, from multiprocessing's fork server, which
imports :data:`PRELOAD` once per driver and forks each rank from that state (a fraction of a
second a rank). Nothing in the server has computed anything or initialised a device when it
forks, so each rank starts as clean as an exec'd one.

Each forked rank gets what an exec'd one gets: its own session (killed by process group), its
output in its log, exactly the environment it was given, the driver's working directory, and
death with its parent (the server, which exits when the driver does). Ranks exec'd instead:
``SHARDSPEC_POOL_START=exec``, device ranks (CUDA initialises in the rank, never near a fork),
and an environment that changes how Python starts (``PYTHON*``, a benchmark's older tree on
``PYTHONPATH``, say), which a fork could not honour.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from collections.abc import Mapping
from multiprocessing.context import ForkServerContext
from typing import Any

__all__ = ["ENV", "PRELOAD", "ForkedRank", "fork_refused", "start_rank"]

ENV = "SHARDSPEC_POOL_START"
# What every CPU rank imports before its first frame (worker.main): imported once, in the
# server. Peers and operation modules are left to each rank: their imports may start threads
# or look for devices, which must not happen before a fork.
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.tensor",
    "torch.distributed.checkpoint",
    "shardspec.testing.worker",
    "shardspec.testing.ops",
)

_context: ForkServerContext | None = None


def fork_refused(env: Mapping[str, str], device: str) -> str | None:
    """Why ranks with this environment and device must be exec'd; None when they may fork."""
    mode = os.environ.get(ENV, "fork")
    if mode not in ("fork", "exec"):
        raise ValueError(f"{ENV} must be 'fork' or 'exec', got {mode!r}")
    if mode == "exec":
        return f"{ENV}=exec"
    if not sys.platform.startswith("linux"):
        return f"forking ranks is for Linux, not {sys.platform}"
    if device != "cpu":
        return f"{device} ranks initialise their device in a fresh process"
    startup = sorted(k for k in env if k.startswith("PYTHON"))
    if startup:
        return f"{', '.join(startup)} change how Python starts"
    return None


def _server() -> ForkServerContext:
    global _context
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(PRELOAD))
        _context = context
    return _context


class ForkedRank:
    """A forked rank, answering as the ``subprocess.Popen`` of an exec'd one would."""

    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        pid = self._process.pid
        assert pid is not None  # started before it is handed out
        return pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(f"rank {self.pid}", timeout or 0.0)
        return code

    def kill(self) -> None:
        if self._process.exitcode is None:
            self._process.kill()


def start_rank(env: Mapping[str, str], cwd: str, log: str) -> ForkedRank:
    """A rank forked from the server, running ``worker.main`` with exactly ``env`` in ``cwd``,
    its output appended to ``log``."""
    # daemon: multiprocessing's exit handler in the driver then kills a rank it finds still
    # running instead of waiting for it (the pool closes its ranks before that, normally)
    process = _server().Process(
        target=_run, args=(dict(env), cwd, log), name="shardspec-rank", daemon=True
    )
    process.start()
    return ForkedRank(process)


def _run(env: dict[str, Any], cwd: str, log: str) -> None:
    os.setsid()  # its own process group, as start_new_session gives an exec'd rank
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    # a rank may start processes of its own (a peer's workers), which a daemon may not
    multiprocessing.current_process().daemon = False
    from .worker import main

    main()
