"""A stack's runs read at once (:mod:`shardspec.checkpoint.stack_spans`, the ``reads="once"``
path of the collective load for small tensors of one geometry, CKPT-24): every member's chunk
lands in its row bit for bit, whatever the dtype, the files and the order its archives lie in,
the gaps between them, and however the reads are cut into spans and batches; a member saved
with other strides or a storage offset (another archive header) is located alone; a short,
missing or mislabelled file, or a damaged archive, is an error naming the file and the member;
an archive that holds no tensor goes back to the caller."""

from __future__ import annotations

import contextlib
import io
import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from shardspec.checkpoint import stack_spans
from shardspec.checkpoint.dcp_files import UnsupportedItem
from shardspec.checkpoint.dcp_reader import CheckpointReadError
from shardspec.checkpoint.stack_spans import StackRun, read_stacks
from shardspec.reshard.reference import same_bits
from shardspec.testing.tensors import random_tensor

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

HOWS = ["plain"] * 4 + ["strided", "offset"]  # how each member was held when saved
DTYPES = ["uint8", "bool", "int16", "int32", "bfloat16", "float32", "float64", "complex64"]


def _archive(t: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(t, buf)
    return buf.getvalue()


def _saved_as(t: Any, how: str) -> Any:
    """``t`` (values kept) as the saver held it: plainly, transposed in memory (other strides),
    or a view into a larger storage (a storage offset)."""
    if how == "strided" and t.dim() >= 2:
        return t.transpose(0, 1).contiguous().transpose(0, 1)
    if how == "offset":
        big = torch.zeros(t.numel() + 3, dtype=t.dtype)
        big[3:] = t.reshape(-1)
        return big[3:].view(t.shape)
    return t


def _write(
    tmp: Path, archives: list[bytes], file_of: list[int], order: list[int], gaps: list[int]
) -> tuple[Any, dict[int, str]]:
    """Each archive into file ``file_of[i]``, the files' archives in ``order``, each after
    ``gaps[i]`` bytes of filler. Returns the (file, offset, length) rows and the paths."""
    paths = {f: str(tmp / f"__{f}_0.distcp") for f in sorted(set(file_of))}
    data: dict[int, bytearray] = {f: bytearray() for f in paths}
    rows = [(0, 0, 0)] * len(archives)
    for i in order:
        f = file_of[i]
        data[f] += b"\xa5" * gaps[i]
        rows[i] = (f, len(data[f]), len(archives[i]))
        data[f] += archives[i]
    for f, b in data.items():
        Path(paths[f]).write_bytes(bytes(b))
    return np.array(rows, dtype=np.int64), paths


def _runs(members: list[Any], rows: Any, cuts: list[int], dtype: Any) -> list[StackRun]:
    """The members cut at ``cuts`` into runs, each with a fresh buffer."""
    out = []
    bounds = [0, *sorted(set(cuts)), len(members)]
    for a, b in itertools.pairwise(bounds):
        if a == b:
            continue
        buf = torch.full((b - a, *members[0].shape), 7, dtype=dtype)
        fqns = [f"layers.{i}.w" for i in range(a, b)]
        out.append(StackRun(buf, fqns, 1, (4, 0), rows[a:b]))
    return out


@st.composite
def _cases(draw: st.DrawFn) -> dict[str, Any]:
    dtype = draw(st.sampled_from(DTYPES))
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=ndim, max_size=ndim)))
    n = draw(st.integers(1, 30))
    nfiles = draw(st.integers(1, 3))
    return {
        "dtype": dtype,
        "shape": shape,
        "n": n,
        "hows": draw(st.lists(st.sampled_from(HOWS), min_size=n, max_size=n)),
        "file_of": draw(st.lists(st.integers(0, nfiles - 1), min_size=n, max_size=n)),
        "order": draw(st.permutations(range(n))),
        "gaps": draw(st.lists(st.sampled_from([0, 0, 0, 1, 5, 64]), min_size=n, max_size=n)),
        "cuts": draw(st.lists(st.integers(0, n), max_size=3)),
        "span": draw(st.sampled_from([1, 700, 4096, 16 << 20])),
        "batch": draw(st.sampled_from([1, 3000, 20000, 256 << 20])),
    }


