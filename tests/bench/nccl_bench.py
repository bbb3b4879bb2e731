"""GPU collectives: the worker SDK's NCCL backend against PyTorch's ProcessGroupNCCL, same
machine, same run, same launcher. float32; allreduce (in place, sum) and allgather (out of
place), 4 KiB to 1 GiB. Each figure is the median over repetitions of the slowest rank's time
for one call and the wait for its completion. Writes its section of docs/benchmarks.md
(between the nccl-bench markers).

crun itself needs Boost and gRPC, which GPU machines often lack; the SDK does not. So the
launcher is crun where it is built (--crun BIN) and otherwise stock torchrun (--torchrun PY):
the SDK reads torchrun's environment and talks to torchrun's store like to crun's.

Usage: nccl_bench.py --bench BIN (--crun BIN | --torchrun PY) [--torch-python PY]
                     [--nproc N] [--sizes 4096,...] [--out FILE]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from bench_support import human, measured_at, write_section  # noqa: E402

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30]


def launch(a, native, argv):
    """The launcher's command line for a native program or a Python script (`argv`)."""
    if a.crun:
        head = [a.crun, "--standalone", "--nproc-per-node", str(a.nproc)]
        return head + (argv if native else ["--no-python", a.torch_python, *argv])
    head = [a.torchrun, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(a.nproc)]
    return head + (["--no-python", *argv] if native else argv)


def run(a, native, argv, sizes):
    tmp = tempfile.mkdtemp(prefix="crun-nccl-")
    try:
        out = os.path.join(tmp, "bench.json")
        cmd = launch(a, native, [*argv, out, ",".join(map(str, sizes))])
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
        with open(out) as f:
            return json.load(f)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="the nccl_allreduce binary")
    ap.add_argument("--crun")
    ap.add_argument("--torchrun", help="a Python whose torch runs torch.distributed.run")
    ap.add_argument("--torch-python", help="Python for the PyTorch side (default: --torchrun's)")
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--out", default=os.path.join(HERE, "..", "..", "docs", "benchmarks.md"))
    ap.add_argument("--json-dir", help="also keep both sides' raw results here")
    a = ap.parse_args()
    if bool(a.crun) == bool(a.torchrun):
        ap.error("give exactly one of --crun BIN and --torchrun PY")
    a.torch_python = a.torch_python or a.torchrun or sys.executable
    sizes = [int(s) for s in a.sizes.split(",")]
    a.measured_at = measured_at()

    ours = run(a, True, [a.bench], sizes)
    theirs = run(a, False, [os.path.join(HERE, "torch_nccl.py")], sizes)
    if a.json_dir:
        for name, res in (("crun", ours), ("torch", theirs)):
            with open(os.path.join(a.json_dir, f"nccl_{name}.json"), "w") as f:
                json.dump(res, f, indent=1)
    n = ours["world"]
    rows = []
    for o, t in zip(ours["results"], theirs["results"]):
        b = o["bytes"]
        cells = [str(n), human(b)]
        for key in ("allreduce_seconds", "allgather_seconds"):
            # One rank, in place: NCCL moves no data, so there is no bandwidth to report.
            moved = n > 1 or key == "allgather_seconds"
            cells += [f"{o[key] * 1e6:.1f}", f"{t[key] * 1e6:.1f}",
                      f"{b / o[key] / 1e9:.1f}" if moved else "-",
                      f"{b / t[key] / 1e9:.1f}" if moved else "-",
                      f"{t[key] / o[key]:.2f}x"]
        rows.append("| " + " | ".join(cells) + " |")
        print(rows[-1], file=sys.stderr)
    head = ["ranks", "size",
            "allreduce crun us", "torch us", "crun algbw GB/s", "torch algbw GB/s", "crun speed",
            "allgather crun us", "torch us", "crun algbw GB/s", "torch algbw GB/s", "crun speed"]
    launcher = "crun" if a.crun else "torchrun"
    lines = [
        "## GPU collectives: the worker SDK's NCCL backend against PyTorch's ProcessGroupNCCL",
        "",
        f"Device: {ours['device']}. crun's SDK with NCCL {ours['nccl']}; PyTorch "
        f"{theirs['torch']} with its NCCL {theirs['nccl']}. Both launched by {launcher}, "
        f"{n} rank(s). Command: `python3 tests/bench/nccl_bench.py --bench "
        f"<build>/tests/nccl_allreduce {'--crun <crun>' if a.crun else '--torchrun python3'}` "
        "(scripts/gpu-check.sh runs it). float32; allreduce in place (sum), allgather out of "
        "place; the median over repetitions (20 to 1000, about 8 GiB per size) of the slowest "
        "rank's time for one call plus the wait for the GPU to finish it. algbw = size / time; "
        "'crun speed' = torch time / crun time. " + a.measured_at,
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *rows,
    ]
    if n == 1:
        lines += ["", "With one rank there is no interconnect (busbw = algbw x 2(n-1)/n is 0). "
                  "An in-place allreduce of one rank moves no data, so its columns are each "
                  "side's cost per call: queueing it and waiting for the GPU to finish (crun's "
                  "SDK from C++, PyTorch from Python). The out-of-place allgather is a "
                  "device-to-device copy, so its algbw is the copy bandwidth each side reaches "
                  "(bytes read and written are twice that)."]
    write_section(a.out, "nccl-bench", lines)


if __name__ == "__main__":
    main()
