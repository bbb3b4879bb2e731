"""A stock PyTorch worker: joins the gloo group named by the torchrun environment contract,
all-reduces its rank, and checks the sum. Used by scripts/demo.sh."""
import datetime
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
expected = world * (world + 1) / 2
print(f"rank {rank}/{world} (torch {torch.__version__}): all_reduce = {t.item():g}, "
      f"expected {expected:g}", flush=True)
dist.barrier()
dist.destroy_process_group()
raise SystemExit(0 if t.item() == expected else 1)
