"""``python -m conformance.gpu --bench`` without a GPU: its options, size list, statistics and
table are pure and checked here against hand-worked values; the executor's pack and unpack it
times are checked against slices of the matrix on CPU; without CUDA it refuses in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from conformance.gpu import bench as gb
from conformance.gpu.env import ROOT

M, G = 1 << 20, 1 << 30


def test_sizes_are_read_and_written_in_binary_units() -> None:
    assert gb.parse_size("64M") == 64 * M
    assert gb.parse_size("64MiB") == 64 * M
    assert gb.parse_size("4g") == 4 * G
    assert gb.parse_size("4096") == 4096
    assert gb.parse_size("3K") == 3072
    for bad in ("", "M", "1.5G", "-1G", "0", "12X"):
        with pytest.raises(ValueError, match="size"):
            gb.parse_size(bad)
    assert [gb.format_size(n) for n in (64 * M, 4 * G, 1536 * 1024, 1000)] == [
        "64M",
        "4G",
        "1536K",
        "1000",
    ]


def test_options_default_to_64m_through_4g_and_gloo_worlds_2_and_4() -> None:
    args = gb.parse_args([])
    assert args.sizes == [64 * M, 256 * M, G, 4 * G]
    assert args.worlds == [2, 4]
    assert args.out is None and not args.no_dtensor
    args = gb.parse_args(["--sizes", "1G,64M,64M", "--worlds", "4,2,4", "--out", "b.json"])
    assert args.sizes == [64 * M, G]
    assert args.worlds == [2, 4]
    assert args.out == "b.json"


@pytest.mark.parametrize(
    "argv",
    [["--sizes", "lots"], ["--sizes", ","], ["--worlds", "0"], ["--repeat", "0"], ["--warmup=-1"]],
)
def test_bad_options_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        gb.parse_args(argv)
    assert e.value.code == 2
    assert "error" in capsys.readouterr().err


def test_sizes_that_do_not_fit_the_free_memory_are_skipped() -> None:
    # 10 GiB free, 90% usable = 9 GiB: 4x of 2 GiB fits (8 GiB), 4x of 4 GiB does not
    fit, skipped = gb.fit_sizes([64 * M, 2 * G, 4 * G], 10 * G, 4)
    assert fit == [64 * M, 2 * G] and skipped == [4 * G]
    # each extra process takes a CUDA context: two of them leave 7 GiB, so 2 GiB goes too
    fit, skipped = gb.fit_sizes([64 * M, 2 * G, 4 * G], 10 * G, 4, processes=2)
    assert fit == [64 * M] and skipped == [2 * G, 4 * G]
    assert gb.fit_sizes([M], 0, 4) == ([], [M])


def test_matrix_shapes_are_square_powers_of_two_that_split_over_four_ranks() -> None:
    assert gb.matrix_shape(64 * M) == (4096, 4096)
    assert gb.matrix_shape(256 * M) == (8192, 8192)
    assert gb.matrix_shape(4 * G) == (32768, 32768)
    assert gb.matrix_shape(1) == (1, 1)
    assert gb.matrix_shape(12345 * 4) == (96, 128)


def test_a_collective_takes_its_slowest_rank_and_the_median_is_reported() -> None:
    assert gb.slowest_rank([[1.0, 5.0, 2.0], [3.0, 2.0]]) == [3.0, 5.0]
    assert gb.slowest_rank([]) == []
    s = gb.summarize([3.0, 1.0, 2.0, 10.0, 2.0], 10**9)
    assert s["median_ms"] == 2.0 and s["min_ms"] == 1.0 and s["max_ms"] == 10.0
    assert s["n"] == 5
    assert s["gbps"] == pytest.approx(500.0)  # 1 GB in 2 ms
    with pytest.raises(ValueError):
        gb.summarize([], 1)
    assert gb.ratio({"median_ms": 6.0}, {"median_ms": 2.0}) == 3.0
    assert gb.ratio({"error": "x"}, {"median_ms": 2.0}) is None
    assert gb.ratio(None, {"median_ms": 2.0}) is None


def test_a_failing_rank_is_the_result_of_its_world() -> None:
    assert gb._merge([[1.0, 4.0], [2.0, 3.0]], 10**9)["median_ms"] == 3.0  # of [2, 4]
    error = {"error": "Traceback\nRuntimeError: gloo"}
    assert gb._merge([[1.0], error], 1) == error
    crashed = SimpleNamespace(message="rank 1 died")
    assert gb._merge([[1.0], crashed], 1) == {"error": "SimpleNamespace: rank 1 died"}


def _stats(ms: float) -> dict[str, float]:
    return {"median_ms": ms, "min_ms": ms, "max_ms": ms, "n": 3, "gbps": 64 * M / ms / 1e6}


def test_the_table_gives_ratios_to_the_copy_floor_and_of_dtensor_to_ours() -> None:
    result = {
        "torch": "2.11.0",
        "cuda": "12.8",
        "device": "NVIDIA H100",
        "free_bytes": 80 * G,
        "local": {str(64 * M): {"copy": _stats(10.0), "pack": _stats(20.0), "unpack": _stats(5.0)}},
        "reshard": [
            {"backend": "nccl", "world": 1, "size": 64 * M, "ours": _stats(30.0)},
            {
                "backend": "gloo",
                "world": 4,
                "size": 64 * M,
                "ours": _stats(40.0),
                "dtensor": _stats(100.0),
            },
            {
                "backend": "gloo",
                "world": 2,
                "size": 64 * M,
                "ours": _stats(40.0),
                "dtensor": {
                    "error": "Traceback (most recent call last)\n  File x\nRuntimeError: gloo"
                },
            },
        ],
        "skipped": [{"what": "reshard gloo W=4", "size": 4 * G, "why": "needs ~24G"}],
    }
    text = gb.render_table(result)
    lines = text.splitlines()
    assert "torch 2.11.0" in lines[0] and "NVIDIA H100" in lines[0] and "80G free" in lines[0]
    local = next(line.split() for line in lines if line.lstrip().startswith("64M"))
    # size, copy GB/s, pack GB/s, pack/copy, unpack GB/s, unpack/copy
    assert local[3] == "2.00" and local[5] == "0.50"
    rows = {" ".join(c[:2]): c for c in (line.split() for line in lines) if c[2:3] == ["64M"]}
    assert rows["nccl W=1"][3:] == ["30.00", "3.00", "-", "-"]
    assert rows["gloo W=4"][3:] == ["40.00", "4.00", "100.00", "2.50"]
    assert rows["gloo W=2"][3:] == ["40.00", "4.00", "failed", "-"]
    assert "gloo W=2 64M: dtensor: RuntimeError: gloo" in text
    assert "skipped reshard gloo W=4 4G: needs ~24G" in text


@pytest.mark.parametrize("nbytes", [4, 4096, 12345 * 4, 1 << 16])
def test_the_timed_pack_and_unpack_are_the_executors_and_move_every_byte(nbytes: int) -> None:
    *_, check = gb.packers(nbytes, "cpu")
    assert check()


def test_the_rank_code_times_both_methods_and_checks_their_result() -> None:
    """What the GPU ranks run, on two gloo ranks on CPU (timed by the clock there): each method
    gives its slowest-rank summary, and its result was checked on every rank."""
    args = gb.parse_args(["--repeat", "3", "--warmup", "1", "--timeout", "120"])
    entry = gb.measure_reshard("gloo", 2, 1 << 14, args, device="cpu")
    assert (entry["backend"], entry["world"], entry["size"]) == ("gloo", 2, 1 << 14)
    for method in gb.METHODS:
        assert "error" not in entry[method], entry[method]["error"]
        assert entry[method]["n"] == 3
        assert 0 <= entry[method]["min_ms"] <= entry[method]["median_ms"]


@pytest.mark.rule("CONF-3")
def test_without_a_gpu_the_bench_says_it_needs_one_and_exits_1() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "conformance.gpu", "--bench"],
        cwd=ROOT,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs a CUDA GPU" in lines[0] and "nothing was measured" in lines[0]
