"""Python values as JSON plus raw tensor bytes, for rank functions' arguments and results.

A rank function (``"module:function"``) takes and returns ordinary test values: numbers,
strings, lists, tuples, dicts, tensors, dtypes, layouts, DTensor placements. They travel as a
JSON tree in the frame header, tensors as the frame's raw buffers; nothing is pickled, so a
value of any other type is refused on the sending side with :class:`TypeError` naming the type
and where it sits, and a malformed tree is refused on the receiving side with
:class:`~shardspec.testing.protocol.ProtocolError`.

Tagged forms (a JSON object with exactly one key starting with ``$``): ``$t`` tuple, ``$d``
dict (a list of ``[key, value]`` pairs, so keys need not be strings), ``$tensor`` index into
the buffers, ``$dtype`` name, ``$size`` torch.Size, ``$layout`` the versioned layout JSON,
``$placement`` a DTensor placement, ``$spec`` a ShardedTensor sharding spec, ``$float`` a
non-finite float (JSON has none).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from shardspec.metadata import Layout

from .protocol import DTYPES, ProtocolError, decode_tensor, dtype_name, encode_tensor

__all__ = ["decode_value", "encode_value"]


def _placement_to_json(p: Any) -> list[Any] | None:
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if isinstance(p, _StridedShard):
        return ["SS", p.dim, p.split_factor]
    if isinstance(p, Shard):
        return ["S", p.dim]
    if isinstance(p, Replicate):
        return ["R"]
    if isinstance(p, Partial):
        return ["P", p.reduce_op]
    return None


def _spec_to_json(spec: Any) -> list[Any] | None:
    """torch's ChunkShardingSpec / EnumerableShardingSpec (placements as their strings)."""
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    from torch.distributed._shard.sharding_spec.api import EnumerableShardingSpec

    if isinstance(spec, ChunkShardingSpec):
        return ["chunk", spec.dim, [str(p) for p in spec.placements]]
    if isinstance(spec, EnumerableShardingSpec):
        return [
            "enumerable",
            [[list(m.shard_offsets), list(m.shard_sizes), str(m.placement)] for m in spec.shards],
        ]
    return None


def _spec_from_json(obj: Any) -> Any:
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    from torch.distributed._shard.sharding_spec.api import EnumerableShardingSpec

    try:
        if obj[0] == "chunk":
            return ChunkShardingSpec(dim=obj[1], placements=list(obj[2]))
        if obj[0] == "enumerable":
            return EnumerableShardingSpec([ShardMetadata(o, s, p) for o, s, p in obj[1]])
    except (TypeError, ValueError, IndexError) as e:
        raise ProtocolError(f"bad sharding spec {obj!r}: {e}") from None
    raise ProtocolError(f"bad sharding spec {obj!r}")


def _placement_from_json(obj: Any) -> Any:
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    ok_int = isinstance(obj, list) and all(
        isinstance(x, int) and not isinstance(x, bool) for x in obj[1:]
    )
    if obj == ["R"]:
        return Replicate()
    if isinstance(obj, list) and len(obj) == 2 and obj[0] == "S" and ok_int:
        return Shard(obj[1])
    if isinstance(obj, list) and len(obj) == 3 and obj[0] == "SS" and ok_int:
        return _StridedShard(obj[1], split_factor=obj[2])
    if isinstance(obj, list) and len(obj) == 2 and obj[0] == "P" and isinstance(obj[1], str):
        return Partial(obj[1])
    raise ProtocolError(f"bad placement {obj!r}")


def _span(shape: list[int], stride: list[int]) -> int:
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * st for n, st in zip(shape, stride))


def _encode_strided(t: torch.Tensor, buffers: list[bytes]) -> list[Any]:
    # Strides travel too (a test of non-contiguous inputs must get non-contiguous inputs on
    # the rank): the bytes are the storage the view spans, from its first element.
    shape, stride = list(t.shape), list(t.stride())
    if any(st < 0 for st in stride):
        t, stride = t.contiguous(), list(t.contiguous().stride())
    span = _span(shape, stride)
    flat = torch.as_strided(t.cpu(), (span,), (1,)) if span else t.new_empty(0, device="cpu")
    desc, data = encode_tensor(flat)
    buffers.append(data)
    return [len(buffers) - 1, {"dtype": desc["dtype"], "shape": shape}, stride]


