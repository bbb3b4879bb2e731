"""PyTorch's ProcessGroupNCCL timing, the anchor for the SDK's NCCL backend: the same sizes,
operations, repetitions and statistic as nccl_allreduce (float32; allreduce in place, sum;
allgather out of place; median over repetitions of the slowest rank's time for one call
followed by a wait for the GPU). Run under crun or torchrun; rank 0 writes OUT_JSON.

Usage: torch_nccl.py OUT_JSON SIZES_BYTES"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def repetitions(nbytes):
    return max(20, min(1000, (8 << 30) // max(nbytes, 1)))


def timed(op, reps, device):
    op()
    torch.cuda.synchronize(device)
    seconds = []
    for _ in range(reps):
        t0 = time.perf_counter()
        op()
        torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - t0)
    t = torch.tensor(seconds, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    ordered = sorted(t.tolist())
    return ordered[len(ordered) // 2]


def main():
    out, sizes = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    world = dist.get_world_size()
    largest = max(sizes)
    buf = torch.zeros(largest // 4, dtype=torch.float32, device=device)
    gathered = torch.empty_like(buf)
    results = []
    for nbytes in sizes:
        count = nbytes // 4
        per_rank = count // world
        x = buf[:count]
        reps = repetitions(nbytes)
        reduce = timed(lambda: dist.all_reduce(x), reps, device)
        gather = timed(lambda: dist.all_gather_into_tensor(gathered[:per_rank * world],
                                                           buf[:per_rank]), reps, device)
        results.append({"bytes": nbytes, "repetitions": reps, "allreduce_seconds": reduce,
                        "allgather_seconds": gather})
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"world": world, "torch": torch.__version__,
                       "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                       "device": torch.cuda.get_device_name(device), "results": results}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