@pytest.mark.rule("CKPT-24")
@settings(max_examples=60, deadline=None)
@given(case=_cases())
def test_every_member_lands_in_its_row_bit_for_bit(
    tmp_path_factory: pytest.TempPathFactory, case: dict[str, Any]
) -> None:
    tmp = tmp_path_factory.mktemp("stack")
    dtype = getattr(torch, case["dtype"])
    members = [random_tensor(case["shape"], dtype, i) for i in range(case["n"])]
    archives = [_archive(_saved_as(t, h)) for t, h in zip(members, case["hows"])]
    rows, paths = _write(tmp, archives, case["file_of"], case["order"], case["gaps"])
    runs = _runs(members, rows, case["cuts"], dtype)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(stack_spans, "SPAN_BYTES", case["span"])
        m.setattr(stack_spans, "BATCH_BYTES", case["batch"])
        nread, ranges = read_stacks(runs, paths.__getitem__)
    got = [row for r in runs for row in r.out.unbind(0)]
    for i, (want, row) in enumerate(zip(members, got)):
        assert same_bits(row, want), (i, case["hows"][i])
    # every archive read once, and nothing else (a gap between two is never read)
    assert nread == sum(len(a) for a in archives)
    spans = sorted(ranges)
    assert sum(b - a for _, a, b in spans) == nread
    for f, a, b in spans:  # each read within its file, none overlapping another
        assert 0 <= a < b <= Path(tmp / f).stat().st_size
    for (f1, _, b1), (f2, a2, _) in itertools.pairwise(spans):
        assert f1 != f2 or b1 <= a2


def _one_case(tmp: Path, n: int = 6) -> tuple[list[Any], Any, dict[int, str]]:
    members = [random_tensor((3, 4), torch.float32, i) for i in range(n)]
    rows, paths = _write(tmp, [_archive(t) for t in members], [i % 2 for i in range(n)],
                         list(range(n)), [0] * n)  # fmt: skip
    return members, rows, paths


def _read(members: list[Any], rows: Any, paths: dict[int, str]) -> None:
    read_stacks(_runs(members, rows, [], torch.float32), paths.__getitem__)


@pytest.mark.rule("CKPT-24", "CKPT-26")
def test_a_truncated_file_names_the_file_and_the_first_member_past_its_end(
    tmp_path: Path,
) -> None:
    members, rows, paths = _one_case(tmp_path)
    f = Path(paths[1])
    f.write_bytes(f.read_bytes()[: int(rows[3][1]) + 10])  # members 1, 3, 5 in file 1
    with pytest.raises(CheckpointReadError) as e:
        _read(members, rows, paths)
    msg = str(e.value)
    assert str(f) in msg and "tensor 'layers.3.w' chunk at offsets (4, 0)" in msg, msg
    assert "truncated" in msg, msg


@pytest.mark.rule("CKPT-24", "CKPT-26")
def test_a_missing_file_is_named(tmp_path: Path) -> None:
    members, rows, paths = _one_case(tmp_path)
    Path(paths[0]).unlink()
    with pytest.raises(CheckpointReadError, match="cannot open the file") as e:
        _read(members, rows, paths)
    assert paths[0] in str(e.value) and "tensor 'layers.0.w'" in str(e.value)


@pytest.mark.rule("CKPT-24", "CKPT-26")
@pytest.mark.parametrize("member", [0, 4])  # the one parsed for its length, or one compared
def test_a_member_of_another_dtype_is_named(tmp_path: Path, member: int) -> None:
    members = [random_tensor((3, 4), torch.float32, i) for i in range(6)]
    saved = list(members)
    saved[member] = saved[member].to(torch.float64)[:, :2]  # same bytes, another tensor
    rows, paths = _write(tmp_path, [_archive(t) for t in saved], [0] * 6, list(range(6)),
                         [0] * 6)  # fmt: skip
    with pytest.raises(CheckpointReadError) as e:
        _read(members, rows, paths)
    msg = str(e.value)
    assert f"tensor 'layers.{member}.w'" in msg and "torch.float64" in msg, msg


@pytest.mark.rule("CKPT-24", "CKPT-26")
@pytest.mark.parametrize("member", [0, 3])
def test_a_damaged_archive_is_named(tmp_path: Path, member: int) -> None:
    members, rows, paths = _one_case(tmp_path)
    f = Path(paths[member % 2])
    data = bytearray(f.read_bytes())
    data[int(rows[member][1])] ^= 0xFF  # its first local header's signature
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointReadError) as e:
        _read(members, rows, paths)
    assert str(f) in str(e.value) and f"tensor 'layers.{member}.w'" in str(e.value)


