"""A launched run, started as `nox -s conformance_launched` starts it, listens on loopback only
(CONF-9): torchrun's own store listens on every interface whatever it is asked
(conformance/repros/torchrun-store-binds-every-interface.py), so the run is held in a network
namespace of its own that holds only `lo` (`shardspec.testing.loopback_launch`). The sockets
are those of the run's own processes, sampled from /proc while it runs, not the machine's."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardspec.testing.loopback import Listener, listeners, process_tree
from shardspec.testing.loopback_launch import isolated, namespace_problem, torchrun_command

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc and makes network namespaces"
)
# A child that listens on every interface (port 0: the OS picks), says its port, and waits.
LISTEN_WIDE = (
    "import socket, sys, time\n"
    "s = socket.create_server(('0.0.0.0', 0))\n"
    "print(s.getsockname()[1], flush=True)\n"
    "time.sleep(60)\n"
)
# What torchrun and its agent put in the environment of the processes it starts: a meta run
# under a launcher must not hand them to the run it starts.
LAUNCHER_ENV = (
    *("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK"),
    *("LOCAL_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "SHARDSPEC_LAUNCHED"),
)


def _namespace_or_skip() -> None:
    problem = namespace_problem()
    if problem is not None:
        pytest.skip(f"no network namespace can be made here: {problem}")


def _wide_listener(argv: list[str]) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip().isdigit(), f"the child said {line!r} (exit {proc.poll()})"
    return proc, int(line)


def _stop(proc: subprocess.Popen[str]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _sampled(pid: int) -> list[Listener]:
    # A process may end between listing the tree and reading its descriptors: sample again.
    for _ in range(50):
        found = listeners(process_tree(pid))
        if found:
            return found
        time.sleep(0.1)
    return []


@pytest.mark.rule("CONF-9")
def test_the_sampler_flags_a_grandchild_listening_on_every_interface() -> None:
    net = Path("/proc/self/net/dev").read_text()
    if all(line.split(":")[0].strip() == "lo" for line in net.splitlines()[2:] if ":" in line):
        pytest.skip("this machine's only interface is lo: every listener here is loopback")
    # Through a shell, so the listener is a grandchild: the process tree must reach it.
    shell = ["sh", "-c", '"$0" -c "$1"; exit 0', sys.executable, LISTEN_WIDE]
    proc, port = _wide_listener(shell)
    try:
        found = _sampled(proc.pid)
    finally:
        _stop(proc)
    mine = [x for x in found if x.port == port]
    assert mine, f"the child's listener on port {port} was not sampled: {found}"
    assert not any(x.loopback for x in mine), f"*:{port} read as loopback: {mine}"
    assert all(str(x).startswith(f"*:{port}") for x in mine), mine


@pytest.mark.rule("CONF-9")
def test_every_interface_of_a_namespace_holding_only_lo_is_loopback() -> None:
    _namespace_or_skip()
    proc, port = _wide_listener(isolated([sys.executable, "-c", LISTEN_WIDE]))
    try:
        found = _sampled(proc.pid)
        theirs = os.readlink(f"/proc/{proc.pid}/ns/net")
        # While the child still listens: after it ends its socket is gone from every table.
        here = listeners()
    finally:
        _stop(proc)
    # read from the child's own namespace: this process's /proc/net/tcp does not hold it
    assert [x.port for x in found] == [port], f"sampled {found}, not the child's *:{port}"
    assert found[0].interfaces == ("lo",) and found[0].loopback, found[0]
    assert theirs != os.readlink("/proc/self/ns/net"), f"the child is in this namespace ({theirs})"
    # By the socket's inode, which no other socket shares: another process of this namespace
    # may hold the same port number (each namespace has its own ports).
    mine = found[0].inode
    assert not any(x.inode == mine for x in here), f"this namespace lists the child's {found[0]}"


@pytest.mark.rule("CONF-9", "CONF-11")
def test_a_launched_run_listens_on_loopback_only(tmp_path: Path) -> None:
    """The run `nox -s conformance_launched` starts (the same command), on 3 launcher ranks
    and one drawn property that forms gloo worlds of 1 and 2 ranks."""
    _namespace_or_skip()
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    env = {k: v for k, v in env.items() if not k.startswith("TORCHELASTIC_")}
    env.update(
        SHARDSPEC_IMPL="shardspec",
        SHARDSPEC_MAX_WORLD="2",
        SHARDSPEC_POOL_TIMEOUT="60",
        HYPOTHESIS_PROFILE="short",
        SHARDSPEC_EXAMPLES="3",
        PYTHONUNBUFFERED="1",
    )
    test = "conformance/tests/test_chunk.py::test_fsdp_box_holds_the_local_tensor"
    cmd = isolated(torchrun_command(sys.executable, 3, [test, "-p", "no:cacheprovider", "-q"]))
    log = tmp_path / "run.log"
    seen: dict[tuple[str, int, int], Listener] = {}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.monotonic() + 600
            while proc.poll() is None and time.monotonic() < deadline:
                for x in listeners(process_tree(proc.pid)):
                    seen[(str(x.address), x.port, x.inode)] = x
                time.sleep(0.1)
        finally:  # torchrun starts each rank in a session of its own: kill every process
            for pid in process_tree(proc.pid) if proc.poll() is None else []:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
    assert proc.returncode == 0, f"the launched run failed (exit {proc.returncode}):\n{tail}"
    found = sorted(seen.values(), key=str)
    wide = [str(x) for x in found if not x.loopback]
    assert not wide, f"the launched run listened beyond loopback on {wide}:\n{tail}"
    # The run was seen while it listened: torchrun's store (the namespace's wildcard) and the
    # driver's or gloo's sockets on 127.0.0.1.
    assert any(x.address.is_unspecified for x in found), f"no torchrun store sampled: {found}"
    assert any(x.address.is_loopback for x in found), f"no rank's listener sampled: {found}"
