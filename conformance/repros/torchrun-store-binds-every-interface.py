"""torchrun's rendezvous store listens on every interface, however it is asked for 127.0.0.1.

Run: python this-file.py (Linux: it reads /proc). It launches three one-node runs of two gloo
ranks, `torchrun --standalone`, `--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT` and
`--rdzv-backend static --master-addr 127.0.0.1`, each a few seconds, and lists the TCP sockets
each run's own processes (agent and ranks, not the rest of the machine) listen on, read from
/proc/PID/net/tcp{,6} and the sockets in /proc/PID/fd. Every process tree is killed after.
Under torchrun, only local rank 0 does this (nproc 1 is enough). Reproduced (2026-11-29, on
CPU) with torch 2.13.0+cpu, 2.14.1+cu130 and 2.15.0+cu132: the same listeners on each.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFECT = {
    "id": "torchrun-store-binds-every-interface",
    "title": "torchrun's elastic agent listens on every interface (IPv4 and IPv6) even when its "
    "rendezvous is 127.0.0.1 (--standalone, a c10d endpoint, a static master address)",
    "area": "launched",
    "rule": "CONF-9",
    "upstream": None,
    "issue_text": """### torchrun's rendezvous store listens on every interface, whatever its host

On torch 2.13.0, 2.14.1 and 2.15.0 (Linux, run on CPU), a one-node torchrun whose rendezvous
is asked for 127.0.0.1 still has its elastic agent listen on every interface (`*:PORT` in
`ss -ltnp`, IPv4 and IPv6) for the whole run, while the ranks' own sockets (gloo,
`GLOO_SOCKET_IFNAME=lo`) are on 127.0.0.1:

- `torchrun --standalone --nproc-per-node 2`: the agent listens on `*:P1` and `*:P2`; should
  be 127.0.0.1 (standalone is one node);
- `--nnodes 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29611`: on `*:29611` and `*:P`;
  should be `127.0.0.1:29611` (and 127.0.0.1 for the other);
- `--nnodes 1 --rdzv-backend static --master-addr 127.0.0.1 --master-port 29612
  --node-rank 0`: on `*:29612`; should be `127.0.0.1:29612`.

The stores are `TCPStore(host, port, is_master=True)` servers (the c10d backend's
`_create_tcp_store`, the agent's shared store of `dynamic_rendezvous`, `static_tcp_rendezvous`):
`TCPStore` uses its host only as the address clients connect to, and its server binds the
wildcard address. These stores are unauthenticated: anyone who reaches the port can read and
write the job's keys (and, for a waiting rendezvous, join it). Repro: this file
(`python torchrun-store-binds-every-interface.py`), which lists each run's listeners.

Expected: a master store binds the host it is given (127.0.0.1 for `--standalone` and for an
endpoint or master address of 127.0.0.1), or torchrun takes a bind address; `TCPStore` could
take one too (today only `master_listen_fd` gets a store onto one address).""",
    "nproc": 1,
    "torch_does": "its elastic agent's rendezvous store listens on every interface (*:PORT, "
    "IPv4 and IPv6) when torchrun is asked for 127.0.0.1 in any of the three one-node forms",
    "spec_says": "every socket a run on one node listens on is bound to loopback (CONF-9)",
    "tests": [],
}

WORKER = """import datetime, os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
dist.barrier()
open(os.path.join(sys.argv[1], "ready-" + os.environ["RANK"]), "w").close()
agent, end = os.getppid(), time.monotonic() + 120
while os.getppid() == agent and time.monotonic() < end:  # not a minute past its agent
    time.sleep(0.5)
"""
LAUNCHER_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK",
                "LOCAL_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE")  # fmt: skip


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree(root):  # root and its live descendants
    kids = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        ppid = int(text[text.rindex(")") + 2 :].split()[1])  # fields after the last ")"
        kids.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        out.append(todo.pop())
        todo += kids.get(out[-1], [])
    return out


def listening(pid):  # {(address, port)} of the TCP sockets pid holds that listen
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return set()
    found = set()
    for table, v6 in (("tcp", False), ("tcp6", True)):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:  # it ended while we looked
            return found
        for line in lines:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # TCP_LISTEN
                raw, port = f[1].split(":")
                words = [bytes.fromhex(raw[i : i + 8])[::-1] for i in range(0, len(raw), 8)]
                addr = socket.inet_ntop(socket.AF_INET6 if v6 else socket.AF_INET, b"".join(words))
                found.add((addr, int(port, 16)))
    return found


def loopback(addr):
    return addr in ("::1", "::ffff:127.0.0.1") or addr.startswith("127.")


def shown(addr, port):  # [::] is every interface, IPv4 too on a dual-stack socket
    if addr == "0.0.0.0":
        return f"*:{port}"
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def run(form, tmp):
    script = Path(tmp) / "worker.py"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    env = {k: v for k, v in env.items() if not k.startswith("TORCHELASTIC_")}
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", *form, "--nproc-per-node", "2"]
    logged = Path(tmp) / "torchrun.log"
    seen = {}  # (addr, port) -> who
    with open(logged, "wb") as log:
        proc = subprocess.Popen([*cmd, str(script), tmp], env=env, stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while len(list(Path(tmp).glob("ready-*"))) < 2:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    tail = logged.read_text(errors="replace")[-1500:]
                    raise RuntimeError(f"{' '.join(form)}: the ranks did not start\n{tail}")
                time.sleep(0.2)
            for _ in range(5):  # the listeners of the whole run, as it holds them
                for pid in tree(proc.pid):
                    who = "agent" if pid == proc.pid else "rank"
                    for a in listening(pid):
                        seen[a] = who
                time.sleep(0.2)
        finally:  # torchrun starts each rank in a session of its own: kill every process
            for pid in tree(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()
    return seen


if os.environ.get("LOCAL_RANK", "0") != "0":
    sys.exit(0)
p1, p2 = free_port(), free_port()
forms = [
    ["--standalone"],
    ["--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{p1}",
     "--rdzv-id", "repro"],
    ["--nnodes", "1", "--rdzv-backend", "static", "--master-addr", "127.0.0.1",
     "--master-port", str(p2), "--node-rank", "0"],
]  # fmt: skip
wide = False
for form in forms:
    with tempfile.TemporaryDirectory() as tmp:
        seen = run(form, tmp)
    found = ", ".join(f"{who} {shown(a, p)}" for (a, p), who in sorted(seen.items(), key=str))
    print(f"torchrun {' '.join(form)}: listening on {found}")
    bad = sorted(f"{shown(a, p)} ({who})" for (a, p), who in seen.items() if not loopback(a))
    if bad:  # said at once, so a run cut short still tells what it saw
        wide = True
        print(
            f"DIVERGES rank 0: asked for 127.0.0.1, `torchrun {' '.join(form)}` listens on "
            f"{', '.join(bad)} (every interface); the spec says every socket of a run on one "
            "node listens on loopback (127.0.0.1) only",
            flush=True,
        )
sys.exit(1 if wide else 0)
