"""Launch a command in a network namespace of its own, which holds only the loopback device.

torchrun's elastic agent starts its rendezvous store itself, with no host to bind: it listens
on every interface however it is asked (``--standalone``, an endpoint of ``127.0.0.1``, a
static ``--master-addr 127.0.0.1``; ``conformance/repros/torchrun-store-binds-every-interface.py``),
and nothing outside torch can hand it a socket bound to loopback. In a network namespace whose
only interface is ``lo``, every address is a loopback one, so the whole run, agent included,
is reachable from this machine's loopback only (spec CONF-9).

``python loopback_launch.py -- CMD ...`` enters such a namespace (``unshare(CLONE_NEWNET)`` as
root; otherwise inside a new user namespace, where the kernel lets unprivileged users make
one), brings ``lo`` up and execs ``CMD``; ``--check`` only tries. It exits 3 saying why when
no namespace can be made. This file imports nothing outside the standard library, and is run
by its path, so that ``noxfile.py`` (which has no torch) can load and run it too.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "OPT_OUT",
    "NamespaceError",
    "enter_loopback_namespace",
    "isolated",
    "namespace_problem",
    "torchrun_command",
]

# Set to 1 to run launched without a namespace where none can be made: torchrun's store then
# listens on every interface, which the session says.
OPT_OUT = "SHARDSPEC_LAUNCH_ANY_INTERFACE"
NO_NAMESPACE = 3  # the exit status when none can be made

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = "16sH14x"  # struct ifreq: the name, then ifr_flags in the union


class NamespaceError(OSError):
    """No network namespace of our own could be made here; the message says why."""


def _unshare(flags: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return 0 if libc.unshare(flags) == 0 else ctypes.get_errno()


def _map_self(uid: int, gid: int) -> None:
    # In a new user namespace this process keeps its own ids (mapped to themselves) and has
    # the capabilities it needs to bring lo up until it execs.
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")


def _lo_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        got = fcntl.ioctl(s, _SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0))
        flags = struct.unpack(_IFREQ, got)[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))


def _interfaces() -> list[str]:
    lines = Path("/proc/self/net/dev").read_text().splitlines()[2:]
    return sorted(line.split(":", 1)[0].strip() for line in lines if ":" in line)


def enter_loopback_namespace() -> None:
    """Move this (single-threaded) process into a new network namespace holding only ``lo``,
    and bring ``lo`` up; raise :class:`NamespaceError` saying why where that is not possible."""
    if not sys.platform.startswith("linux"):
        raise NamespaceError(f"network namespaces are Linux only (this is {sys.platform})")
    uid, gid = os.getuid(), os.getgid()
    err = _unshare(_CLONE_NEWNET)
    if err == errno.EPERM:  # not root: a user namespace gives the capability, where allowed
        err = _unshare(_CLONE_NEWUSER | _CLONE_NEWNET)
        if err == 0:
            try:
                _map_self(uid, gid)
            except OSError as e:
                raise NamespaceError(f"made a user namespace but could not map ids: {e}") from e
    if err:
        raise NamespaceError(
            f"unshare(CLONE_NEWNET) failed: {os.strerror(err)} (uid {uid}; as root, or where "
            "unprivileged user namespaces are allowed, it works)"
        )
    try:
        _lo_up()
    except OSError as e:
        raise NamespaceError(f"made a network namespace but could not bring lo up: {e}") from e
    found = _interfaces()
    if found != ["lo"]:
        raise NamespaceError(f"the new network namespace holds {found}, not only lo")


def isolated(argv: Sequence[str], python: str = sys.executable) -> list[str]:
    """``argv`` run in a network namespace of its own holding only ``lo``."""
    return [python, str(Path(__file__).resolve()), "--", *argv]


def namespace_problem(python: str = sys.executable) -> str | None:
    """Why no loopback-only namespace can be made here, or None when one can (tried in a
    child process: the attempt moves the process that makes it)."""
    try:
        done = subprocess.run(
            [python, str(Path(__file__).resolve()), "--check"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"could not try: {e}"
    if done.returncode == 0:
        return None
    return (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}").replace(
        "loopback_launch: ", ""
    )


def torchrun_command(python: str, nproc: int, args: Sequence[str]) -> list[str]:
    """The one-node launched run: ``torchrun --standalone`` of ``shardspec.testing.launched``
    (launcher rank 0 runs pytest with ``args``; the others are the pools' ranks)."""
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "shardspec.testing.launched",
        *args,
    ]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check = args[:1] == ["--check"]
    if args[:1] == ["--"]:
        args = args[1:]
    if not check and not args:
        print(f"usage: python {Path(__file__).name} [--check | -- CMD ...]", file=sys.stderr)
        return 2
    try:
        enter_loopback_namespace()
    except NamespaceError as e:
        print(f"loopback_launch: {e}", file=sys.stderr)
        return NO_NAMESPACE
    if check:
        return 0
    try:
        os.execvp(args[0], args)
    except OSError as e:
        print(f"loopback_launch: cannot run {args[0]}: {e}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
