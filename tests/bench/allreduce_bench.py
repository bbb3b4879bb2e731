"""Allreduce benchmark: the worker SDK's Gloo backend against PyTorch's ProcessGroupGloo, same
machine, same run, both launched by crun. float32 sum, 4 KiB to 256 MiB, 2 and 4 ranks. The SDK
runs twice: as users get it (ranks of one host talk through shared memory) and with
CRUN_GLOO_SHM=0 (Gloo's TCP pairs on loopback, the transport PyTorch uses). Reports nccl-tests' figures: algbw = bytes / time, busbw = algbw * 2(n-1)/n. Each
figure is the median over repetitions of the slowest rank's time. Writes its section of
docs/benchmarks.md (between the allreduce-bench markers).

Usage: allreduce_bench.py --crun BIN --gloo-worker BIN [--torch-python PY ...]
                          [--sizes 4096,...] [--worlds 2,4] [--rounds 3] [--out FILE]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from bench_support import human, measured_at, write_section  # noqa: E402

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]


def run(crun, nproc, program, sizes, tcp=False):
    out = tempfile.mkdtemp(prefix="crun-allreduce-")
    env = dict(os.environ)
    env.pop("CRUN_GLOO_SHM", None)
    if tcp:
        env["CRUN_GLOO_SHM"] = "0"
    r = subprocess.run([crun, "--standalone", "--nproc-per-node", str(nproc), *program, out,
                        ",".join(map(str, sizes))], capture_output=True, text=True, timeout=1800,
                       env=env)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(program)} failed:\n{r.stderr[-3000:]}")
    with open(os.path.join(out, "bench.json")) as f:
        return json.load(f)


def combine(runs):
    """One result per size: the median over runs (the first run's other fields)."""
    out = dict(runs[0])
    out["results"] = []
    for k, first in enumerate(runs[0]["results"]):
        seconds = sorted(r["results"][k]["seconds"] for r in runs)
        out["results"].append(dict(first, seconds=seconds[len(seconds) // 2],
                                   low=seconds[0], high=seconds[-1]))
    return out


def ms(res):
    """The median and, over several rounds, the range: "0.405 (0.290-3.834)"."""
    text = f"{res['seconds'] * 1e3:.3f}"
    if res.get("high", res["seconds"]) > res.get("low", res["seconds"]):
        text += f" ({res['low'] * 1e3:.3f}-{res['high'] * 1e3:.3f})"
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--crun", required=True)
    ap.add_argument("--gloo-worker", required=True)
    ap.add_argument("--torch-python", action="append", default=[])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "..", "..", "docs", "benchmarks.md"))
    a = ap.parse_args()
    a.measured_at = measured_at()  # before the run: the tree may change while it runs
    sizes = [int(s) for s in a.sizes.split(",")]
    worlds = [int(w) for w in a.worlds.split(",")]
    anchors = a.torch_python or ["/usr/bin/python3"]
    rows = []
    for n in worlds:
        # Rounds alternate the sides, so drift in the machine's state hits both alike; each
        # figure is the median over rounds of the per-run medians.
        ours_runs, tcp_runs, theirs_runs = [], [], [[] for _ in anchors]
        for _ in range(a.rounds):
            ours_runs.append(run(a.crun, n, [a.gloo_worker, "bench"], sizes))
            tcp_runs.append(run(a.crun, n, [a.gloo_worker, "bench"], sizes, tcp=True))
            for i, py in enumerate(anchors):
                theirs_runs[i].append(run(a.crun, n, ["--no-python", py,
                                                      os.path.join(HERE, "torch_allreduce.py")],
                                          sizes))
        ours = combine(ours_runs)
        tcp = combine(tcp_runs)
        if not ours.get("shared_memory") or tcp.get("shared_memory"):
            raise SystemExit("the SDK did not use the transport asked for")
        theirs = [combine(r) for r in theirs_runs]
        for k, nbytes in enumerate(sizes):
            def bw(res):
                alg = nbytes / res["results"][k]["seconds"] / 1e9
                return alg, alg * 2 * (n - 1) / n
            o_alg, o_bus = bw(ours)
            _, c_bus = bw(tcp)
            cells = [f"{n}", human(nbytes), ms(ours["results"][k]),
                     f"{o_alg:.2f}", f"{o_bus:.2f}", ms(tcp["results"][k]), f"{c_bus:.2f}"]
            for t in theirs:
                t_alg, t_bus = bw(t)
                cells += [ms(t["results"][k]), f"{t_bus:.2f}",
                          f"{o_bus / t_bus:.2f}x", f"{c_bus / t_bus:.2f}x"]
            rows.append("| " + " | ".join(cells) + " |")
            print(rows[-1], file=sys.stderr)
    head = ["ranks", "size", "crun ms", "crun algbw GB/s", "crun busbw GB/s", "crun tcp ms",
            "crun tcp busbw GB/s"]
    for t in theirs:
        head += [f"torch {t['torch']} ms", f"torch {t['torch']} busbw GB/s", "crun / torch",
                 "crun tcp / torch"]
    lines = [
        "## Allreduce: the worker SDK's Gloo backend against PyTorch's ProcessGroupGloo",
        "",
        "Command: `python3 tests/bench/allreduce_bench.py " + " ".join(sys.argv[1:])
        + "`. Both sides are launched by crun on this machine (2 cores). 'crun' is the SDK as "
        "users get it: ranks of one host reduce through shared memory. 'crun tcp' is the same "
        "program with CRUN_GLOO_SHM=0: Gloo's TCP pairs on loopback, PyTorch's transport. All "
        "reduce float32 with sum and use the "
        "same sizes, repetitions (enough for about 1 GiB, 3 to 50) and statistic: the median "
        "over repetitions of the slowest rank's time, and of that the median over "
        f"{a.rounds} rounds that alternate the sides (in brackets: the lowest and highest "
        "round). algbw = size / time; the ratios compare busbw; "
        "busbw = algbw x 2(n-1)/n (nccl-tests). " + a.measured_at,
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *rows,
    ]
    write_section(a.out, "allreduce-bench", lines)


if __name__ == "__main__":
    main()
