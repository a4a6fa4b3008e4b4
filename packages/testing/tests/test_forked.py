"""CPU ranks forked from the fork server (shardspec.testing.forked) start as exec'd ones do:
their own process group, the driver's working directory, exactly the environment the pool
gives them at its start, and death with the driver; where a fork cannot honour the pool's
environment or device, the ranks are exec'd."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testing_pool_cases import environment, process_facts

from shardspec.testing import RankPool
from shardspec.testing.forked import ENV, fork_refused
from shardspec.testing.timing import scaled

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="ranks fork on Linux only"
)


def _running(pid: int) -> bool:
    # a zombie (state Z) whose parent is gone no longer runs, whoever reaps it
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.rule("CONF-8")
def test_a_forked_rank_has_its_own_group_the_drivers_directory_and_exactly_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    with RankPool(2, timeout=120) as first:
        facts = first.call(process_facts)
    # the server exists now, with the environment the driver had when it started
    monkeypatch.setenv("SHARDSPEC_PROBE_LATER", "set after the server started")
    monkeypatch.delenv("SHARDSPEC_PROBE_GONE", raising=False)
    with RankPool(2, timeout=120, env={"SHARDSPEC_PROBE": "y"}) as second:
        later = second.call(process_facts)
        assert (
            second.call(environment, "SHARDSPEC_PROBE_LATER")
            == ["set after the server started"] * 2
        )
        assert second.call(environment, "SHARDSPEC_PROBE") == ["y", "y"]
        assert second.call(environment, "SHARDSPEC_POOL_RANK") == ["0", "1"]
    for pid, ppid, pgid, cwd in facts + later:
        assert ppid != os.getpid(), "a CPU rank should be forked by the server, not the driver"
        assert pgid == pid
        assert cwd == os.getcwd()
    assert {f[1] for f in facts} == {f[1] for f in later}, "one server forks every rank"


def test_an_environment_variable_removed_from_the_driver_is_gone_from_later_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("SHARDSPEC_PROBE_GONE", "here")
    with RankPool(1, timeout=120) as pool:
        assert pool.call(environment, "SHARDSPEC_PROBE_GONE") == ["here"]
    monkeypatch.delenv("SHARDSPEC_PROBE_GONE")
    with RankPool(1, timeout=120) as pool:
        assert pool.call(environment, "SHARDSPEC_PROBE_GONE") == [None]


def test_exec_asked_for_makes_the_ranks_the_drivers_children(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV, "exec")
    with RankPool(2, timeout=120) as pool:
        facts = pool.call(process_facts)
    for pid, ppid, pgid, _ in facts:
        assert ppid == os.getpid() and pgid == pid


@pytest.mark.rule("CONF-8")
def test_ranks_are_execd_where_a_fork_cannot_honour_the_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert fork_refused({"SHARDSPEC_PROBE": "x"}, "cpu") is None
    reason = fork_refused({"PYTHONPATH": "/elsewhere", "PYTHONHASHSEED": "0"}, "cpu")
    assert reason == "PYTHONHASHSEED, PYTHONPATH change how Python starts"
    assert fork_refused({}, "cuda") == "cuda ranks initialise their device in a fresh process"
    monkeypatch.setenv(ENV, "exec")
    assert fork_refused({}, "cpu") == f"{ENV}=exec"
    monkeypatch.setenv(ENV, "spawn")
    with pytest.raises(ValueError, match=f"{ENV} must be 'fork' or 'exec', got 'spawn'"):
        fork_refused({}, "cpu")


def test_a_pool_whose_environment_changes_how_python_starts_has_execd_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    with RankPool(1, timeout=120, env={"PYTHONHASHSEED": "7"}) as pool:
        [(_, ppid, _, _)] = pool.call(process_facts)
        assert pool.call(environment, "PYTHONHASHSEED") == ["7"]
    assert ppid == os.getpid()


DRIVER = """
import sys, time
sys.path.insert(0, {tests!r})
from shardspec.testing import RankPool
pool = RankPool(2, timeout=120)
print(" ".join(str(p) for p in pool.call("testing_pool_cases:pid")), flush=True)
time.sleep(600)
"""


@pytest.mark.rule("CONF-8")
@pytest.mark.parametrize("start", ["fork", "exec"])
def test_ranks_die_with_their_driver(start: str) -> None:
    env = {**os.environ, ENV: start}
    script = DRIVER.format(tests=str(Path(__file__).parent))
    driver = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        assert driver.stdout is not None
        line = driver.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2, f"the driver printed {line!r}"
        assert all(_running(p) for p in pids)
    finally:
        driver.send_signal(signal.SIGKILL)  # no clean-up of its own runs
        driver.wait()
    deadline = time.monotonic() + scaled(30)
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if _running(p)], f"ranks outlived their driver ({start})"
