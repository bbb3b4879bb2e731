#!/usr/bin/env python3
"""Snapshot benchmark (docs/checkpoints.md): what keeping the training state costs a step.
One node × 2 stock PyTorch workers under crun, each holding --mib MiB of state
(tests/bench/snapshot_bench_worker.py), time a save the three ways a user can keep it, in the
same run and alternating: crun_worker.save into crun's node memory, torch.save to /dev/shm,
torch.save to local disk with fsync; and crun_worker.load after them. Then the node's memory
(every process's RSS and PSS, summed, and the tmpfs's use) while the workers hold the state,
with a snapshot saved and with --snapshots off. Writes its section of docs/benchmarks.md
(between the snapshot-bench markers).

Usage: snapshot_bench.py --crun BIN --torch2-python PY [--torch1-python PY] [--mib 200]
                         [--rounds 5] [--runs 3] [--out FILE] [--smoke]
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
sys.path.insert(0, HERE)
from bench_support import in_private_netns, measured_at, write_section  # noqa: E402
from recovery_bench import descendants, smaps, torch_version  # noqa: E402

WORKER = os.path.join(HERE, "snapshot_bench_worker.py")
WAYS = ("crun_worker.save", "torch.save /dev/shm", "torch.save disk")
LIMIT_S = 300


def run_saves(args, python):
    """One crun job; {way: [ms per save, both ranks]} and "load": [ms per rank]."""
    out = tempfile.mkdtemp(prefix="crun-snapshot-bench-")
    try:
        env = dict(os.environ, PYTHON_EXEC=python, OMP_NUM_THREADS="1")
        r = subprocess.run([args.crun, "--nproc-per-node", "2", WORKER, out, "--mib",
                            str(args.mib), "--rounds", str(args.rounds)],
                           capture_output=True, text=True, env=env, timeout=LIMIT_S)
        if r.returncode != 0:
            raise RuntimeError(f"crun exited {r.returncode}: {r.stderr[-2000:]}")
        got = {w: [] for w in WAYS}
        got["load"] = []
        for rank in range(2):
            with open(os.path.join(out, f"rank{rank}.json")) as f:
                j = json.load(f)
            for w in WAYS:
                got[w] += j["times"][w]
            got["load"].append(j["load_ms"])
        return got
    finally:
        shutil.rmtree(out, ignore_errors=True)


def shmem_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) * 1024
    return 0


def memory_once(args, python, snapshots):
    """Every process of the node while its 2 workers hold their state: PSS, RSS, and how much
    shared memory grew."""
    out = tempfile.mkdtemp(prefix="crun-snapshot-mem-")
    hold = os.path.join(out, "hold.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(hold)
    listener.listen(4)
    listener.settimeout(LIMIT_S)
    env = dict(os.environ, PYTHON_EXEC=python, OMP_NUM_THREADS="1")
    before = shmem_bytes()
    cmd = [args.crun, "--nproc-per-node", "2", "--snapshots", "on" if snapshots else "off",
           WORKER, out, "--mib", str(args.mib), "--hold", hold,
           *([] if snapshots else ["--no-save"])]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=env)
    conns = []
    try:
        conns = [listener.accept()[0] for _ in range(2)]
        result = {"pss": 0, "rss": 0, "shmem": shmem_bytes() - before}
        for pid in [p.pid, *descendants(p.pid)]:
            pss, rss = smaps(pid)
            result["pss"] += pss
            result["rss"] += rss
        for c in conns:
            c.send(b"x")
        _, err = p.communicate(timeout=LIMIT_S)
        if p.returncode != 0:
            raise RuntimeError(f"crun exited {p.returncode}: {err[-2000:]}")
        return result
    finally:
        for c in conns:
            c.close()
        listener.close()
        if p.poll() is None:
            p.kill()
            p.wait()
        shutil.rmtree(out, ignore_errors=True)


def ms(values):
    return f"{statistics.median(values):,.1f} ms" if values else "—"


def mib(values):
    return f"{max(0, statistics.median(values)) / (1 << 20):,.0f} MiB"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--crun", required=True)
    ap.add_argument("--torch2-python", required=True)
    ap.add_argument("--torch1-python", default="")
    ap.add_argument("--mib", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "..", "..", "docs", "benchmarks.md"))
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        args.mib, args.rounds, args.runs = 8, 1, 1
    if os.geteuid() == 0 and not os.environ.get("CRUN_BENCH_IN_NETNS"):
        return in_private_netns(sys.argv)
    pythons = [(args.torch2_python, torch_version(args.torch2_python))]
    if args.torch1_python:
        pythons.append((args.torch1_python, torch_version(args.torch1_python)))
    lines = [f"`tests/bench/snapshot_bench.py`: one node × 2 stock PyTorch workers under crun "
             f"(gloo, CPU, OMP_NUM_THREADS=1), each holding {args.mib} MiB of float32 tensors "
             "(4 MiB each), both ranks saving at once after a barrier, as in training. A "
             "figure is the time the worker is blocked: the median over both ranks, "
             f"{args.rounds} saves each way per run and {args.runs} runs, the ways alternating "
             "within each run. `torch.save disk` writes a file on /var/tmp and fsyncs it. "
             + measured_at(), "",
             "| PyTorch | " + " | ".join(WAYS) + " | crun_worker.load | goal |",
             "|---|" + "---|" * (len(WAYS) + 2)]
    for python, version in pythons:
        got = {w: [] for w in (*WAYS, "load")}
        for _ in range(args.runs):
            for k, v in run_saves(args, python).items():
                got[k] += v
        lines.append(f"| {version} | " + " | ".join(ms(got[w]) for w in WAYS)
                     + f" | {ms(got['load'])} | save ≤ 50 ms |")
    mem = {True: [], False: []}
    for r in range(args.runs):
        for snapshots in ((True, False) if r % 2 == 0 else (False, True)):
            mem[snapshots].append(memory_once(args, args.torch2_python, snapshots))
    lines += ["", f"| every process of 1 node × 2 workers holding {args.mib} MiB each "
              "(PyTorch 2.x) | snapshots off | one snapshot saved |",
              "|---|---|---|"]
    for key, label in (("pss", "PSS, summed"), ("rss", "RSS, summed"),
                       ("shmem", "shared memory (tmpfs) grown")):
        lines.append(f"| {label} | " + " | ".join(mib([m[key] for m in mem[s]])
                                                  for s in (False, True)) + " |")
    lines += ["", "Reproduce: `python3 tests/bench/snapshot_bench.py --crun build/launcher/crun "
              "--torch2-python \"$(bash scripts/setup-torch2.sh)\" --torch1-python "
              "/usr/bin/python3`"]
    print("\n".join(lines))
    if not args.smoke:
        write_section(args.out, "snapshot-bench", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
