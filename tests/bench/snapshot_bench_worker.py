"""The worker of the snapshot benchmark (tests/bench/snapshot_bench.py): each rank holds a
state of --mib MiB (float32 tensors of 4 MiB, as a model's parameters and optimizer state
are) and times, round after round and in alternating order, the three ways to keep it:
crun_worker.save into crun's node memory, torch.save to a file on /dev/shm, and torch.save to
a file on local disk with fsync. Then one crun_worker.load. Writes OUT/rank<R>.json.

With --hold SOCKET it saves once (or not at all with --no-save) and waits on the socket while
the benchmark reads the node's memory.

Usage: snapshot_bench_worker.py OUT [--mib 200] [--rounds 5] [--disk DIR] [--hold SOCKET]
                                    [--no-save]
"""
import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist

import crun_worker


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--mib", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--disk", default="/var/tmp")
    ap.add_argument("--hold", default="")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    state = {"model": {f"layer{i}.weight": torch.randn(1 << 20) for i in range(args.mib // 4)},
             "step": 0}
    if args.hold:
        if not args.no_save:
            crun_worker.save(1, state)
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(120)
            s.connect(args.hold)
            s.recv(1)
        dist.barrier()
        return
    shm = f"/dev/shm/crun-snapshot-bench-{os.getpid()}.pt"
    disk = os.path.join(args.disk, f"crun-snapshot-bench-{os.getpid()}.pt")

    last = [0]

    def crun_save(step):
        crun_worker.save(step, state)
        last[0] = step

    def torch_shm(step):
        torch.save(state, shm)

    def torch_disk(step):
        with open(disk, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())

    ways = [("crun_worker.save", crun_save), ("torch.save /dev/shm", torch_shm),
            ("torch.save disk", torch_disk)]
    crun_save(0)  # crun sizes the memory on the first save of each buffer
    crun_save(1)
    times = {name: [] for name, _ in ways}
    step = 2
    try:
        for r in range(args.rounds):
            for name, way in (ways if r % 2 == 0 else ways[::-1]):
                dist.barrier()  # every rank saves at once, as in training
                t = time.perf_counter()
                way(step)
                times[name].append((time.perf_counter() - t) * 1000)
                step += 1
        dist.barrier()
        t = time.perf_counter()
        got = crun_worker.load()
        load_ms = (time.perf_counter() - t) * 1000
        if got is None or got[0] != last[0]:
            raise SystemExit(f"loaded {got and got[0]}, expected step {last[0]}")
    finally:
        for path in (shm, disk):
            if os.path.exists(path):
                os.remove(path)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "times": times, "load_ms": load_ms}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
