"""Launcher benchmark: crun against stock torchrun (PyTorch 2.x from PyPI, and Debian's 1.13
through tests/compat/torchrun_fixed.py), same machine, same run. Writes its section of
docs/benchmarks.md (between the launch-bench markers).

  * start -> exit with no work: `crun --version` (torchrun has no --version: `--help`)
  * launch -> exit: `--standalone --nproc-per-node N --no-python true`, N = 2 and 8
  * restart: a worker fails; time until every replacement is running (restart_probe.sh)
  * restart with a health gate: the same, crun running GATE before the rejoin (docs/health.md)
  * peak RSS of the launcher process itself (its workers are tiny: `true`, `sh`)

Beside them, the physical limit in the same run: tests/bench/spawn_limit.cc (a statically
linked program) forking, exec'ing and waiting for N copies of `true` (N = 0 for the no-work row).

Usage: launch_bench.py --crun BIN --probe BIN --limit BIN --torch2-python PY [--rounds 5]
                       [--out FILE]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FIXED = os.path.join(HERE, "..", "compat", "torchrun_fixed.py")
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from bench_support import measured_at, timed_run, write_section  # noqa: E402


# The health gate a job would run before every join (docs/health.md): a command, disk, memory.
GATED_ROW = "restart, 2 workers, health gate"
GATE = ["--health-check", "true", "--health-check", "disk", "--health-check", "memory"]


def launchers(args):
    return {
        "crun": [args.crun, "--standalone"],
        "torchrun 2.x": [args.torch2_python, "-m", "torch.distributed.run", "--standalone"],
        "torchrun 1.13": ["/usr/bin/python3", FIXED, "--standalone"],
    }


def timed(cmd, env=None):
    """Wall time of one run, started directly (nothing else's start-up is counted), to the
    moment it ends (bench_support.timed_run)."""
    wall, code, err = timed_run(cmd, env)
    if code != 0:
        raise RuntimeError(f"{cmd[:3]} exited {code}: {err[-500:]}")
    return wall


def peak_rss_kib(cmd, env=None):
    """Peak RSS of the launcher process, from GNU time (a small C program: what it holds
    before exec is far below any launcher's footprint, so it cannot inflate the number)."""
    r = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, timeout=600, env=env)
    return int(r.stderr.strip().splitlines()[-1])


def restart_latency(cmd, nproc, probe):
    out = tempfile.mkdtemp(prefix="crun-restart-")
    try:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        r = subprocess.run([*cmd, "--nproc_per_node", str(nproc), "--max_restarts", "1",
                            "--no_python", probe, out], capture_output=True, text=True,
                           timeout=600, env=env)
        if r.returncode != 0:
            raise RuntimeError(f"{cmd[:3]} restart run exited {r.returncode}: "
                               f"{r.stderr[-500:]}")
        with open(os.path.join(out, "crash")) as f:
            crash = int(f.read())
        starts = []
        for lr in range(nproc):
            with open(os.path.join(out, f"start_{lr}")) as f:
                starts.append(int(f.read()))
        return (max(starts) - crash) / 1e6  # ms
    finally:
        shutil.rmtree(out, ignore_errors=True)


def limit_rows(args, env):
    """The floor, timed the same way as the launchers: spawn_limit N true."""
    rows = {}
    for n in (0, 2, 8):
        rows[("limit", "launch", n)] = statistics.median(
            timed([args.limit, str(n), "true"], env) for _ in range(args.rounds * 4)) * 1000
        print(f"{'limit':14} launch x{n}: {rows[('limit', 'launch', n)]:8.2f} ms", file=sys.stderr)
    return rows


def no_work(name, cmd):
    """The launcher started and ended with nothing to do."""
    if name == "crun":
        return [cmd[0], "--version"]
    return [*cmd[:-1], "--help"]  # torchrun has no --version; drop --standalone


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--crun", required=True)
    ap.add_argument("--limit", required=True, help="the spawn_limit binary")
    ap.add_argument("--torch2-python", required=True)
    ap.add_argument("--probe", required=True, help="the restart_probe binary")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="docs/benchmarks.md")
    args = ap.parse_args()
    args.measured_at = measured_at()  # before the run: the tree may change while it runs
    env = dict(os.environ, OMP_NUM_THREADS="1")
    rows = limit_rows(args, env)
    for name, cmd in launchers(args).items():
        rounds = args.rounds * 4 if name == "crun" else args.rounds  # milliseconds: more runs
        rows[(name, "launch", 0)] = statistics.median(
            timed(no_work(name, cmd), env) for _ in range(rounds)) * 1000
        print(f"{name:14} no work: {rows[(name, 'launch', 0)]:8.2f} ms", file=sys.stderr)
        for n in (2, 8):
            run = [*cmd, "--nproc_per_node", str(n), "--no_python", "true"]
            rows[(name, "launch", n)] = statistics.median(
                timed(run, env) for _ in range(rounds)) * 1000
            rows[(name, "rss", n)] = max(peak_rss_kib(run, env) for _ in range(2)) / 1024
            print(f"{name:14} launch x{n}: {rows[(name, 'launch', n)]:8.1f} ms, "
                  f"peak RSS {rows[(name, 'rss', n)]:.1f} MiB", file=sys.stderr)
        for n in (2, 8):
            rows[(name, "restart", n)] = statistics.median(
                restart_latency(cmd, n, args.probe) for _ in range(args.rounds))
            print(f"{name:14} restart x{n}: {rows[(name, 'restart', n)]:8.1f} ms", file=sys.stderr)
        if name == "crun":
            rows[("crun", "gated", 2)] = statistics.median(
                restart_latency([*cmd, *GATE], 2, args.probe) for _ in range(args.rounds * 4))
            print(f"{name:14} restart x2, health gate: {rows[('crun', 'gated', 2)]:8.1f} ms",
                  file=sys.stderr)
    write(args, rows)


