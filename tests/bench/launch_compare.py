"""Two builds of crun side by side: the rows of launch_bench.py (no work, launch of 2 and 8
trivial workers, a restart of 2) timed for each build in the same run, alternating the order
every round so that the machine's drift falls on both alike. For a change to a path those rows
measure, when the launch table alone cannot tell a cost from this VM's spread between runs.
Prints a table (median and p20-p80 per build); writes nothing.

Usage: launch_compare.py --before BIN --after BIN --probe BIN [--rounds 40]
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import launch_bench  # noqa: E402

ROWS = ("no work", "launch x2", "launch x8", "restart x2")


def one_round(crun, probe, env, into):
    into["no work"].append(launch_bench.timed([crun, "--version"], env) * 1000)
    for n in (2, 8):
        into[f"launch x{n}"].append(launch_bench.timed(
            [crun, "--standalone", "--nproc-per-node", str(n), "--no-python", "true"], env) * 1000)
    into["restart x2"].append(launch_bench.restart_latency([crun, "--standalone"], 2, probe))


def spread(v):
    q = statistics.quantiles(v, n=5)
    return f"{statistics.median(v):.2f} ms ({q[0]:.2f}–{q[3]:.2f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="crun of the build before the change")
    ap.add_argument("--after", required=True, help="crun of the build with it")
    ap.add_argument("--probe", required=True, help="the restart_probe binary")
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args()
    if args.rounds < 5:
        ap.error("--rounds: at least 5 (the table gives quintiles)")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    runs = {b: {r: [] for r in ROWS} for b in ("before", "after")}
    for i in range(args.rounds):
        order = ("before", "after") if i % 2 == 0 else ("after", "before")
        for build in order:
            one_round(getattr(args, build), args.probe, env, runs[build])
    print("| row | before: median (p20–p80) | after: median (p20–p80) |")
    print("|---|---|---|")
    for r in ROWS:
        print(f"| {r} | {spread(runs['before'][r])} | {spread(runs['after'][r])} |")


if __name__ == "__main__":
    main()
