"""A rank of the pool: ``python -m conformance.worker`` (started by ``conformance.pool``).

Reads its rank and the driver's address from ``SHARDSPEC_POOL_*`` variables, connects back to
the driver over loopback, joins the process group through the driver's TCPStore, then serves
``run`` frames until the driver says ``exit`` or its socket closes. Never unpickles anything.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import traceback
from datetime import timedelta
from typing import Any

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # The kernel kills us when the driver dies, even by SIGKILL, so no rank outlives it.
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() == 1:
        os._exit(3)


def main() -> None:
    _die_with_parent()
    rank = int(os.environ["SHARDSPEC_POOL_RANK"])
    world = int(os.environ["SHARDSPEC_POOL_WORLD"])
    backend = os.environ["SHARDSPEC_POOL_BACKEND"]
    host, port = os.environ["SHARDSPEC_POOL_ADDR"].rsplit(":", 1)
    store_host, store_port = os.environ["SHARDSPEC_POOL_STORE"].rsplit(":", 1)

    from conformance.protocol import decode_tensor, encode_tensor, recv_frame, send_frame

    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    send_frame(sock, {"token": os.environ["SHARDSPEC_POOL_TOKEN"], "rank": rank})

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore(store_host, int(store_port), None, False, timeout=timedelta(seconds=120))
    if backend == "nccl":
        from conformance.pool import rank_device

        torch.cuda.set_device(torch.device(rank_device(rank, backend)))
    # A generous collective timeout is only a backstop: the driver's per-example timeout
    # kills a stuck pool long before this fires.
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=600)
    )
    from conformance import ops

    ctx = ops.Context(rank=rank, world=world, backend=backend)
    ops.warm_up(ctx)
    send_frame(sock, {"kind": "ready"})

    while True:
        try:
            header, bufs = recv_frame(sock)
        except (EOFError, OSError):
            break  # the driver is gone
        if header.get("kind") == "exit":
            break
        reply: dict[str, Any]
        out_bufs: list[bytes] = []
        try:
            tensors = [decode_tensor(d, b) for d, b in zip(header.get("tensors", []), bufs)]
            phase, result = ops.execute(ctx, header["op"], header.get("args", {}), tensors)
        except Exception:
            phase, result = "decode", None
            reply = {"ok": False, "phase": phase, "error": traceback.format_exc()}
        else:
            if result.error is not None or result.aborted:
                reply = {
                    "ok": False,
                    "phase": phase,
                    "error": result.error or "",
                    "aborted": result.aborted,
                }
            else:
                descs = []
                for t in result.tensors:
                    d, b = encode_tensor(t)
                    descs.append(d)
                    out_bufs.append(b)
                reply = {"ok": True, "value": result.value, "tensors": descs}
        try:
            send_frame(sock, reply, out_bufs)
        except OSError:
            break
    sock.close()
    os._exit(0)  # skip interpreter and process-group teardown: the driver owns our lifetime


if __name__ == "__main__":
    main()
