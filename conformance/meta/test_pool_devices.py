"""How the pool maps ranks to devices (GPU mode cannot run here, so its selection logic is
tested on its own): NCCL gets one GPU per rank and skips, with the reason, a world larger than
the GPU count; every backend stops at SHARDSPEC_MAX_WORLD; torchrun ranks other than 0 stay
idle."""

from __future__ import annotations

import pytest

from shardspec.testing.devices import launcher_rank, rank_device, skip_reason


@pytest.mark.rule("CONF-3")
def test_nccl_needs_one_gpu_per_rank() -> None:
    assert skip_reason(4, backend_name="nccl", device_count=4, max_world=8) is None
    reason = skip_reason(3, backend_name="nccl", device_count=2, max_world=8)
    assert reason is not None
    assert "needs 3 CUDA GPUs" in reason and "has 2" in reason
    assert skip_reason(1, backend_name="nccl", device_count=0, max_world=8) is not None


@pytest.mark.rule("CONF-3")
def test_every_backend_stops_at_the_max_world() -> None:
    assert skip_reason(4, backend_name="gloo", max_world=4) is None
    reason = skip_reason(5, backend_name="gloo", max_world=4)
    assert reason == "world size 5 > SHARDSPEC_MAX_WORLD=4"
    assert skip_reason(5, backend_name="nccl", device_count=8, max_world=4) is not None


def test_ranks_get_their_own_device() -> None:
    assert [rank_device(r, "nccl") for r in range(3)] == ["cuda:0", "cuda:1", "cuda:2"]
    assert rank_device(2, "gloo") == "cpu"


def test_launcher_rank_reads_torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    assert launcher_rank() == 0
    monkeypatch.setenv("RANK", "3")
    assert launcher_rank() == 3


def test_gloo_ranks_share_the_gpus_with_cuda_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    # one GPU, four gloo ranks: all on cuda:0; NCCL would need four
    monkeypatch.setattr("shardspec.testing.devices.cuda_devices", lambda: 1)
    assert [rank_device(r, "gloo", "cuda") for r in range(4)] == ["cuda:0"] * 4
    assert skip_reason(4, backend_name="gloo", device="cuda", device_count=1, max_world=4) is None
    reason = skip_reason(1, backend_name="gloo", device="cuda", device_count=0, max_world=4)
    assert reason is not None and "needs a CUDA GPU" in reason
    assert rank_device(2, "gloo", "cpu") == "cpu"


@pytest.mark.rule("CONF-3")
def test_gpu_phases_share_one_gpu_over_gloo_only_when_there_is_one() -> None:
    from conformance.gpu.phases import phases

    one = phases(1)
    assert [p["SHARDSPEC_BACKEND"] for p in one] == ["nccl", "gloo"]
    assert one[1]["SHARDSPEC_DEVICE"] == "cuda" and "SHARDSPEC_DEVICE" not in one[0]
    assert phases(4) == [{"SHARDSPEC_BACKEND": "nccl"}]


@pytest.mark.rule("CONF-3")
def test_gpu_runner_takes_the_packages_from_the_checkout_where_none_is_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lent GPU machine has torch but no shardspec: find_spec then raises for the parent
    package rather than answering None, and the runner must still find the checkout's code."""
    import importlib.util

    from conformance.gpu.env import ROOT, gpu_env

    def missing(name: str, *args: object) -> None:
        raise ModuleNotFoundError(f"No module named {name.split('.')[0]!r}")

    monkeypatch.setattr(importlib.util, "find_spec", missing)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    path = gpu_env()["PYTHONPATH"].split(":")
    assert str(ROOT / "packages" / "reshard" / "src") in path
    assert str(ROOT) in path