def _alone(archive: bytes, dtype: Any, shape: tuple[int, ...]) -> Any:
    """What locating ``archive`` alone gives (the one-chunk path): the tensor it holds, or
    None where that raises or holds another dtype or size than the metadata's."""
    from shardspec.checkpoint.dcp_files import DamagedItem, locate_tensor

    try:
        s = locate_tensor(lambda off, n: memoryview(archive)[off : off + n], len(archive))
    except (DamagedItem, UnsupportedItem, EOFError):
        return None
    if s.dtype != dtype or s.size != shape:
        return None
    data = torch.frombuffer(bytearray(archive[s.data_offset : s.data_offset + s.data_length]),
                            dtype=torch.uint8).view(dtype)  # fmt: skip
    return data.as_strided(s.size, s.stride, s.storage_offset)


@pytest.mark.rule("CKPT-24")
def test_a_flipped_byte_before_any_members_data_reads_as_that_member_alone(
    tmp_path: Path,
) -> None:
    """Every byte up to the data, and of the end record, is compared with the parsed member's:
    a flip anywhere there, in a member that is not the one parsed, gives what locating that
    member alone gives (an error, or the tensor its archive then describes), never the parsed
    one's reading."""
    members, rows, paths = _one_case(tmp_path, 4)
    archive = _archive(members[3])
    from shardspec.checkpoint.dcp_files import HeaderCache

    data_offset = HeaderCache().locate(memoryview(archive)).data_offset
    f = Path(paths[1])  # members 1 and 3; member 0 (file 0) is the one parsed
    original = f.read_bytes()
    at = int(rows[3][1])
    raised = 0
    for k in [*range(data_offset), *range(len(archive) - 22, len(archive))]:
        flipped = bytearray(archive)
        flipped[k] ^= 0x01
        data = bytearray(original)
        data[at : at + len(archive)] = flipped
        f.write_bytes(bytes(data))
        want = _alone(bytes(flipped), torch.float32, (3, 4))
        runs = _runs(members, rows, [], torch.float32)
        try:
            read_stacks(runs, paths.__getitem__)
        except (CheckpointReadError, UnsupportedItem) as e:
            assert want is None, (k, e)
            raised += 1
            continue
        assert want is not None, k
        assert same_bits(runs[0].out[3], want), k
    assert raised > 0


@pytest.mark.rule("CKPT-24")
def test_an_archive_that_holds_no_tensor_goes_back_to_the_caller(tmp_path: Path) -> None:
    members = [random_tensor((3, 4), torch.float32, i) for i in range(3)]
    archives = [_archive(t) for t in members]
    archives[1] = _archive({"not": "a tensor"})
    rows, paths = _write(tmp_path, archives, [0] * 3, [0, 1, 2], [0] * 3)
    with pytest.raises(UnsupportedItem):
        _read(members, rows, paths)


@pytest.mark.rule("CKPT-26")
@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
def test_any_flipped_byte_outside_the_data_is_a_damaged_or_unsupported_item_or_a_tensor(
    mask: int,
) -> None:
    """Locating an archive alone (every reader's check of a chunk's bytes) ends in one of its
    three answers whatever byte outside the data is flipped: never another exception (a
    damaged pickle can load with other objects in the tensor's places, a damaged directory can
    count past its bytes)."""
    from shardspec.checkpoint.dcp_files import DamagedItem, locate_tensor

    archive = _archive(random_tensor((3, 4), torch.float32, 0))
    s = locate_tensor(lambda off, n: memoryview(archive)[off : off + n], len(archive))
    outside = [*range(s.data_offset), *range(s.data_offset + s.data_length, len(archive))]
    for k in outside:
        flipped = bytes(archive[:k]) + bytes([archive[k] ^ mask]) + bytes(archive[k + 1 :])
        with contextlib.suppress(DamagedItem, UnsupportedItem, EOFError):
            locate_tensor(_reader_of(flipped), len(flipped))


def _reader_of(data: bytes) -> Any:
    return lambda off, n: memoryview(data)[off : off + n]
