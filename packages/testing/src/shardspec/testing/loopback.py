"""Stores and listeners bound to loopback, and a reader of the OS socket table to prove it.

torch's ``TCPStore`` given ``"127.0.0.1"`` as its host still listens on every interface
(``*:PORT`` in ``ss -ltn``): the host only says where clients connect. So the pool binds the
listening socket to 127.0.0.1 itself and hands its descriptor to the store
(``master_listen_fd``). gloo binds its pairs to the address of ``GLOO_SOCKET_IFNAME``, which
the pool sets to the loopback device ``lo``.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Listener", "listeners", "loopback_store"]


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
    """A listening TCP socket from the OS table: its local address, port and inode."""

    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int
    inode: int

    @property
    def loopback(self) -> bool:
        addr = self.address
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            return addr.ipv4_mapped.is_loopback
        return addr.is_loopback


def _parse(hexaddr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hexaddr)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])  # the kernel prints a little-endian u32
    # four little-endian u32 words
    return ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))


def listeners(pids: list[int] | None = None) -> list[Listener]:
    """Every listening TCP socket in ``/proc/net/tcp{,6}``; with ``pids``, only those whose
    descriptors one of these processes holds."""
    inodes: set[int] | None = None
    if pids is not None:
        inodes = set()
        for pid in pids:
            fd_dir = Path(f"/proc/{pid}/fd")
            try:
                entries = list(fd_dir.iterdir())
            except OSError:
                continue
            for fd in entries:
                try:
                    target = fd.readlink().as_posix()
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            addr, port = fields[1].split(":")
            inode = int(fields[9])
            if inodes is None or inode in inodes:
                out.append(Listener(_parse(addr), int(port, 16), inode))
    return out
