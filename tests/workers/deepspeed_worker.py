"""A DeepSpeed worker for crun's --contract deepspeed (tests/integration/test_contracts.py):
takes --local_rank as DeepSpeed's launcher passes it (crun: `--local_rank=${local_rank}`),
joins through deepspeed.init_distributed() from torchrun's variables, all-reduces rank + 1
over gloo and writes what it saw, including its environment, to OUT_DIR.

  crun --contract deepspeed ... deepspeed_worker.py --local_rank=${local_rank} OUT_DIR
       [--die-once]
"""
import argparse
import json
import os
import signal
import sys

import deepspeed
import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, required=True)
    ap.add_argument("out")
    ap.add_argument("--die-once", action="store_true")
    a = ap.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))  # not under deepspeed
    if a.die_once and attempt == 0 and rank == world - 1:
        print(f"rank {rank}: SIGKILL to myself (--die-once)", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    ok = t.item() == world * (world + 1) / 2 and a.local_rank == int(os.environ["LOCAL_RANK"])
    with open(os.path.join(a.out, f"ds_{rank}_{attempt}.json"), "w") as f:
        json.dump({"rank": rank, "world": world, "local_rank_arg": a.local_rank, "sum": t.item(),
                   "ok": ok, "deepspeed": deepspeed.__version__, "env": dict(os.environ)}, f)
    print(f"rank {rank}/{world}: all_reduce {t.item()} ({'ok' if ok else 'WRONG'})", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
