"""A stock PyTorch DDP program, as a user would run it under torchrun: gloo, env:// (the
launcher's MASTER_ADDR/MASTER_PORT store), DistributedSampler, a few epochs of SGD on a small
synthetic regression problem. Each rank saves its final parameters to OUT_DIR (if given) and
prints their SHA-256 (of every value's repr, exact), so a test can check they are identical on
every rank without importing torch itself (tests/pylib/crun_testing.py's ddp_digests).

    crun --standalone --nproc-per-node 2 ddp_train.py [OUT_DIR] [--nccl] [--die-once]

--nccl: NCCL on the GPU of LOCAL_RANK instead of gloo on the CPU (scripts/gpu-check.sh).
--die-once: in the first attempt (TORCHELASTIC_RESTART_COUNT 0), the last rank SIGKILLs itself
after the first epoch, so the launcher's restart is exercised.
"""
import gc
import hashlib
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    nccl = "--nccl" in sys.argv
    device = torch.device("cpu")
    if nccl:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if nccl else "gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x = torch.randn(512, 8)
    y = x @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.1 * torch.randn(512, 1)
    sampler = DistributedSampler(TensorDataset(x, y), num_replicas=world, rank=rank, shuffle=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, sampler=sampler)
    torch.manual_seed(1 + rank)  # different initial weights: DDP must broadcast rank 0's
    model = DistributedDataParallel(torch.nn.Linear(8, 1).to(device),
                                    device_ids=[device.index] if nccl else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(5):
        sampler.set_epoch(epoch)
        total = 0.0
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            opt.step()
            total += loss.item()
        if rank == 0:
            print(f"epoch {epoch}: loss {total / len(loader):.4f}", flush=True)
        if ("--die-once" in sys.argv and epoch == 0 and rank == world - 1
                and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"):
            print(f"rank {rank}: SIGKILL to myself (--die-once)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
    if args:
        torch.save(flat, os.path.join(args[0], f"params_{rank}.pt"))
    digest = hashlib.sha256(repr(flat.tolist()).encode()).hexdigest()
    print(f"rank {rank}/{world} (torch {torch.__version__}) done, params[:3] = "
          f"{flat[:3].tolist()}, params sha256 {digest}", flush=True)
    # DDP's reducer holds the process group: dropped first, the group's threads are joined in
    # destroy_process_group, not at interpreter exit (where PyTorch 2.15 sometimes aborts with
    # "terminate called without an active exception", seen under Slurm in CI).
    del model, opt, loader
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
