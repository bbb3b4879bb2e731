"""train's throughput against the equivalent PyTorch DDP program (tests/bench/ddp_cifar.py:
same model, per-worker batch, data files, augmentation, optimizer and loss; gloo), both
launched by crun on this machine, 1 and 2 CPU workers, in the same run. The figure is images
per second per worker inside the training loop (evaluation and start-up excluded), the
median over rounds that alternate the sides. Writes its section of docs/benchmarks.md
(between the train-bench markers).

Usage: train_bench.py --crun BIN --train BIN [--torch-python PY ...] [--images N]
                      [--epochs N] [--batch N] [--workers 1,2] [--rounds 3] [--out FILE]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from bench_support import measured_at, write_section  # noqa: E402


CRASHES = []  # runs that failed and were repeated, reported under the table


def launch(crun, n, program, tries=2):
    for attempt in range(tries):
        out = os.path.join(tempfile.mkdtemp(prefix="crun-train-bench-"), "metrics.json")
        r = subprocess.run([crun, "--standalone", "--nproc-per-node", str(n), *program(out)],
                           capture_output=True, text=True, timeout=3600)
        if r.returncode == 0:
            with open(out) as f:
                return json.load(f)
        last = r.stderr.strip().splitlines()
        CRASHES.append(f"{n} worker(s), `{' '.join(program(out)[:3])}`: "
                       f"{next((l.strip() for l in last if 'exit' in l and ':' in l), 'failed')}")
        print(f"run failed (attempt {attempt + 1}):\n{r.stderr[-3000:]}", file=sys.stderr)
    raise SystemExit(f"{program(out)} failed {tries} times")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--crun", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--torch-python", action="append", default=[])
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "..", "..", "docs", "benchmarks.md"))
    a = ap.parse_args()
    stamp = measured_at()  # before the run: the tree may change while it runs
    anchors = a.torch_python or ["/usr/bin/python3"]
    data = os.path.join(tempfile.mkdtemp(prefix="crun-train-bench-data-"), "cifar")
    # Writes the synthetic files once; both sides then read the same ones.
    subprocess.run([a.train, "--synthetic", str(a.images), "--data-dir", data, "--epochs", "1",
                    "--max-steps", "1"], check=True, capture_output=True)

    def ours(out):
        return [a.train, "--synthetic", str(a.images), "--data-dir", data, "--epochs",
                str(a.epochs), "--batch-size", str(a.batch), "--metrics-json", out]

    def theirs(py):
        return lambda out: ["--no-python", py, os.path.join(HERE, "ddp_cifar.py"), data,
                            str(a.epochs), str(a.batch), out]

    rows, versions = [], []
    for n in [int(w) for w in a.workers.split(",")]:
        mine, other = [], [[] for _ in anchors]
        for _ in range(a.rounds):
            mine.append(launch(a.crun, n, ours)["images_per_second_per_worker"])
            for i, py in enumerate(anchors):
                m = launch(a.crun, n, theirs(py))
                other[i].append(m["images_per_second_per_worker"])
                if len(versions) < len(anchors):
                    versions.append(m["torch"])
        cells = [str(n), str(a.batch), f"{statistics.median(mine):.0f}"]
        for o in other:
            cells += [f"{statistics.median(o):.0f}", f"{statistics.median(mine) / statistics.median(o):.2f}x"]
        rows.append("| " + " | ".join(cells) + " |")
        print(rows[-1], file=sys.stderr)
    head = ["workers", "batch per worker", "crun train img/s per worker"]
    for v in versions:
        head += [f"PyTorch {v} DDP img/s per worker", "crun / PyTorch"]
    lines = [
        "## train against PyTorch DDP on CPU (resnet-small, synthetic CIFAR-10)",
        "",
        "Command: `python3 tests/bench/train_bench.py " + " ".join(sys.argv[1:]) + "`. "
        f"{a.images} synthetic training images, {a.epochs} epoch(s) per run, both sides "
        "launched by crun on this machine (2 cores) and reading the same files; PyTorch runs "
        "tests/bench/ddp_cifar.py (the same model, batch, augmentation, SGD and loss under "
        "DistributedDataParallel over gloo). Images per second per worker inside the training "
        f"loop; the median over {a.rounds} rounds that alternate the sides. " + stamp,
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *rows,
    ]
    if CRASHES:
        lines += ["", "Runs that failed and were repeated: " + "; ".join(CRASHES) + "."]
    write_section(a.out, "train-bench", lines)


if __name__ == "__main__":
    main()
