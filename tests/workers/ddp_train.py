"""A stock PyTorch DDP program, as a user would run it under torchrun: gloo, env:// (the
launcher's MASTER_ADDR/MASTER_PORT store), DistributedSampler, a few epochs of SGD on a small
synthetic regression problem. Each rank saves its final parameters to OUT_DIR (if given) so a
test can check they are identical on every rank.

    crun --standalone --nproc-per-node 2 ddp_train.py [OUT_DIR]
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x = torch.randn(512, 8)
    y = x @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.1 * torch.randn(512, 1)
    sampler = DistributedSampler(TensorDataset(x, y), num_replicas=world, rank=rank, shuffle=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, sampler=sampler)
    torch.manual_seed(1 + rank)  # different initial weights: DDP must broadcast rank 0's
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(5):
        sampler.set_epoch(epoch)
        total = 0.0
        for xb, yb in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            opt.step()
            total += loss.item()
        if rank == 0:
            print(f"epoch {epoch}: loss {total / len(loader):.4f}", flush=True)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    if len(sys.argv) > 1:
        torch.save(flat, os.path.join(sys.argv[1], f"params_{rank}.pt"))
    print(f"rank {rank}/{world} (torch {torch.__version__}) done, params[:3] = "
          f"{flat[:3].tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
