"""Launcher benchmark: crun against stock torchrun (PyTorch 2.x from PyPI, and Debian's 1.13
through tests/compat/torchrun_fixed.py), same machine, same run. Writes its section of
docs/benchmarks.md (between the launch-bench markers).

  * launch -> exit: `--standalone --nproc-per-node N --no-python true`, N = 2 and 8
  * restart: a worker fails; time until every replacement is running (restart_probe.sh)
  * peak RSS of the launcher process itself (its workers are tiny: `true`, `sh`)

Usage: launch_bench.py --crun BIN --probe BIN --torch2-python PY [--rounds 5] [--out FILE]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FIXED = os.path.join(HERE, "..", "compat", "torchrun_fixed.py")
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from bench_support import measured_at, write_section  # noqa: E402


def launchers(args):
    return {
        "crun": [args.crun, "--standalone"],
        "torchrun 2.x": [args.torch2_python, "-m", "torch.distributed.run", "--standalone"],
        "torchrun 1.13": ["/usr/bin/python3", FIXED, "--standalone"],
    }


def timed(cmd, env=None):
    """Wall time of one run, started directly (nothing else's start-up is counted)."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       timeout=600, env=env)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} exited {r.returncode}: {r.stderr[-500:]}")
    return wall


def peak_rss_kib(cmd, env=None):
    """Peak RSS of the launcher process, from GNU time (a small C program: what it holds
    before exec is far below any launcher's footprint, so it cannot inflate the number)."""
    r = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, timeout=600, env=env)
    return int(r.stderr.strip().splitlines()[-1])


def restart_latency(cmd, nproc, probe):
    out = tempfile.mkdtemp(prefix="crun-restart-")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([*cmd, "--nproc_per_node", str(nproc), "--max_restarts", "1",
                        "--no_python", probe, out], capture_output=True, text=True,
                       timeout=600, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} restart run exited {r.returncode}: {r.stderr[-500:]}")
    with open(os.path.join(out, "crash")) as f:
        crash = int(f.read())
    starts = []
    for lr in range(nproc):
        with open(os.path.join(out, f"start_{lr}")) as f:
            starts.append(int(f.read()))
    return (max(starts) - crash) / 1e6  # ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--crun", required=True)
    ap.add_argument("--torch2-python", required=True)
    ap.add_argument("--probe", required=True, help="the restart_probe binary")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="docs/benchmarks.md")
    args = ap.parse_args()
    args.measured_at = measured_at()  # before the run: the tree may change while it runs
    env = dict(os.environ, OMP_NUM_THREADS="1")
    rows = {}
    for name, cmd in launchers(args).items():
        for n in (2, 8):
            run = [*cmd, "--nproc_per_node", str(n), "--no_python", "true"]
            rows[(name, "launch", n)] = statistics.median(
                timed(run, env) for _ in range(args.rounds)) * 1000
            rows[(name, "rss", n)] = max(peak_rss_kib(run, env) for _ in range(2)) / 1024
            print(f"{name:14} launch x{n}: {rows[(name, 'launch', n)]:8.1f} ms, "
                  f"peak RSS {rows[(name, 'rss', n)]:.1f} MiB", file=sys.stderr)
        for n in (2, 8):
            rows[(name, "restart", n)] = statistics.median(
                restart_latency(cmd, n, args.probe) for _ in range(args.rounds))
            print(f"{name:14} restart x{n}: {rows[(name, 'restart', n)]:8.1f} ms", file=sys.stderr)
    write(args, rows)


def write(args, rows):
    names = ["crun", "torchrun 2.x", "torchrun 1.13"]
    lines = ["## Launcher: start, restart, memory", "",
             f"`tests/bench/launch_bench.py`, median of {args.rounds} runs each, on the same "
             "machine as above. Workers are trivial programs (`--no-python true`; for restarts "
             "`tests/workers/restart_probe.cc`, whose first instruction takes the time), so the "
             "numbers are the launchers' own. *restart*: from the failing worker's last "
             "timestamp to the last replacement's first one. *peak RSS*: the launcher process, from GNU time. "
             + args.measured_at, "",
             "| | " + " | ".join(names) + " | torchrun 2.x / crun |",
             "|---|" + "---|" * (len(names) + 1)]
    for metric, label, unit in [("launch", "launch → exit, 2 workers", "ms"),
                                ("launch", "launch → exit, 8 workers", "ms"),
                                ("restart", "restart, 2 workers", "ms"),
                                ("restart", "restart, 8 workers", "ms"),
                                ("rss", "peak RSS, 8 workers", "MiB")]:
        n = 2 if "2 workers" in label else 8
        vals = [rows[(name, metric, n)] for name in names]
        ratio = vals[1] / vals[0] if vals[0] else 0
        lines.append(f"| {label} | " + " | ".join(f"{v:,.1f} {unit}" for v in vals) +
                     f" | {ratio:,.0f}× |")
    lines += ["", "Reproduce: `python3 tests/bench/launch_bench.py --crun build/launcher/crun "
              "--probe build/tests/bench/restart_probe --torch2-python \"$(bash scripts/setup-torch2.sh)\"`"]
    write_section(args.out, "launch-bench", lines)


if __name__ == "__main__":
    main()
