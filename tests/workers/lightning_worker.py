"""A small LightningModule trained with Trainer(accelerator="cpu", devices=2, strategy="ddp"),
unchanged from what a Lightning user writes, run under a launcher. Each rank writes
OUT/lightning_<RANK>.json: how Lightning saw the cluster, its process ids, and a digest of the
final weights."""
import hashlib
import json
import os
import sys

import torch
import lightning as L
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main(out):
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    model = Regressor()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2,
                        enable_progress_bar=False, enable_checkpointing=False, logger=False,
                        enable_model_summary=False)
    trainer.fit(model, DataLoader(data, batch_size=32))
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    changed = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    report = {
        "pid": os.getpid(), "ppid": os.getppid(),
        "environment": type(trainer.strategy.cluster_environment).__name__,
        "global_rank": trainer.global_rank, "world_size": trainer.world_size,
        "weights": hashlib.sha256(weights.numpy().tobytes()).hexdigest(),
        "trained": changed, "steps": trainer.global_step,
    }
    with open(os.path.join(out, f"lightning_{os.environ['RANK']}.json"), "w") as f:
        json.dump(report, f)
    # As PyTorch asks of every program: without it, Gloo's threads may still hold tensors when
    # the interpreter is torn down, and PyTorch 2.x then aborts at exit ("terminate called
    # without an active exception", pytorch/pytorch#190489) after the work is done.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
