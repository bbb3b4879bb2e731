"""A stock PyTorch worker for the replication test (tests/integration/test_snapshots.py).

    replica_worker.py OUT

Loads its rank's snapshot with crun_worker (each rank's own: sharded), checks every value of it
against its rank and step, and records OUT/loaded-<rank>-<pid> = the step (or 0).
Then saves a step at a time, the ranks in step through a Gloo all-reduce, recording
OUT/saved-<rank>, until OUT/stop exists.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

import crun_worker

N = 1 << 16


def state(rank, step):
    return {"w": torch.full((N,), float(rank * 100000 + step)), "rank": rank, "step": step}


def record(path, value):
    with open(path + ".tmp", "w") as f:
        f.write(f"{value}\n")
    os.rename(path + ".tmp", path)


def main():
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    got = crun_worker.load()
    start = 1
    if got is not None:
        step, s = got
        want = state(rank, step)
        if s["rank"] != rank or s["step"] != step or not torch.equal(s["w"], want["w"]):
            record(os.path.join(out, f"error-{rank}"), f"rank {rank} loaded a wrong state")
            sys.exit(3)
        start = step + 1
    record(os.path.join(out, f"loaded-{rank}-{os.getpid()}"), start - 1)
    step = start
    while True:
        stop = torch.tensor([1.0 if os.path.exists(os.path.join(out, "stop")) else 0.0])
        dist.all_reduce(stop)  # every rank stops at the same step
        if stop.item() > 0:
            break
        crun_worker.save(step, state(rank, step))
        record(os.path.join(out, f"saved-{rank}"), step)
        step += 1
        time.sleep(0.01)
    dist.barrier()
    dist.destroy_process_group()  # torch aborts at exit when a Gloo group is left open


if __name__ == "__main__":
    main()
