"""Issue 33's second reproduction: a stock PyTorch DDP program (gloo) whose DataLoader has two
worker processes, as almost every real training job has. In the first attempt, rank 1 exits 7
at step 5, leaving rank 0 and both ranks' DataLoader workers to the launcher's restart; the
restarted group trains 10 steps and exits 0."""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1))
    loader = DataLoader(data, batch_size=16, num_workers=2,
                        sampler=DistributedSampler(data, num_replicas=world, rank=rank))
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(loader):
        if attempt == 0 and rank == 1 and step == 5:
            sys.stdout.flush()
            os._exit(7)  # a crash: nothing is cleaned up
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if step == 10:
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
