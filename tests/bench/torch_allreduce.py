"""PyTorch's ProcessGroupGloo allreduce timing, the anchor for the worker SDK's Gloo backend:
the same sizes, repetitions and statistic as `gloo_worker bench` (median over repetitions of
the slowest rank's time). Run under crun; rank 0 writes OUT_DIR/bench.json."""
import json
import sys
import time

import torch
import torch.distributed as dist


def repetitions(nbytes):
    return max(3, min(50, (1 << 30) // max(nbytes, 1)))


def main():
    out, sizes = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
    dist.init_process_group("gloo")
    results = []
    for nbytes in sizes:
        x = torch.ones(nbytes // 4, dtype=torch.float32)
        dist.all_reduce(x)
        seconds = []
        for _ in range(repetitions(nbytes)):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            seconds.append(time.perf_counter() - t0)
        t = torch.tensor(seconds, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        ordered = sorted(t.tolist())
        results.append({"bytes": nbytes, "seconds": ordered[len(ordered) // 2],
                        "repetitions": len(ordered)})
    if dist.get_rank() == 0:
        with open(f"{out}/bench.json", "w") as f:
            json.dump({"world": dist.get_world_size(), "torch": torch.__version__,
                       "results": results}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
