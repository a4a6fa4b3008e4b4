"""Stores and listeners bound to loopback, and a reader of the OS socket table to prove it.

torch's ``TCPStore`` given ``"127.0.0.1"`` as its host still listens on every interface
(``*:PORT`` in ``ss -ltn``): the host only says where clients connect. So the pool binds the
listening socket to 127.0.0.1 itself and hands its descriptor to the store
(``master_listen_fd``). gloo binds its pairs to the address of ``GLOO_SOCKET_IFNAME``, which
the pool sets to the loopback device ``lo``. torchrun's own agent store cannot be handed a
socket: a launched run is held to loopback by a network namespace of its own
(``shardspec.testing.loopback_launch``), where every address is a loopback one.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Listener", "listeners", "loopback_store", "process_tree"]


def loopback_store() -> Any:
    """A master ``TCPStore`` listening on 127.0.0.1 only, on a port the OS picks."""
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    store = dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1",
        port,
        None,
        True,
        wait_for_workers=False,
        master_listen_fd=sock.detach(),
    )
    return store


@dataclass(frozen=True)
class Listener:
    """A listening TCP socket from the OS table: its local address, port and inode, and the
    interfaces of the network namespace it listens in."""

    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int
    inode: int
    # Empty when unknown: a wildcard address then counts as every interface.
    interfaces: tuple[str, ...] = ()

    @property
    def loopback(self) -> bool:
        """Whether only loopback reaches it: bound to a loopback address, or to every address
        of a network namespace whose only interface is ``lo`` (``loopback_launch``)."""
        addr = self.address
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        if addr.is_loopback:
            return True
        return addr.is_unspecified and self.interfaces == ("lo",)

    def __str__(self) -> str:
        host = "*" if self.address.is_unspecified else str(self.address)
        where = f" (namespace of {', '.join(self.interfaces)})" if self.interfaces else ""
        return f"{host}:{self.port}{where}"


def _parse(hexaddr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hexaddr)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])  # the kernel prints a little-endian u32
    # four little-endian u32 words
    return ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    try:
        entries = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return inodes  # gone, or not ours to read
    for fd in entries:
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _table(net: Path) -> list[Listener]:
    """The listening sockets of one network namespace, read through ``net`` (``/proc/PID/net``:
    a process in another namespace has its own tables there)."""
    try:
        dev = (net / "dev").read_text().splitlines()[2:]
    except OSError:
        dev = []
    interfaces = tuple(sorted(line.split(":", 1)[0].strip() for line in dev if ":" in line))
    out = []
    for table in ("tcp", "tcp6"):
        try:
            lines = (net / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            addr, port = fields[1].split(":")
            out.append(Listener(_parse(addr), int(port, 16), int(fields[9]), interfaces))
    return out


def listeners(pids: list[int] | None = None) -> list[Listener]:
    """Every listening TCP socket of this process's network namespace; with ``pids``, only
    those whose descriptors one of these processes holds, read from each process's own
    namespace (so a run in a namespace of its own is seen too)."""
    if pids is None:
        return _table(Path("/proc/self/net"))
    seen: dict[str, list[Listener]] = {}  # per network namespace
    out: list[Listener] = []
    for pid in pids:
        inodes = _socket_inodes(pid)
        if not inodes:
            continue
        try:
            ns = os.readlink(f"/proc/{pid}/ns/net")
        except OSError:
            continue
        if ns not in seen:
            seen[ns] = _table(Path(f"/proc/{pid}/net"))
        out += [x for x in seen[ns] if x.inode in inodes and x not in out]
    return out


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live descendant of it, from each process's parent in ``/proc``."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # it ended while we looked
        # the command name may hold spaces and parentheses: the fields follow the last ")"
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    return tree
