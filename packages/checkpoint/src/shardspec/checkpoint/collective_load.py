"""``shardspec.checkpoint.load``: a collective load of a DCP (or safetensors) checkpoint that
owns its protocol (spec/09-checkpoint.md, CKPT-23 to CKPT-27).

``dcp.load`` unpickles the metadata on every rank, gathers every rank's plan to a coordinator
and scatters it back, and lets every rank read what it needs itself. Here, on every rank of
the group:

1. Group rank 0 reads the checkpoint's metadata (the ``.metadata`` file, or a safetensors
   checkpoint's index and headers) and broadcasts its bytes; every rank parses the same bytes
   with the restricted reader (CKPT-23).
2. Each rank derives, from the metadata and the state dict, every tensor's destination layout
   (a DTensor's placements and a ShardedTensor's metadata give every rank's boxes; a plain
   tensor is wanted whole on every rank; a DTensor on a mesh of part of the group is put
   together from every rank's mesh by :mod:`.load_submeshes`, after an agreement that every
   rank holds the same such keys) and the same read plan (:mod:`.load_reads`). One
   agreement (a gather to rank 0 and its broadcast verdict) settles a digest of it and every
   rank's own checks: a key, shape or dtype mismatch, a bad chunk list, anything, raises the
   same :class:`LoadError` on every rank before a byte of data is read. No plan is gathered
   or scattered.
3. ``reads="own"``: each rank reads exactly the saved bytes its own destinations hold, per file
   in offset order (:class:`~shardspec.checkpoint.dcp_reader.FileSystemReader`).
   ``reads="once"``: each saved chunk some rank needs is read by one rank, whole or in row
   runs (CKPT-24), and :func:`shardspec.reshard.reshard_state_dict` delivers the runs to the
   destinations. ``reads="auto"`` picks by CKPT-25.
4. One more agreement settles every rank's read outcome: a missing or truncated file, or
   bytes that do not match the metadata, raise the same :class:`LoadError` on every rank,
   naming the file, the tensor and the chunk (CKPT-26); no rank returns while another failed.

Non-tensor values are ``torch.load``-ed as ``dcp.load`` does; with ``reads="once"`` each is
read by one rank and its stored bytes travel with the tensors.
"""

from __future__ import annotations

import gc
import hashlib
import io
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardspec.metadata import Box, Layout

from .dcp_files import UnsupportedItem
from .dcp_reader import WHOLE_ITEM_BYTES, CheckpointReadError
from .load_exchange import BYTES_KEY, Target, exchange, global_rank, replicated, whole_on_every_rank
from .load_reads import STORAGE, Run, TensorReads, assign_reads, choose_reads
from .load_stacks import stack_targets
from .load_submeshes import whole_layouts
from .storage import resolve_storage

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.metadata import Metadata

__all__ = ["READS", "LoadError", "LoadStats", "load"]

READS = ("auto", "own", "once")
# What one rank's error message may carry through the agreement (longer ones are cut): every
# rank receives W records, so at 1,024 ranks each byte here is a KiB per rank and agreement.
_MSG = 480
_DIGEST = 32
# The metadata's first broadcast: its head (kind, length, failed) and the first bytes.
_FIRST = 64 << 10
_HEAD = 18  # kind, length, failed, and the storage kind rank 0 found (CKPT-25)
# From this many ranks, rank 0 sends the metadata as columns (CKPT-23): the crossover in CPU.
# Every rank parsing the file costs W parses; columns cost one parse and one encode on rank 0
# (about a parse again) and a decode a rank (a third of a parse for 2,000 tensors of 4 chunks,
# nothing for 10,000 chunks of one): W P > 2 P + W P / 3 from W = 4. On 2 ranks every rank
# parsing at once is also the shorter wall time (rank 0's encode comes before anyone goes on).
COLUMNS_FROM_RANKS = 4


class LoadError(RuntimeError):
    """The load failed; every rank of the group raised this same error. The message names the
    ranks, and the file, tensor and chunk where a read failed."""


@dataclass
class LoadStats:
    """What :func:`load` did on this rank."""

    reads: str = ""  # the read mode used ("own" or "once")
    storage: str = ""  # with reads="auto": the storage kind it chose by ("local", "shared")
    bytes_read: int = 0  # bytes this rank read from storage: metadata, headers and data
    data_bytes: int = 0  # of those, tensor data (the elements of the chunks it read)
    value_bytes: int = 0  # of those, the stored bytes of non-tensor values
    chunks: int = 0  # saved chunks (or runs of them) this rank read from
    seconds: dict[str, float] = field(default_factory=dict)  # per phase
    # (file, start, stop) of every tensor byte range read, with trace_reads=True
    ranges: list[tuple[str, int, int]] = field(default_factory=list)


