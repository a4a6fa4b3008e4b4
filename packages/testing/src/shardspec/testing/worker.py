"""A rank of a pool: ``python -m shardspec.testing.worker`` (started by :mod:`.pool`).

Reads its rank and the driver's address from ``SHARDSPEC_POOL_*`` variables, connects back to
the driver over loopback, joins the process group through the driver's store, then serves
frames until the driver says ``exit`` or its socket closes. Never unpickles anything.
"""

from __future__ import annotations

import ctypes
import json
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


def _reply_to_call(
    ctx: Any, header: dict[str, Any], bufs: list[bytearray]
) -> tuple[Any, list[bytes]]:
    from .ops import resolve_function
    from .values import decode_value, encode_value

    out: list[bytes] = []
    try:
        fn = resolve_function(header["fn"])
        args = decode_value(header.get("args", []), bufs)
        value = fn(ctx.rank, ctx.world, *args)
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        if isinstance(e, KeyboardInterrupt | SystemExit):
            raise
        return {
            "ok": False,
            "phase": "call",
            "type": type(e).__name__,
            "message": str(e),
            "error": traceback.format_exc(),
        }, out
    try:
        return {"ok": True, "value": encode_value(value, out, "the result")}, out
    except TypeError as e:
        return {
            "ok": False,
            "phase": "result",
            "type": "TypeError",
            "message": f"cannot send the result: {e}",
            "error": traceback.format_exc(),
        }, []


def _reply_to_run(
    ctx: Any, header: dict[str, Any], bufs: list[bytearray]
) -> tuple[Any, list[bytes]]:
    from . import ops
    from .protocol import decode_tensor, encode_tensor

    out: list[bytes] = []
    try:
        tensors = [decode_tensor(d, b) for d, b in zip(header.get("tensors", []), bufs)]
        phase, result = ops.execute(ctx, header["op"], header.get("args", {}), tensors)
    except Exception:
        return {"ok": False, "phase": "decode", "error": traceback.format_exc()}, out
    if result.error is not None or result.aborted:
        reply = {
            "ok": False,
            "phase": phase,
            "error": result.error or "",
            "aborted": result.aborted,
        }
        return reply, out
    descs = []
    for t in result.tensors:
        d, b = encode_tensor(t)
        descs.append(d)
        out.append(b)
    return {"ok": True, "value": result.value, "tensors": descs}, out


def serve(sock: socket.socket, ctx: Any) -> None:
    """Answer the driver's frames on ``sock`` until it says ``exit`` or goes away."""
    from .protocol import recv_frame, send_frame

    send_frame(sock, {"kind": "ready"})
    while True:
        try:
            header, bufs = recv_frame(sock)
        except (EOFError, OSError):
            break  # the driver is gone
        if header.get("kind") == "exit" or not answer(sock, ctx, header, bufs):
            break


def answer(sock: socket.socket, ctx: Any, header: dict[str, Any], bufs: list[bytearray]) -> bool:
    """Run a ``call`` or ``run`` frame and send the reply; False once the driver is gone."""
    from .groups import release_groups
    from .protocol import send_frame

    if ctx is not None:
        # what the last call built and nothing keeps (every rank answered it before this
        # frame was sent, so none is still inside one of these groups)
        release_groups(ctx.held_groups)
    if ctx is None:
        reply: Any = {"ok": False, "phase": "decode", "error": "this rank is in no world"}
        out: list[bytes] = []
    elif header.get("kind") == "call":
        reply, out = _reply_to_call(ctx, header, bufs)
    else:
        reply, out = _reply_to_run(ctx, header, bufs)
    try:
        send_frame(sock, reply, out)
    except OSError:
        return False
    return True


def main() -> None:
    _die_with_parent()
    rank = int(os.environ["SHARDSPEC_POOL_RANK"])
    world = int(os.environ["SHARDSPEC_POOL_WORLD"])
    backend = os.environ["SHARDSPEC_POOL_BACKEND"]
    device_type = os.environ.get("SHARDSPEC_POOL_DEVICE", "cpu")
    host, port = os.environ["SHARDSPEC_POOL_ADDR"].rsplit(":", 1)
    store_host, store_port = os.environ["SHARDSPEC_POOL_STORE"].rsplit(":", 1)
    # The driver's sys.path, so rank functions in its test directories import by name.
    for entry in reversed(json.loads(os.environ.get("SHARDSPEC_POOL_SYSPATH", "[]"))):
        if entry not in sys.path:
            sys.path.insert(0, entry)

    from .protocol import send_frame

    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    send_frame(sock, {"token": os.environ["SHARDSPEC_POOL_TOKEN"], "rank": rank})

    import torch
    import torch.distributed as dist

    from .devices import rank_device
    from .ops import Context, warm_up

    torch.set_num_threads(1)
    store = dist.TCPStore(  # type: ignore[attr-defined]
        store_host, int(store_port), None, False, timeout=timedelta(seconds=120)
    )
    if device_type == "cuda":
        torch.cuda.set_device(torch.device(rank_device(rank, backend, device_type)))
    # A generous collective timeout is only a backstop: the driver's per-call timeout kills a
    # stuck pool long before this fires.
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=600)
    )
    for module in filter(None, os.environ.get("SHARDSPEC_POOL_OPS", "").split(",")):
        __import__(module)  # registers its named operations
    ctx = Context(rank=rank, world=world, backend=backend, device_type=device_type)
    warm_up(ctx)
    serve(sock, ctx)
    sock.close()
    save_coverage()
    os._exit(0)  # skip interpreter and process-group teardown: the driver owns our lifetime


def save_coverage() -> None:
    """Write coverage.py's data when it measures this process (``nox -s coverage`` starts it in
    every rank): ``os._exit`` skips the atexit hook that would."""
    import sys

    coverage = sys.modules.get("coverage")
    cov = coverage.Coverage.current() if coverage is not None else None
    if cov is not None:
        cov.stop()
        cov.save()


if __name__ == "__main__":
    main()
