"""Why a worker's exception costs a restart more than its SIGKILL (issue 77, point 5): the time a
Python worker takes to exit after an uncaught exception, which crun, like any launcher, waits
for (a failure is known when its process ends), against os.kill(SIGKILL) of itself. Standalone,
one process a case, the cases alternating; writes its section of docs/benchmarks.md (between
the exit-cost markers).

Usage: exit_cost.py --torch2-python PY [--rounds 5] [--out FILE]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from bench_support import measured_at, write_section  # noqa: E402

WORKER = """
import os, signal, sys, time
mode, end = sys.argv[1], sys.argv[2]
import torch
if mode != "torch":
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[3])
    dist.init_process_group("gloo", rank=0, world_size=1)
    model = DistributedDataParallel(torch.nn.Linear(256, 256))
    model(torch.randn(4, 256)).sum().backward()
print(time.time(), flush=True)
if end == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
raise RuntimeError("injected")
"""
CASES = [("torch imported", "torch", "raise"), ("a DDP model over Gloo", "ddp", "raise"),
         ("a DDP model over Gloo", "ddp", "kill")]


def one(python, mode, end, port):
    p = subprocess.Popen([python, "-c", WORKER, mode, end, str(port)], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    p.wait(timeout=120)
    gone = time.time()
    return gone - float(line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--torch2-python", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(HERE, "..", "..", "docs", "benchmarks.md"))
    a = ap.parse_args()
    times = {c: [] for c in CASES}
    port = 29600
    for _ in range(a.rounds):
        for c in CASES:
            port += 1
            times[c].append(one(a.torch2_python, c[1], c[2], port))
    rows = [f"`python3 tests/bench/exit_cost.py --torch2-python PY --rounds {a.rounds}`. "
            f"{measured_at()}", "",
            "| the worker | its end | from the fault to the process gone (median) |",
            "|---|---|---|"]
    for (label, _, end), t in times.items():
        how = "uncaught exception" if end == "raise" else "SIGKILL of itself"
        rows.append(f"| {label} | {how} | {statistics.median(t) * 1000:.0f} ms |")
    write_section(a.out, "exit-cost", rows)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