def _decode_strided(body: list[Any], buffers: list[bytearray]) -> torch.Tensor:
    index, desc, stride = body
    if not (isinstance(index, int) and 0 <= index < len(buffers)):
        raise ProtocolError(f"tensor buffer index {index!r} out of range")
    if not isinstance(desc, dict) or set(desc) != {"dtype", "shape"}:
        raise ProtocolError(f"bad tensor descriptor {desc!r}")
    shape = desc["shape"]
    ok = isinstance(shape, list) and isinstance(stride, list) and len(shape) == len(stride)
    if not ok or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in stride):
        raise ProtocolError(f"bad stride {stride!r} for shape {shape!r}")
    try:
        span = _span(shape, stride)
    except TypeError:
        raise ProtocolError(f"bad shape {shape!r} in tensor descriptor") from None
    flat = decode_tensor({"dtype": desc["dtype"], "shape": [span]}, buffers[index])
    return torch.as_strided(flat, shape, stride) if span else flat.reshape(shape)


def encode_value(value: Any, buffers: list[bytes], where: str = "value") -> Any:
    """The JSON tree of ``value``; its tensors' bytes are appended to ``buffers``."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, list):
        return [encode_value(v, buffers, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, torch.Size):
        return {"$size": list(value)}
    if isinstance(value, tuple):
        return {"$t": [encode_value(v, buffers, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, dict):
        return {
            "$d": [
                [
                    encode_value(k, buffers, f"{where} key"),
                    encode_value(v, buffers, f"{where}[{k!r}]"),
                ]
                for k, v in value.items()
            ]
        }
    if isinstance(value, torch.Tensor):
        return {"$tensor": _encode_strided(value.detach(), buffers)}
    if isinstance(value, torch.dtype):
        return {"$dtype": dtype_name(value)}
    if isinstance(value, Layout):
        from shardspec.metadata.serialize import layout_to_dict

        return {"$layout": layout_to_dict(value)}
    placement = _placement_to_json(value)
    if placement is not None:
        return {"$placement": placement}
    spec = _spec_to_json(value)
    if spec is not None:
        return {"$spec": spec}
    raise TypeError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which cannot travel "
        "to or from a rank (no pickle): use numbers, strings, lists, tuples, dicts, tensors, "
        "dtypes, layouts, placements or sharding specs"
    )


def decode_value(tree: Any, buffers: list[bytearray]) -> Any:
    """The value :func:`encode_value` encoded, with its tensors taken from ``buffers``."""
    if tree is None or isinstance(tree, bool | str | int | float):
        return tree
    if isinstance(tree, list):
        return [decode_value(v, buffers) for v in tree]
    if not isinstance(tree, dict) or len(tree) != 1:
        raise ProtocolError(f"bad value {tree!r}")
    ((tag, body),) = tree.items()
    if tag == "$t" and isinstance(body, list):
        return tuple(decode_value(v, buffers) for v in body)
    if tag == "$d" and isinstance(body, list):
        out = {}
        for pair in body:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise ProtocolError(f"bad dict entry {pair!r}")
            out[decode_value(pair[0], buffers)] = decode_value(pair[1], buffers)
        return out
    if tag == "$tensor" and isinstance(body, list) and len(body) == 3:
        return _decode_strided(body, buffers)
    if tag == "$dtype" and body in DTYPES:
        return DTYPES[body]
    if tag == "$size" and isinstance(body, list):
        return torch.Size(body)
    if tag == "$float" and body in ("nan", "inf", "-inf"):
        return float(body)
    if tag == "$layout":
        from shardspec.metadata.serialize import layout_from_dict

        try:
            return layout_from_dict(body)
        except ValueError as e:
            raise ProtocolError(f"bad layout: {e}") from None
    if tag == "$placement":
        return _placement_from_json(body)
    if tag == "$spec":
        return _spec_from_json(body)
    raise ProtocolError(f"bad value {tree!r}")
