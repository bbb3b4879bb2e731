"""Hugging Face accelerate as its users write it: Accelerator(cpu=True), prepare(), backward(),
run under a launcher. Each rank writes OUT/accelerate_<RANK>.json: how accelerate saw the job
and a digest of the final weights."""
import gc
import hashlib
import json
import os
import sys

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main(out):
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=32, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    steps = 0
    for _ in range(2):
        for xb, yb in data:
            optimizer.zero_grad()
            accelerator.backward(torch.nn.functional.mse_loss(model(xb), yb))
            optimizer.step()
            steps += 1
    weights = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(model).parameters()])
    report = {
        "pid": os.getpid(), "ppid": os.getppid(),
        "distributed_type": str(accelerator.distributed_type),
        "process_index": accelerator.process_index, "num_processes": accelerator.num_processes,
        "weights": hashlib.sha256(weights.numpy().tobytes()).hexdigest(), "steps": steps,
    }
    with open(os.path.join(out, f"accelerate_{os.environ['RANK']}.json"), "w") as f:
        json.dump(report, f)
    # As PyTorch asks of every program, the process group is destroyed before the end; and
    # first everything that holds it (the DDP wrapper and its reducer, kept by accelerate too,
    # in reference cycles), or its C++ side outlives destroy_process_group() until the
    # interpreter is torn down, when PyTorch 2.x may abort ("terminate called without an
    # active exception", pytorch/pytorch#190489) after the work is done.
    model, optimizer, data = accelerator.free_memory(model, optimizer, data)
    gc.collect()
    accelerator.end_training()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()

if __name__ == "__main__":
    main(sys.argv[1])