def load(
    state_dict: dict[str, Any],
    checkpoint_id: str | os.PathLike[str],
    *,
    group: dist.ProcessGroup | None = None,
    reads: str = "auto",
    max_buffer_bytes: int | None = None,
    thread_count: int | None = None,
    trace_reads: bool = False,
    storage: str | None = None,
) -> LoadStats:
    """Load the checkpoint at ``checkpoint_id`` into ``state_dict`` in place, as ``dcp.load``
    does (DTensors on any mesh, ShardedTensors, plain tensors, nested dicts and lists,
    ``Stateful`` values, non-tensor values), with the same values, bit for bit.

    ``checkpoint_id``: a directory ``dcp.save`` wrote (ByteCheckpoint's too), or a Hugging
    Face safetensors checkpoint (a directory of ``*.safetensors`` files with their index JSON,
    or one ``.safetensors`` file). Every rank of ``group`` (default: the world) calls, with the
    same keys. ``reads``: ``"own"``, ``"once"`` or ``"auto"`` (module docstring; CKPT-25).
    ``max_buffer_bytes`` bounds the exchange's buffers with ``reads="once"``;
    ``thread_count`` the reading threads per rank; ``trace_reads`` records every byte range
    read in ``LoadStats.ranges``. ``storage``: ``"local"`` or ``"shared"`` (a network or
    parallel file system), what ``reads="auto"`` chooses by; None: the environment variable
    ``SHARDSPEC_STORAGE``, else the type of the file system that holds the checkpoint, as
    group rank 0 sees it (:mod:`shardspec.checkpoint.storage`). Unlike ``dcp.load``, a
    tensor whose dtype differs from the saved one is an error, not a silent cast. Returns this
    rank's :class:`LoadStats`; any failure raises the same :class:`LoadError` on every rank.
    """
    if reads not in READS:
        raise ValueError(f"reads must be one of {READS}, got {reads!r}")
    if storage not in (None, *STORAGE):
        raise ValueError(f"storage must be one of {STORAGE} or None, got {storage!r}")
    if reads == "auto":
        # here, on every rank, not on rank 0 alone: a bad value must not fail one rank late
        _check_storage_env()
    # Parsing the metadata and planning make ~10^5 small objects for a few thousand tensors;
    # with the collector on, each of its full passes walks every live object of the process
    # (the model, torch's modules): 0.6 s of a 0.65 s metadata phase for 2,000 tensors, 0.05
    # s without (spec/09-checkpoint.md, "Measured"). The load makes no cycles of its own.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _load(state_dict, Path(os.fspath(checkpoint_id)), group, reads,
                     max_buffer_bytes, thread_count, trace_reads, storage)  # fmt: skip
    finally:
        if collecting:
            gc.enable()


def _check_storage_env() -> None:
    from .storage import ENV, KINDS

    env = os.environ.get(ENV, "").strip().lower()
    if env and env not in KINDS:
        raise ValueError(f"{ENV} must be 'local' or 'shared', got {env!r}")


def _load(
    state_dict: dict[str, Any],
    path: Path,
    group: dist.ProcessGroup | None,
    reads: str,
    max_buffer_bytes: int | None,
    thread_count: int | None,
    trace_reads: bool,
    storage: str | None,
) -> LoadStats:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.stateful import Stateful

    stats = LoadStats()
    clock = time.perf_counter()
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    comm = torch.device("cpu")
    if str(dist.get_backend(group)) == "nccl":
        comm = torch.device("cuda", torch.cuda.current_device())

    md, nread, hf, shared = _shared_metadata(
        path, rank, group, comm, world >= COLUMNS_FROM_RANKS, storage if reads == "auto" else ""
    )
    stats.storage = "shared" if shared else "local" if reads == "auto" else ""
    stats.bytes_read += nread
    now = time.perf_counter()
    stats.seconds["metadata"], clock = now - clock, now

    keys = sorted(state_dict)
    stateful_sd: dict[str, Any] = {}
    stateful: set[str] = set()
    error: str | None = None
    digest = b""
    targets: list[Target] = []
    values: list[tuple[str, Any]] = []
    runs: list[Run] = []
    moved: list[Target] = []  # reads="once": the targets, small ones of a geometry stacked
    mode = reads
    mappings: Mapping[str, Any] = {}
    try:
        # As dcp.load: a Stateful value is loaded through state_dict() and load_state_dict().
        for k in keys:
            v = state_dict[k]
            # a runtime Protocol's isinstance costs ~25 us: asked only of what may be one
            plain = isinstance(v, torch.Tensor) and not hasattr(type(v), "load_state_dict")
            if not plain and isinstance(v, Stateful):
                stateful.add(k)
                v = v.state_dict()
            stateful_sd[k] = v
        flat, mappings = flatten(stateful_sd)
        targets, values, partial = _targets(flat, md, path, group, rank, world)
    except Exception as e:  # every rank must hear of it, or the others would wait
        error = f"{type(e).__name__}: {e}"
        partial = []
    if error is None and partial:
        # DTensors on meshes of part of the group: once the ranks agree they hold the same
        # such keys (a rank that failed, or holds none, meets this agreement with its final
        # one and every rank raises), all join the exchange of their meshes (CKPT-23).
        _agree(_partial_digest(targets, values, partial), None, group, comm, "no data was read")
        try:
            parts = [(targets[i].key, targets[i].dst) for i in partial]
            for i, whole in zip(partial, whole_layouts(parts, rank, group, comm)):
                targets[i].dst = whole
        except Exception as e:  # the same on every rank: they all hold the same reports
            error = f"{type(e).__name__}: {e}"
    if error is None:
        try:
            if mode != "own":  # "once" reads every saved box as an object, "auto" arrays first
                plans = [
                    TensorReads(t.key, t.saved.properties.dtype.itemsize, t.chunks, t.dst)
                    for t in targets
                ]
                if mode == "auto":
                    mode = choose_reads(plans, stats.storage, world)
                if mode == "once":
                    moved = stack_targets(targets, world)
                    runs = assign_reads(
                        [
                            TensorReads(t.key, t.saved.properties.dtype.itemsize, t.chunks,
                                        t.dst, stacked=bool(t.members))
                            for t in moved
                            if t.dst.numel
                        ],
                        world,
                    )  # fmt: skip
            digest = _digest(mode, max_buffer_bytes, targets, values)
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
    _agree(digest, error, group, comm, "no data was read")
    stats.reads = mode
    now = time.perf_counter()
    stats.seconds["plan"], clock = now - clock, now

    reader: Any = None
    got: dict[str, Any] = {}  # fqn -> the stored bytes of a non-tensor value (once)
    held: dict[str, list[torch.Tensor]] = {}
    try:
        reader = _reader(path, md, rank, thread_count, trace_reads, hf)
        if mode == "own":
            _read_own(reader, targets, values, rank, got, stats)
        else:
            held = _read_once(reader, runs, moved, values, rank, world, stats)
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    _agree(b"", error, group, comm, "the state dict may be partly loaded")
    now = time.perf_counter()
    stats.seconds["read"], clock = now - clock, now

    if mode == "once":
        got = exchange(held, runs, moved, values, group, comm, world, max_buffer_bytes)
    now = time.perf_counter()
    stats.seconds["exchange"], clock = now - clock, now

    from torch.distributed.checkpoint._traverse import set_element

    loaded: dict[str, Any] = {}
    try:
        for fqn, _ in values:
            # dcp.load's DefaultLoadPlanner.load_bytes: torch.load, not weights-only
            try:
                loaded[fqn] = torch.load(io.BytesIO(got[fqn]), weights_only=False)
            except Exception as e:
                raise CheckpointReadError(
                    f"{_value_file(reader, fqn)}: value '{fqn}': its stored bytes do not "
                    f"load: {type(e).__name__}: {e}"
                ) from e
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    # Every rank holds the same bytes of every value, so they fail alike; agreeing still
    # keeps a rank from returning while another raised. Without values (the same on every
    # rank: they are in the digest) nothing here can fail, and the collective is saved.
    if values:
        _agree(b"", error, group, comm, "the tensors are loaded, the values are not")
    for fqn, obj in loaded.items():
        set_element(stateful_sd, mappings[fqn], obj)
    for k in keys:
        if k in stateful:
            state_dict[k].load_state_dict(stateful_sd[k])
        else:  # as dcp.load: a top-level value is replaced by the loaded one
            state_dict[k] = stateful_sd[k]
    return stats


