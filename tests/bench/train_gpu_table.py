"""train on a GPU against PyTorch: the table of docs/benchmarks.md's train-gpu section, from
the metrics `scripts/gpu-check.sh train OUT` leaves in OUT (train_<amp>.json from train,
torch_<amp>.json from tests/bench/ddp_cifar.py, one pair per autocast mode; `faults` also
leaves ceiling_<amp>.json, the model's ceiling from ddp_cifar.py --ceiling: columns of their
own).

Usage: train_gpu_table.py --dir OUT --device "NAME, DRIVER, MEMORY" [--out FILE]
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from bench_support import measured_at, write_section  # noqa: E402

MODES = ("fp32", "bf16", "fp16")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True, help="gpu-check.sh train's OUT")
    ap.add_argument("--device", required=True, help="nvidia-smi's name, driver and memory")
    ap.add_argument("--out", default=os.path.join(HERE, "..", "..", "docs", "benchmarks.md"))
    a = ap.parse_args()
    rows, torch_version, threads = [], "?", "?"
    extra = all(os.path.exists(os.path.join(a.dir, f"ceiling_{mode}.json")) for mode in MODES)
    for mode in MODES:
        paths = [os.path.join(a.dir, f"{side}_{mode}.json") for side in ("train", "torch")]
        missing = [p for p in paths if not os.path.exists(p)]
        if missing:
            raise SystemExit(f"train_gpu_table: {', '.join(missing)} missing: did "
                             f"`gpu-check.sh train` finish its {mode} runs?")
        ours, theirs = (json.load(open(p)) for p in paths)
        if not ours["parameters_identical"]:
            raise SystemExit(f"train_gpu_table: train's ranks ended with different parameters "
                             f"({paths[0]})")
        torch_version, threads = theirs["torch"], ours["threads"]
        ips, anchor = ours["images_per_second_per_worker"], theirs["images_per_second_per_worker"]
        row = (f"| {mode} | {'yes' if ours['channels_last'] else 'no'} | "
               f"{ours['batch_size']} | {ips:.0f} | {anchor:.0f} | {ips / anchor:.2f}x | ")
        if extra:
            ceil = json.load(open(os.path.join(a.dir, f"ceiling_{mode}.json")))
            cips = ceil["images_per_second_per_worker"]
            row += f"{cips:.0f} | {ips / cips:.2f}x | "
        rows.append(row + f"{ours['test_accuracy'][-1] * 100:.2f} % | {ours['skipped_steps']} |")
    # nvidia-smi's "NAME, DRIVER, MEMORY" as "NAME (driver DRIVER, MEMORY)".
    parts = [p.strip() for p in a.device.split(",")]
    device = f"{parts[0]} (driver {parts[1]}, {parts[2]})" if len(parts) == 3 else a.device
    lines = [
        "## train on a GPU: ResNet-18, synthetic CIFAR-10, against PyTorch",
        "",
        f"Device: {device}; train built against the libtorch inside PyTorch {torch_version}, "
        f"NCCL from its wheel, {threads} intra-op threads. Command: `scripts/gpu-check.sh "
        f"{'faults' if extra else 'train'} OUT`, then `tests/bench/train_gpu_table.py`: one worker under crun (so the SDK's NCCL "
        "group is in the loop), `--model resnet18 --synthetic 50000 --epochs 2 --batch-size "
        "256`; then the same model, data files, batch, optimizer, loss, autocast and memory "
        f"format in PyTorch {torch_version} (tests/bench/ddp_cifar.py under DDP/NCCL), also "
        "under crun, in the same run. Images/s: images trained / time in the training loop, "
        f"both epochs, evaluation excluded. {measured_at()}",
        "",
        "| autocast | channels-last | batch | train img/s | PyTorch img/s | train / PyTorch | "
        + ("ceiling img/s | train / ceiling | " if extra else "")
        + "train's test accuracy | skipped fp16 steps |",
        "|---|---|---|---|---|---|" + ("---|---|" if extra else "") + "---|---|",
        *rows,
        "",
        "The synthetic set is easy for ResNet-18 (100 % test accuracy after one epoch): the rows "
        "measure speed. Each row is one run of each side, not a median."
        + (" The ceiling is the same model, optimizer, loss, autocast, memory format and batch "
           "in PyTorch eager without torch.compile, one process, every batch already on the GPU "
           "(tests/bench/ddp_cifar.py --ceiling)." if extra else ""),
    ]
    write_section(a.out, "train-gpu", lines)


if __name__ == "__main__":
    main()
