"""Reshard a live TorchRec model to another plan: in memory vs a DCP save + load.

On W gloo ranks (default 4, two hosts of two), an EmbeddingBagCollection of a few tables is
sharded row-wise over every rank and moved to a second plan (table-wise on two ranks,
column-wise in reverse rank order) two ways:

- ``shardspec``: :func:`shardspec.torchrec.reshard_model`, one ``all_to_all_single`` per round,
  no file; ``shardspec-bounded`` the same with ``max_buffer_bytes`` (``--buffer-mib``, 8 MiB)
  so that the send and receive buffers stay small (more rounds);
- ``dcp``: ``torch.distributed.checkpoint.save`` of the source state dict to a temporary
  directory, then ``load`` into the destination model's state dict (the baseline).

Printed per method: median wall time over the repetitions, the largest growth of any rank's
resident memory during the operation (sampled), and the ratio to the DCP baseline measured
in the same run. Both results are checked equal before anything is printed.

    python packages/torchrec/benchmarks/bench_torchrec.py [--world 4] [--rows 200000]
        [--dim 64] [--tables 3] [--reps 3] [--buffer-mib 8]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

METHODS = ("shardspec", "shardspec-bounded", "dcp")


def _missing() -> str | None:
    try:
        import fbgemm_gpu  # noqa: F401
        import torchrec  # noqa: F401
    except Exception as e:  # ImportError, or a broken fbgemm build
        return f"{type(e).__name__}: {e}"
    return None


class PeakRSS:
    """The largest resident-set growth of this process while the block runs (1 ms sampling)."""

    def __enter__(self) -> PeakRSS:
        self.base = self._rss()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())

    @property
    def growth(self) -> int:
        return self.peak - self.base

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            time.sleep(0.001)

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _plans(world: int, tables: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    src = {t: ("row_wise", (world,), {}) for t in tables}
    dst: dict[str, Any] = {}
    for i, t in enumerate(tables):
        if i % 2 == 0:
            dst[t] = ("table_wise", (world - 1 - (i // 2) % world,), {})
        else:
            dst[t] = ("column_wise", (list(range(world))[::-1],), {})
    return src, dst


def _rank(rank: int, world: int, port: int, args: Any, root: str, out: Any) -> None:
    os.environ["LOCAL_WORLD_SIZE"] = str(2 if world % 2 == 0 else world)
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.shard import shard
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ShardingEnv

    from shardspec.torchrec import layout_for, to_parameter_sharding
    from shardspec.torchrec.model import read_state, reshard_model

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    names = [f"t{i}" for i in range(args.tables)]
    configs = [
        EmbeddingBagConfig(
            name=t, embedding_dim=args.dim, num_embeddings=args.rows + i, feature_names=[f"f{t}"]
        )
        for i, t in enumerate(names)
    ]
    shapes = {t: (args.rows + i, args.dim) for i, t in enumerate(names)}
    sharder = EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}
    )
    env = ShardingEnv.from_process_group(dist.group.WORLD)

    def build(spec: dict[str, Any]) -> Any:
        plan = EmbeddingModuleShardingPlan(
            {
                t: to_parameter_sharding(layout_for(s[0], shapes[t], *s[1], **s[2]), s[0])
                for t, s in spec.items()
            }
        )
        ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
        return shard(ebc, plan, env, torch.device("cpu"), sharder)

    src_spec, dst_spec = _plans(world, names)
    src = build(src_spec)
    with torch.no_grad():
        for i, st in enumerate(read_state(src).values()):
            for s in st.shards:
                s.uniform_(-1, 1, generator=torch.Generator().manual_seed(rank * 100 + i))

    times: dict[str, list[float]] = {m: [] for m in METHODS}
    peaks: dict[str, int] = dict.fromkeys(METHODS, 0)
    bound = args.buffer_mib * 2**20
    results: dict[str, Any] = {}
    for rep in range(args.reps):
        for method in METHODS:
            dst = build(dst_spec)
            path = os.path.join(root, f"{method}{rep}")
            dist.barrier()
            with PeakRSS() as mem:
                t0 = time.perf_counter()
                if method == "shardspec":
                    reshard_model(src, dst)
                elif method == "shardspec-bounded":
                    reshard_model(src, dst, max_buffer_bytes=bound)
                else:
                    dcp.save(src.state_dict(), checkpoint_id=path)
                    dcp.load(dst.state_dict(), checkpoint_id=path)
                dist.barrier()
                times[method].append(time.perf_counter() - t0)
            peaks[method] = max(peaks[method], mem.growth)
            results[method] = {k: [t.clone() for t in v.shards] for k, v in read_state(dst).items()}
            del dst
    same = all(
        all(torch.equal(a, b) for a, b in zip(results[m][k], results["dcp"][k]))
        for m in METHODS
        for k in results["dcp"]
    )
    out.put((rank, times, peaks, same))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--tables", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--buffer-mib", type=int, default=8, help="shardspec-bounded's bound")
    args, _ = parser.parse_known_args()
    reason = _missing()
    if reason is not None:
        print(
            f"bench_torchrec: skipped, TorchRec is not usable here ({reason}); "
            f"`nox -s torchrec` installs it"
        )
        return 0

    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = tempfile.mkdtemp(prefix="bench_torchrec_")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [
        ctx.Process(target=_rank, args=(r, args.world, port, args, root, q))
        for r in range(args.world)
    ]
    try:
        for p in procs:
            p.start()
        got = [q.get(timeout=1800) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
        shutil.rmtree(root, ignore_errors=True)
    if not all(g[3] for g in got):
        print("bench_torchrec: FAILED, the in-memory reshard and DCP disagree", file=sys.stderr)
        return 1
    mb = args.tables * args.rows * args.dim * 4 / 2**20
    print(
        f"bench_torchrec: {args.tables} tables of {args.rows}x{args.dim} float32 ({mb:.0f} MiB), "
        f"row_wise on {args.world} ranks -> table_wise/column_wise, {args.reps} reps"
    )
    print(f"{'method':<20}{'time (s)':>10}{'x dcp':>8}{'peak RSS growth (MiB)':>24}{'x dcp':>8}")
    # A rank's time is the whole collective operation (barrier to barrier): take the slowest.
    med = {
        m: statistics.median(max(g[1][m][i] for g in got) for i in range(args.reps))
        for m in METHODS
    }
    peak = {m: max(g[2][m] for g in got) / 2**20 for m in METHODS}
    for m in METHODS:
        print(
            f"{m:<20}{med[m]:>10.3f}{med[m] / med['dcp']:>8.2f}{peak[m]:>24.1f}"
            f"{peak[m] / max(peak['dcp'], 1e-9):>8.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
