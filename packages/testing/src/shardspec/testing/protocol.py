"""The rank runtime's wire format: length-prefixed JSON header + raw tensor bytes, no pickle.

A frame is ``MAGIC (4 bytes) | header length (u32) | header (UTF-8 JSON object) | buffers``.
The header lists the byte length of each buffer under ``"_buffers"``; the buffers follow the
header back to back. Tensors travel as ``{"dtype": name, "shape": [...]}`` descriptors in the
header plus one buffer of their bytes (little-endian, C order), so a reader never needs more
than ``json.loads`` and ``torch.frombuffer``. Malformed frames raise :class:`ProtocolError`.
"""

from __future__ import annotations

import json
import math
import socket
import struct
from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "DTYPES",
    "ProtocolError",
    "decode_tensor",
    "dtype_name",
    "encode_tensor",
    "recv_frame",
    "send_frame",
    "tensor_bytes",
]

MAGIC = b"SSP1"
_PREFIX = struct.Struct("!4sI")
MAX_HEADER = 64 << 20
MAX_BUFFER = 4 << 30

# Every dtype whose elements are plain bytes, by torch's own name; names this torch lacks are
# left out (float8 kinds came and went between releases).
_DTYPE_NAMES = (
    *("float32", "float64", "float16", "bfloat16", "bool", "complex32", "complex64", "complex128"),
    *("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"),
    *("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"),
)
DTYPES: dict[str, torch.dtype] = {
    n: getattr(torch, n) for n in _DTYPE_NAMES if isinstance(getattr(torch, n, None), torch.dtype)
}
_NAMES = {v: k for k, v in DTYPES.items()}


class ProtocolError(RuntimeError):
    """A frame or tensor descriptor that does not follow the wire format."""


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return _NAMES[dtype]
    except KeyError:
        raise ProtocolError(f"dtype {dtype} cannot travel over the pool") from None


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The tensor's elements in C order as raw bytes (what bit-for-bit comparison compares)."""
    flat = t.detach().cpu().reshape(-1)
    if flat.numel() == 0:
        return b""
    if flat.stride(0) != 1:  # a one-element view can keep a stride that .contiguous() accepts
        flat = torch.empty(flat.shape, dtype=flat.dtype).copy_(flat)
    return flat.view(torch.uint8).numpy().tobytes()


def encode_tensor(t: torch.Tensor) -> tuple[dict[str, Any], bytes]:
    return {"dtype": dtype_name(t.dtype), "shape": list(t.shape)}, tensor_bytes(t)


def decode_tensor(desc: Any, data: bytes | bytearray | memoryview) -> torch.Tensor:
    if not isinstance(desc, dict) or set(desc) != {"dtype", "shape"}:
        raise ProtocolError(f"bad tensor descriptor {desc!r}")
    name, shape = desc["dtype"], desc["shape"]
    if name not in DTYPES:
        raise ProtocolError(f"unknown dtype {name!r} in tensor descriptor")
    if not isinstance(shape, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        raise ProtocolError(f"bad shape {shape!r} in tensor descriptor")
    dtype = DTYPES[name]
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if len(data) != nbytes:
        raise ProtocolError(f"tensor {name}{shape} needs {nbytes} bytes, got {len(data)}")
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


def send_frame(
    sock: socket.socket, header: dict[str, Any], buffers: Sequence[bytes | bytearray] = ()
) -> None:
    head = dict(header)
    head["_buffers"] = [len(b) for b in buffers]
    raw = json.dumps(head, separators=(",", ":")).encode()
    sock.sendall(b"".join([_PREFIX.pack(MAGIC, len(raw)), raw, *buffers]))


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError("connection closed mid-frame" if got else "connection closed")
        got += k
    return buf


def recv_frame(sock: socket.socket) -> tuple[dict[str, Any], list[bytearray]]:
    magic, hlen = _PREFIX.unpack(_recv_exact(sock, _PREFIX.size))
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {magic!r}")
    if hlen > MAX_HEADER:
        raise ProtocolError(f"frame header of {hlen} bytes exceeds {MAX_HEADER}")
    try:
        header = json.loads(_recv_exact(sock, hlen))
    except ValueError as e:
        raise ProtocolError(f"frame header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise ProtocolError("frame header is not a JSON object")
    sizes = header.pop("_buffers", None)
    if not isinstance(sizes, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= MAX_BUFFER for n in sizes
    ):
        raise ProtocolError(f"bad buffer list {sizes!r} in frame header")
    return header, [_recv_exact(sock, n) for n in sizes]