def write(args, rows):
    names = ["crun", "torchrun 2.x", "torchrun 1.13"]
    lines = ["## Launcher: start, restart, memory", "",
             f"`tests/bench/launch_bench.py`, median of {args.rounds} runs each ({args.rounds * 4} "
             "for crun and the limit), on the same machine as above, each started from Python's "
             "`subprocess` and timed to its exit, which a pidfd reports (the spawn's own cost is in "
             "every figure, the limit's included). Workers are "
             "trivial programs (`--no-python true`; for restarts "
             "`tests/workers/restart_probe.cc`, whose first instruction takes the time), so the "
             "numbers are the launchers' own. *limit*: `tests/bench/spawn_limit.cc`, a "
             "statically linked program that forks, execs and waits for the same workers and "
             "does nothing else. "
             "*no work*: `crun --version`; torchrun has no `--version`, so `--help`. "
             "*restart*: from the failing worker's last "
             "timestamp to the last replacement's first one. *health gate*: the same restart with "
             "crun checking `" + " ".join(GATE) + "` before the rejoin (docs/health.md), "
             f"median of {args.rounds * 4}; torchrun has no gate, so its columns repeat its plain "
             "restart. *peak RSS*: the launcher process, from GNU time. "
             + args.measured_at, "",
             "| | crun | limit | crun / limit | torchrun 2.x | torchrun 1.13 "
             "| torchrun 2.x / crun |",
             "|---|---|---|---|---|---|---|"]
    for metric, label, unit, n in [("launch", "start → exit, no work", "ms", 0),
                                   ("launch", "launch → exit, 2 workers", "ms", 2),
                                   ("launch", "launch → exit, 8 workers", "ms", 8),
                                   ("restart", "restart, 2 workers", "ms", 2),
                                   ("restart", "restart, 8 workers", "ms", 8),
                                   ("rss", "peak RSS, 8 workers", "MiB", 8)]:
        crun, t2, t1 = (rows[(name, metric, n)] for name in names)
        limit = rows.get(("limit", metric, n))
        digits = 2 if metric == "launch" else 1
        cells = [f"{crun:,.{digits}f} {unit}",
                 f"{limit:,.{digits}f} {unit}" if limit else "—",
                 f"{crun / limit:,.1f}×" if limit else "—",
                 f"{t2:,.1f} {unit}", f"{t1:,.1f} {unit}", f"{t2 / crun:,.0f}×"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
        if (metric, n) == ("restart", 2):
            gated = rows[("crun", "gated", 2)]
            lines.append(f"| {GATED_ROW} | {gated:,.1f} ms | — | — | {t2:,.1f} ms | {t1:,.1f} ms "
                         f"| {t2 / gated:,.0f}× |")
    lines += ["", "Reproduce: `python3 tests/bench/launch_bench.py --crun build/launcher/crun "
              "--probe build/tests/bench/restart_probe --limit build/tests/bench/spawn_limit "
              "--torch2-python \"$(bash scripts/setup-torch2.sh)\"`"]
    write_section(args.out, "launch-bench", lines)


if __name__ == "__main__":
    main()