# ---------------------------------------------------------------- metadata


def flatten(state_dict: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """DCP's ``flatten_state_dict``: the state dict's leaves by dotted key, and each key's
    path in it. A flat dict of tensors (a model's usual state dict) is its own flattening,
    each key its own path: taken as it is, where DCP's walk costs ~12 us a value (2,000
    tensors: 25 ms)."""
    import torch
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    if all(type(k) is str for k in state_dict) and all(
        isinstance(v, torch.Tensor) for v in state_dict.values()
    ):
        return dict(state_dict), {k: (k,) for k in state_dict}
    return flatten_state_dict(state_dict)


def _shared_metadata(
    path: Path,
    rank: int,
    group: dist.ProcessGroup | None,
    comm: torch.device,
    columns: bool,
    storage: str | None,
) -> tuple[Metadata, int, bool, bool]:
    """The checkpoint's metadata, read by group rank 0 and broadcast (CKPT-23): as columns
    when ``columns`` and every entry is plain, else as the file's bytes; the bytes this rank
    read; whether it is a safetensors checkpoint; whether its storage is shared, as rank 0
    resolves ``storage`` (``""``: not asked), so that every rank chooses alike (CKPT-25)."""
    import torch
    import torch.distributed as dist

    from .dcp_metadata import METADATA_FILE
    from .safetensors_files import is_safetensors, metadata_from_headers, read_headers

    where = path if path.name == METADATA_FILE else path / METADATA_FILE
    kind, blob, failed, nread, shared = 0, b"", False, 0, False
    if rank == 0:
        try:
            if storage != "":
                shared = resolve_storage(storage, path) == "shared"
            if is_safetensors(path):
                kind, blob = 1, read_headers(path)
            else:
                from .dcp_metadata import metadata_path

                kind, blob = 0, metadata_path(path).read_bytes()
            nread = len(blob)
            if kind == 0 and columns:
                blob, kind = _columns_of(blob, where)
        except Exception as e:
            failed, blob = True, f"{type(e).__name__}: {e}".encode("utf-8", "replace")
    src = global_rank(group, 0)
    # One broadcast of a fixed size carries the head and a small checkpoint's whole metadata;
    # only what does not fit takes a second one (each costs ~2 ms on 8 gloo ranks, 2 cores).
    first = torch.zeros(_FIRST, dtype=torch.uint8, device=comm)
    if rank == 0:
        head = kind.to_bytes(8, "little") + len(blob).to_bytes(8, "little")
        part = head + bytes([failed, shared]) + blob[: _FIRST - _HEAD]
        first[: len(part)].copy_(torch.frombuffer(bytearray(part), dtype=torch.uint8))
    dist.broadcast(first, src, group=group)
    got = bytes(first.cpu().numpy().tobytes())
    kind, n = int.from_bytes(got[:8], "little"), int.from_bytes(got[8:16], "little")
    failed, shared = bool(got[16]), bool(got[17])
    raw = got[_HEAD : _HEAD + n]
    if n > _FIRST - _HEAD:
        rest = torch.empty(n - (_FIRST - _HEAD), dtype=torch.uint8, device=comm)
        if rank == 0:
            rest.copy_(torch.frombuffer(bytearray(blob[_FIRST - _HEAD :]), dtype=torch.uint8))
        dist.broadcast(rest, src, group=group)
        raw += bytes(rest.cpu().numpy().tobytes())
    if failed:
        raise LoadError(
            f"load of {path}: rank 0 could not read the checkpoint's metadata: "
            f"{raw.decode('utf-8', 'replace')}; no data was read (every rank raised this)"
        )
    try:
        if kind == 1:
            return metadata_from_headers(raw, path), nread, True, shared
        if kind == 2:
            from .dcp_columns import decode

            return decode(raw, where), nread, False, shared
        from .dcp_metadata import metadata_from_bytes

        return metadata_from_bytes(raw, where), nread, False, shared
    except Exception as e:  # the same bytes fail the same way on every rank
        raise LoadError(
            f"load of {path}: {type(e).__name__}: {e}; no data was read (every rank raised this)"
        ) from e


def _columns_of(raw: bytes, where: Path) -> tuple[bytes, int]:
    """What rank 0 sends of a DCP ``.metadata`` file's bytes ``raw``: its column encoding
    (kind 2; :mod:`.dcp_columns`), or the bytes themselves (kind 0) when the file does not
    parse (every rank then parses them and raises the same error) or an entry is not plain."""
    from .dcp_columns import encode
    from .dcp_metadata import collections_paused, metadata_from_bytes

    try:
        md = metadata_from_bytes(raw, where)
    except Exception:
        return raw, 0
    with collections_paused():  # lists of every chunk's values, as the parse's objects
        columns = encode(md)
    return (raw, 0) if columns is None else (columns, 2)


# ---------------------------------------------------------------- destinations


def _targets(
    flat: Mapping[str, Any],
    md: Metadata,
    path: Path,
    group: dist.ProcessGroup | None,
    rank: int,
    world: int,
) -> tuple[list[Target], list[tuple[str, Any]], list[int]]:
    """Each tensor of the flattened state dict with its destination layout and this rank's
    destination tensors; the non-tensor values, with their storage metadata; and the indices
    of the targets that are DTensors on a mesh of part of the group (their layout is their
    mesh's alone: :func:`.load_submeshes.whole_layouts` completes it)."""
    import torch
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata
    from torch.distributed.tensor import DTensor

    from shardspec.metadata.dtensor import dtensor_local_slices, from_dtensor
    from shardspec.reshard.frontends import sharded_tensor_layout

    from .dcp import checked_chunks

    saved = md.state_dict_metadata
    targets: list[Target] = []
    values: list[tuple[str, Any]] = []
    partial: list[int] = []
    ranks = _group_ranks(group, world)
    # (id of the mesh, placements, shape) -> (this rank's boxes, the layout in the group, on
    # a mesh of part of the group); the meshes live through the call, so no id is reused
    geometries: dict[tuple[Any, ...], tuple[tuple[Box, ...], Layout, bool]] = {}
    for fqn in sorted(flat):
        obj = flat[fqn]
        smd = saved.get(fqn)
        if smd is None:
            raise ValueError(f"'{fqn}' of the state dict is not in the checkpoint {path}")
        is_tensor = isinstance(obj, torch.Tensor)
        if isinstance(smd, BytesStorageMetadata):
            if is_tensor:
                raise TypeError(
                    f"'{fqn}' is a tensor in the state dict but a non-tensor value in {path}"
                )
            values.append((fqn, smd))
            continue
        if not isinstance(smd, TensorStorageMetadata):
            raise TypeError(f"'{fqn}': the checkpoint's metadata holds a {type(smd).__name__}")
        if not is_tensor:
            raise TypeError(
                f"'{fqn}' is a {type(obj).__name__} in the state dict but a tensor of shape "
                f"{tuple(smd.size)} in {path}"
            )
        shape = tuple(smd.size)
        if tuple(obj.shape) != shape:
            raise ValueError(
                f"'{fqn}' has shape {tuple(obj.shape)} in the state dict, {shape} in {path}"
            )
        if obj.dtype != smd.properties.dtype:
            raise TypeError(
                f"'{fqn}' has dtype {obj.dtype} in the state dict, {smd.properties.dtype} in "
                f"{path}; load does not cast (dcp.load would, silently)"
            )
        # CKPT-1 on the saved chunks, before anything is read (cached per chunking).
        chunks = checked_chunks(fqn, smd)
        if isinstance(obj, DTensor):
            # a model's thousands of DTensors share a few (mesh, placements, shape): their
            # layout, this rank's boxes and the group's layout made once each (~20 us a tensor)
            mesh = obj.device_mesh
            geometry = (id(mesh), obj.placements, shape)
            known = geometries.get(geometry)
            if known is None:
                layout = from_dtensor(obj)
                known = geometries[geometry] = (
                    layout.boxes_of(global_rank(group, rank)),
                    _in_group(layout, group, ranks),
                    mesh.size() < world,
                )
            boxes, dst, part = known
            # the local tensor itself: to_local() is an autograd Function (~25 us a call)
            local = getattr(obj, "_local_tensor", None)
            if not isinstance(local, torch.Tensor):
                local = obj.to_local()
            if len(boxes) == 1 and boxes[0].sizes == tuple(local.shape):
                outs = [local]
            else:
                outs = [local[sl] for sl in dtensor_local_slices(boxes)] if boxes else []
            if part:
                partial.append(len(targets))
        elif isinstance(obj, ShardedTensor):
            layout, outs = sharded_tensor_layout(obj)
            dst = _in_group(layout, group, ranks)
        else:
            dst = replicated(shape, world)
            outs = [obj]
        targets.append(Target(fqn, smd, dst, outs, chunks))
    return targets, values, partial


def _group_ranks(group: dist.ProcessGroup | None, world: int) -> dict[int, int] | None:
    """global rank -> group rank, or None for the world."""
    import torch.distributed as dist

    if group is None or group is dist.GroupMember.WORLD:
        return None
    return {dist.get_global_rank(group, g): g for g in range(world)}


def _in_group(
    layout: Layout, group: dist.ProcessGroup | None, ranks: dict[int, int] | None
) -> Layout:
    if ranks is None:
        return layout
    missing = sorted(set(layout.ranks) - set(ranks))
    if missing:
        raise ValueError(f"global ranks {missing} of a destination are not in the load's group")
    return layout.with_ranks(ranks)


def _digest(
    mode: str, max_buffer_bytes: int | None, targets: list[Target], values: list[tuple[str, Any]]
) -> bytes:
    h = hashlib.blake2b(digest_size=_DIGEST)
    h.update(repr((mode, max_buffer_bytes, [v[0] for v in values])).encode())
    for t in targets:
        h.update(t.key.encode() + b"\0")
        h.update(t.dst.fingerprint())
    return h.digest()


def _partial_digest(
    targets: list[Target], values: list[tuple[str, Any]], partial: list[int]
) -> bytes:
    """What ranks agree on before they exchange their meshes: every key, and which are
    DTensors on part of the group (never equal to a :func:`_digest`)."""
    h = hashlib.blake2b(digest_size=_DIGEST, person=b"submeshes")
    h.update(repr(([t.key for t in targets], [v[0] for v in values], partial)).encode())
    return h.digest()


def _agree(
    digest: bytes,
    error: str | None,
    group: dist.ProcessGroup | None,
    comm: torch.device,
    consequence: str,
) -> None:
    """Raise the same LoadError on every rank when any rank failed or the digests differ."""
    from shardspec.reshard.agreement import Verdict, decide_at_root, shared_problems
    from shardspec.reshard.errors import rank_ranges

    def rule(records: list[bytes]) -> Verdict:
        problems = {}
        for r, rec in enumerate(records):
            if rec[_DIGEST]:
                n = int.from_bytes(rec[_DIGEST + 1 : _DIGEST + 5], "little")
                problems[r] = rec[_DIGEST + 5 : _DIGEST + 5 + n].decode("utf-8", "replace")
        if problems:
            return Verdict(
                f"load failed, {consequence}; every rank raised this error: "
                + shared_problems(problems)
            )
        sides: dict[bytes, list[int]] = {}
        for r, rec in enumerate(records):
            sides.setdefault(rec[:_DIGEST], []).append(r)
        if len(sides) > 1:
            text = " vs ".join(rank_ranges(r) for r in sides.values())
            return Verdict(
                f"load failed, {consequence}: the ranks disagree on the keys, the destination "
                f"layouts or the options ({text}); every rank must pass the same keys, with "
                "DTensors on the same mesh and placements"
            )
        return Verdict(None)

    msg = (error or "").encode("utf-8", "replace")[:_MSG]
    record = digest.ljust(_DIGEST, b"\0") + bytes([error is not None])
    record += len(msg).to_bytes(4, "little") + msg.ljust(_MSG, b"\0")
    verdict = decide_at_root(record, group, comm, rule)
    if verdict.error is not None:
        raise LoadError(verdict.error)


# ---------------------------------------------------------------- reading


def _reader(
    path: Path, md: Metadata, rank: int, thread_count: int | None, trace: bool, hf: bool
) -> Any:
    from .dcp_reader import FileSystemReader
    from .safetensors_files import data_dir

    # A rank need not see the file to know the folder (data_dir decides by the name).
    base = data_dir(path) if hf else path.parent if path.is_file() else path
    reader = FileSystemReader(base, thread_count=thread_count, trace_reads=trace)
    reader.set_up_storage_reader(md, rank == 0)
    return reader


class _Into:
    """The planner side of our reader's ``read_data``: where each read item's bytes go."""

    def __init__(self, dest: Mapping[str, list[torch.Tensor]], sink: Callable[[str, bytes], None]):
        self.dest = dest
        self.sink = sink

    def resolve_tensor(self, req: Any) -> torch.Tensor:
        t = self.dest[req.dest_index.fqn][req.dest_index.index]
        shape = t.shape
        for d, (o, n) in enumerate(zip(req.dest_offsets, req.lengths)):
            if o or n != shape[d]:  # a narrow costs ~7 us, and most dims are whole
                t = t.narrow(d, o, n)
        out: torch.Tensor = t
        return out

    def commit_tensor(self, req: Any, tensor: Any) -> None:
        pass

    def load_bytes(self, req: Any, value: io.BytesIO) -> None:
        self.sink(req.dest_index.fqn, value.getvalue())


def _read_own(
    reader: Any,
    targets: list[Target],
    values: list[tuple[str, Any]],
    rank: int,
    got: dict[str, Any],
    stats: LoadStats,
) -> None:
    """Each rank reads the bytes of its own destinations (and every non-tensor value)."""
    import torch
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, ReadItem

    from .dcp import read_items_for_chunks

    items: list[Any] = []
    dest: dict[str, list[torch.Tensor]] = {}
    small: list[Any] = []
    later: list[tuple[Target, Sequence[Box]]] = []  # read by the reader
    spanned: list[tuple[Target, Sequence[Box]]] = []
    entries = _SmallEntries(reader, targets)
    for t in targets:
        boxes = t.dst.boxes_of(rank)
        stats.data_bytes += sum(b.numel for b in boxes) * t.saved.properties.dtype.itemsize
        chunks = entries.chunks_of(t, boxes) if boxes else []
        if chunks is None:
            later.append((t, boxes))
        else:
            small += chunks
            spanned.append((t, boxes))
    if not _read_small(reader, small, stats):
        later += spanned
    for t, held in later:
        local = [ChunkStorageMetadata(torch.Size(b.offsets), torch.Size(b.sizes)) for b in held]
        items += read_items_for_chunks(t.key, t.saved, local, checked=t.chunks)
        dest[t.key] = t.outs
    for fqn, _ in values:
        _check_value_file(reader, fqn)
        index = MetadataIndex(fqn)
        items.append(ReadItem(LoadItemType.BYTE_IO, index, torch.Size(), index,
                              torch.Size(), torch.Size()))  # fmt: skip
    _run_reader(reader, items, dest, got, stats)
    stats.value_bytes += sum(len(got[f]) for f, _ in values)


class _SmallEntries:
    """Where each saved chunk of the load's tensors lies, when :mod:`.chunk_spans` can read it
    (a small plain DCP chunk). The storage entries are filed by (key, offset) in one pass: a
    lookup per chunk (a ``MetadataIndex`` made and hashed) costs several times that for
    thousands of chunks, and only the chunks this rank reads are looked at further. From the
    column encoding (CKPT-23) the rows of the chunks a rank reads of a tensor are read as
    plain lists, at once and only those (a rank reads a few of W): no chunk or index object is
    made for a small chunk (2,000 tensors of 4 chunks read on 4 ranks: 24 us a chunk with
    them, spec/09-checkpoint.md "Measured")."""

    def __init__(self, reader: Any, targets: Sequence[Target]) -> None:
        from .chunk_spans import ChunkAt, Piece, SmallChunk, small_entry
        from .dcp import chunk_overlaps
        from .dcp_columns import ColumnStorage

        # held here: a relative import in a function costs ~1.5 us (importlib's bookkeeping),
        # once a chunk or a tensor, thousands of times a load
        self._piece, self._small_chunk, self._small_entry = Piece, SmallChunk, small_entry
        self._overlaps, self._at_name = chunk_overlaps, ChunkAt
        self._base = str(reader.path)
        self._files: dict[Any, str] = {}
        # files by number for .stack_spans, where the metadata does not number them
        self._numbers: dict[str, int] = {}
        self._names: list[str] = []
        storage = reader.storage_data
        self._at: dict[tuple[str, tuple[int, ...]], tuple[Any, Any]] = {}
        if isinstance(storage, ColumnStorage):
            # the column encoding files each chunk's entry by its position: none is made
            # unless this rank reads that chunk
            self._columns: ColumnStorage | None = storage
            return
        self._columns = None
        keys = {t.key for t in targets} | {m.key for t in targets for m in t.members}
        self._at = {
            (index.fqn, tuple(index.offset or ())): (index, info)
            for index, info in storage.items()
            if index.fqn in keys
        }

    def _path(self, rel: Any) -> str:
        where = self._files.get(rel)
        if where is None:
            name = self._columns.file(rel) if self._columns is not None else rel
            where = self._files[rel] = os.path.join(self._base, name)
        return where

    def chunk(self, t: Target, si: int, pieces: list[Any]) -> Any:
        """Saved chunk ``si`` of ``t`` filling ``pieces``, as :mod:`.chunk_spans` reads it, or
        None when it cannot (or the metadata has no storage entry for it)."""
        if self._columns is not None:
            return self._column_chunks(t, {si: pieces})[0]
        c = t.saved.chunks[si]
        found = self._at.get((t.key, tuple(c.offsets)))
        if found is None or not self._small_entry(found[1]):
            return None
        index, info = found
        return self._small_chunk(index, self._path(info.relative_path), int(info.offset),
                                 int(info.length), t.saved.properties.dtype, tuple(c.sizes),
                                 pieces)  # fmt: skip

    def stacked(self, stack: Target, si: int, first: int, parts: Sequence[Any]) -> list[Any]:
        """Saved chunk ``si`` of the stack's members ``first``, ``first + 1``, ... read whole
        into ``parts`` (one a member), as :mod:`.chunk_spans` reads them, None for a member
        it cannot read: :meth:`chunk` of each, from the geometry the members share and each
        one's storage entry alone."""
        head = stack.members[0]
        c = head.saved.chunks[si]
        offsets, sizes = tuple(c.offsets), tuple(c.sizes)
        dtype = head.saved.properties.dtype
        zeros = (0,) * len(sizes)
        piece, small, at_name = self._piece, self._small_chunk, self._at_name
        out: list[Any] = []
        members = stack.members[first : first + len(parts)]
        rows = (
            self._columns.entries_at([m.key for m in members], si).tolist()
            if self._columns is not None
            else []
        )
        for k, (m, part) in enumerate(zip(members, parts)):
            index: Any = None
            if self._columns is not None:
                f, offset, length = rows[k]
                if f >= 0 and length <= WHOLE_ITEM_BYTES:
                    index, where = at_name(m.key, offsets, si), self._path(f)
            else:
                found = self._at.get((m.key, offsets))
                if found is not None and self._small_entry(found[1]):
                    index, info = found
                    where, offset, length = (self._path(info.relative_path), int(info.offset),
                                             int(info.length))  # fmt: skip
            if index is None:
                out.append(None)
                continue
            parts_of = [piece(part, zeros, zeros, sizes)]
            out.append(small(index, where, offset, length, dtype, sizes, parts_of))
        return out

    def stack_run(self, stack: Target, si: int, first: int, out: torch.Tensor) -> Any:
        """Saved chunk ``si`` of the stack's members ``first``, ``first + 1``, ... read whole
        into the rows of ``out``, as :mod:`.stack_spans` reads them: their entries from the
        column encoding's table at once, or from the unpickled metadata's; None where a
        member's chunk has no entry, or one that is not plain or too large to read whole
        (:meth:`stacked` then reads them member by member)."""
        import numpy as np

        from .stack_spans import StackRun

        fqns = [m.key for m in stack.members[first : first + out.shape[0]]]
        offsets = tuple(stack.members[0].saved.chunks[si].offsets)
        if self._columns is not None:
            rows = self._columns.entries_at(fqns, si)
        else:  # the unpickled metadata's entries, by key and offsets; files numbered per load
            numbers, names, table = self._numbers, self._names, []
            for k in fqns:
                found = self._at.get((k, offsets))
                if found is None or not self._small_entry(found[1]):
                    return None
                info = found[1]
                number = numbers.get(info.relative_path)
                if number is None:
                    number = numbers[info.relative_path] = len(names)
                    names.append(info.relative_path)
                table.append((number, int(info.offset), int(info.length)))
            rows = np.array(table, dtype=np.int64)
        if int(rows[:, 0].min()) < 0 or int(rows[:, 2].max()) > WHOLE_ITEM_BYTES:
            return None
        return StackRun(out, fqns, si, offsets, rows)

    def numbered_path(self, number: int) -> str:
        """The path of the file :meth:`stack_run`'s entries number ``number``."""
        return self._path(number if self._columns is not None else self._names[number])

    def chunks_of(self, t: Target, boxes: Sequence[Box]) -> list[Any] | None:
        """The saved chunks of ``t`` that ``boxes`` (this rank's) overlap, with the pieces each
        fills, when all are small plain DCP chunks (:mod:`.chunk_spans`); else None."""
        piece, outs = self._piece, t.outs
        pieces: dict[int, list[Any]] = {}
        for di, si, dst_off, src_off, lengths in self._overlaps(
            t.chunks, [(b.offsets, b.sizes) for b in boxes]
        ):
            pieces.setdefault(si, []).append(piece(outs[di], dst_off, src_off, lengths))
        out = (
            self._column_chunks(t, pieces)
            if self._columns is not None
            else [self.chunk(t, si, ps) for si, ps in pieces.items()]
        )
        return None if any(c is None for c in out) else out

    def _column_chunks(self, t: Target, pieces: dict[int, list[Any]]) -> list[Any]:
        """:meth:`chunk` of each chunk of ``pieces`` from the column encoding, its rows read
        as plain lists at once (None for a chunk it cannot read)."""
        assert self._columns is not None
        positions = list(pieces)
        offsets, sizes, entries = self._columns.rows(t.key, positions)
        dtype = t.saved.properties.dtype
        out: list[Any] = []
        for si, off, size, (f, offset, length) in zip(positions, offsets, sizes, entries):
            if f < 0 or length > WHOLE_ITEM_BYTES:
                out.append(None)
                continue
            index = self._at_name(t.key, tuple(off), si)
            out.append(self._small_chunk(index, self._path(f), offset, length, dtype,
                                         tuple(size), pieces[si]))  # fmt: skip
        return out


def _read_small(reader: Any, small: list[Any], stats: LoadStats) -> bool:
    """Read ``small`` (:mod:`.chunk_spans`); False when one is an archive it cannot read in
    place (the reader reads those chunks instead)."""
    from .chunk_spans import read_spans

    try:
        nread, ranges = read_spans(small, reader.trace_reads)
    except UnsupportedItem:
        return False
    stats.bytes_read += nread
    stats.chunks += len(small)
    stats.ranges += ranges
    return True


def _read_stacks(
    reader: Any, runs: list[Any], path: Callable[[int], str], stats: LoadStats
) -> bool:
    """Read the stacks' ``runs`` (:mod:`.stack_spans`); False when one member's chunk is an
    archive it cannot read in place (they are then read as any small chunks)."""
    from .stack_spans import read_stacks

    try:
        nread, ranges = read_stacks(runs, path)
    except UnsupportedItem:
        return False
    stats.bytes_read += nread
    stats.chunks += sum(len(r.fqns) for r in runs)
    if reader.trace_reads:
        stats.ranges += ranges
    return True


def _stack_chunks(
    entries: _SmallEntries,
    t: Target,
    run: Run,
    buf: torch.Tensor,
    views: dict[str, list[torch.Tensor]],
    items: list[Any],
    small: list[Any],
    spanned: list[tuple[str, int, int, tuple[int, ...], tuple[int, ...]]],
) -> None:
    """A stack's run read member by member into the rows of ``buf``: as a small chunk each,
    or a read item of the reader where that cannot read it."""
    sizes = run.box.sizes[1:]
    zeros = (0,) * len(sizes)
    first = run.box.offsets[0]
    parts = buf.unbind(0)
    chunks = entries.stacked(t, run.chunk, first, parts)
    for member, part, c in zip(t.members[first:], parts, chunks):
        mine = views.setdefault(member.key, [])
        mine.append(part)
        where = (member.key, len(mine) - 1, run.chunk, zeros, sizes)
        if c is None:
            items.append(_run_item(member, *where[1:]))
        else:
            small.append(c)
            spanned.append(where)


def _run_reader(
    reader: Any,
    items: list[Any],
    dest: Mapping[str, list[torch.Tensor]],
    got: dict[str, Any],
    stats: LoadStats,
) -> None:
    from torch.distributed.checkpoint.planner import LoadPlan

    if not items:
        return
    reader.read_data(LoadPlan(items), _Into(dest, got.__setitem__)).wait()
    stats.bytes_read += reader.stats.bytes_read
    stats.chunks += reader.stats.chunks
    stats.ranges += [(os.path.basename(f), a, b) for f, a, b in reader.stats.ranges]
    # Values and transformed chunks go through DCP's own reader, whole.
    for req in items:
        if req.storage_index.fqn in got:
            info = reader.storage_data.get(req.storage_index)
            stats.bytes_read += int(getattr(info, "length", 0))


def _read_once(
    reader: Any,
    runs: list[Run],
    targets: list[Target],
    values: list[tuple[str, Any]],
    rank: int,
    world: int,
    stats: LoadStats,
) -> dict[str, list[torch.Tensor]]:
    """This rank's runs, read into new tensors (per key, in the order of the runs); and the
    stored bytes of the non-tensor values it reads (value ``i`` is read by rank ``i % W``)."""
    import torch
    from torch.distributed.checkpoint.metadata import MetadataIndex

    from .chunk_spans import Piece

    by_key = {t.key: t for t in targets}
    held: dict[str, list[torch.Tensor]] = {}
    items: list[Any] = []
    small: list[Any] = []
    # (dest key, dest index, chunk, start, sizes) of each small one, should the reader have to
    # read them: their read items are made only then (a ReadItem costs ~10 us)
    spanned: list[tuple[str, int, int, tuple[int, ...], tuple[int, ...]]] = []
    views: dict[str, list[torch.Tensor]] = {}  # a stack's members' parts of its runs' buffers
    entries = _SmallEntries(reader, targets)
    stacks: list[tuple[Target, Run, torch.Tensor, Any]] = []  # runs read by .stack_spans
    whole = {t.key for t in targets if world > 1 and _read_in_place(t, world)}
    for run in runs:
        if run.reader != rank:
            continue
        t = by_key[run.key]
        stats.data_bytes += run.nbytes
        if t.members:  # the same chunk of members m0, m0 + 1, ...: each read into its row
            buf = torch.empty(run.box.sizes, dtype=t.saved.properties.dtype)
            held.setdefault(run.key, []).append(buf)
            stacked = entries.stack_run(t, run.chunk, run.box.offsets[0], buf)
            if stacked is not None:
                stacks.append((t, run, buf, stacked))
            else:
                _stack_chunks(entries, t, run, buf, views, items, small, spanned)
            continue
        chunk = t.saved.chunks[run.chunk]
        mine = held.setdefault(run.key, [])
        start = tuple(o - c for o, c in zip(run.box.offsets, chunk.offsets))
        # Where the run's bytes go. Never a new tensor where that can be helped: its pages are
        # fresh anonymous memory the kernel zero-fills on first touch, which cost 5x the read
        # (spec/09-checkpoint.md, "Measured": the read phase of once). A tensor every rank
        # holds whole: straight into this rank's destination, which is then broadcast as it
        # is (load_exchange). Any other large run: the page cache's own pages, mapped.
        if run.key in whole:
            out = t.outs[0][run.box.slices()]
        else:
            # (a small run is read whole with its neighbours, below: one pread for many)
            m = None
            if run.nbytes > WHOLE_ITEM_BYTES:
                index = MetadataIndex(run.key, chunk.offsets, run.chunk)
                m = reader.map_rows(index, start, run.box.sizes)
            if m is not None:
                out, nread, ranges = m
                mine.append(out)
                stats.bytes_read += nread
                stats.chunks += 1
                if reader.trace_reads:
                    stats.ranges += [(os.path.basename(f), a, b) for f, a, b in ranges]
                continue
            out = torch.empty(run.box.sizes, dtype=t.saved.properties.dtype)
        mine.append(out)
        where = (run.key, len(mine) - 1, run.chunk, start, run.box.sizes)
        c = entries.chunk(t, run.chunk, [Piece(out, (0,) * run.box.ndim, start, run.box.sizes)])
        if c is None:
            items.append(_run_item(t, *where[1:]))
        else:
            small.append(c)
            spanned.append(where)
    if not _read_stacks(reader, [s for *_, s in stacks], entries.numbered_path, stats):
        for t, run, buf, _ in stacks:
            _stack_chunks(entries, t, run, buf, views, items, small, spanned)
    if not _read_small(reader, small, stats):
        owner = {**by_key, **{m.key: m for t in targets for m in t.members}}
        items += [_run_item(owner[w[0]], *w[1:]) for w in spanned]
    got: dict[str, Any] = {}
    _run_reader(reader, items, {**held, **views}, got, stats)
    for i, (fqn, _) in enumerate(values):
        if i % world == rank:
            raw = _stored_bytes(reader, fqn, stats)
            held[BYTES_KEY + fqn] = [torch.frombuffer(bytearray(raw), dtype=torch.uint8)]
            stats.value_bytes += len(raw)
    return held


def _run_item(
    t: Target, index: int, chunk: int, start: tuple[int, ...], sizes: tuple[int, ...]
) -> Any:
    """The read item of rows ``start`` (``sizes`` long) of saved chunk ``chunk`` of ``t`` into
    destination ``index`` of its key (the reader's ``dest``)."""
    import torch
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, ReadItem

    offsets = tuple(t.saved.chunks[chunk].offsets)
    at = torch.Size(tuple(o + s for o, s in zip(offsets, start)))
    return ReadItem(
        type=LoadItemType.TENSOR,
        dest_index=MetadataIndex(t.key, at, index),
        dest_offsets=torch.Size((0,) * len(sizes)),
        storage_index=MetadataIndex(t.key, offsets, chunk),
        storage_offsets=torch.Size(start),
        lengths=torch.Size(sizes),
    )


def _read_in_place(t: Target, world: int) -> bool:
    """Whether ``reads="once"`` reads ``t``'s runs straight into this rank's destination:
    every rank holds the tensor whole (its runs are then broadcast from where they were read,
    ``load_exchange._broadcast_whole``) in a plain CPU tensor of the saved dtype."""
    import torch

    if len(t.outs) != 1 or not whole_on_every_rank(t.dst, world):
        return False
    out = t.outs[0]
    return (
        type(out) is torch.Tensor
        and out.device.type == "cpu"
        and out.dtype == t.saved.properties.dtype
        and not out.is_conj()
        and not out.is_neg()
    )


def _stored_bytes(reader: Any, fqn: str, stats: LoadStats) -> bytes:
    """The bytes ``torch.load`` reads for non-tensor value ``fqn``, read once here."""
    import torch
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

    info = _check_value_file(reader, fqn)
    got: dict[str, bytes] = {}
    index = MetadataIndex(fqn)
    item = ReadItem(LoadItemType.BYTE_IO, index, torch.Size(), index, torch.Size(), torch.Size())
    # Through DCP's reader: it undoes storage transforms, and a value is small.
    reader.read_data(LoadPlan([item]), _Into({}, got.__setitem__)).wait()
    stats.bytes_read += int(getattr(info, "length", 0))
    stats.chunks += 1
    return got[fqn]


def _value_file(reader: Any, fqn: str) -> str:
    from torch.distributed.checkpoint.metadata import MetadataIndex

    info = reader.storage_data.get(MetadataIndex(fqn))
    return os.path.join(str(reader.path), str(getattr(info, "relative_path", "?")))


def _check_value_file(reader: Any, fqn: str) -> Any:
    """The storage entry of value ``fqn``, after checking its file holds its bytes (DCP's own
    reader would hand ``torch.load`` a short read)."""
    from torch.distributed.checkpoint.metadata import MetadataIndex

    info = reader.storage_data.get(MetadataIndex(fqn))
    if info is None:
        raise CheckpointReadError(
            f"{reader.path}: value '{fqn}': the checkpoint's metadata has no storage entry for it"
        )
    where = _value_file(reader, fqn)
    try:
        size = os.stat(where).st_size
    except OSError as e:
        raise CheckpointReadError(
            f"{where}: value '{fqn}': cannot open the file: {e.strerror}"
        ) from e
    end = int(info.offset) + int(info.length)
    if size < end:
        raise CheckpointReadError(
            f"{where}: value '{fqn}': the file is truncated: the value's bytes "
            f"[{info.offset}, {end}) end past the file's {size} bytes"
        )
    return info
