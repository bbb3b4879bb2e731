"""The PyTorch DDP anchor for train's benchmark (tests/bench/train_bench.py): the same model
(train's resnet-small), per-worker batch, data files, augmentation (random crop of the
4-padded image, horizontal flip, normalisation), optimizer and loss, written the way a
PyTorch user would: DistributedDataParallel over gloo, DistributedSampler. Run under crun;
rank 0 writes the metrics JSON with the same keys as train's --metrics-json.

Usage: ddp_cifar.py DATA_DIR EPOCHS BATCH METRICS_JSON [--model resnet-small|resnet18]
                    [--device cpu|cuda] [--amp off|bf16|fp16] [--channels-last] [--ceiling]
(on a GPU: NCCL, batches copied from pinned memory, autocast as train does it)

--ceiling (GPU): the model's ceiling for train's GPU table. The same model, optimizer, loss,
autocast, memory format and batch in PyTorch eager (no torch.compile), one process, no DDP,
with every batch already on the GPU: the images are normalised there once and each epoch's
shuffled copy is made before its clock starts, so the loop only slices, trains and steps.

--device cuda on a host without a GPU (no /dev/nvidia0, ...: the rehearsal of
scripts/gpu-check.sh, tests/integration/test_gpu_check.py) fails at once, before importing
torch, which would cost over a second of CPU only to fail at the first CUDA call."""
import argparse
import glob
import json
import os
import sys
import time


def cuda_without_a_gpu(argv):
    """Whether the arguments ask for --device cuda on a host without a GPU."""
    cuda = any(a == "--device=cuda" or (a == "--device" and argv[i + 1:i + 2] == ["cuda"])
               for i, a in enumerate(argv))
    return cuda and not glob.glob("/dev/nvidia[0-9]*")


if __name__ == "__main__" and cuda_without_a_gpu(sys.argv[1:]):
    sys.exit("ddp_cifar.py: --device cuda: no GPU on this host (no /dev/nvidia[0-9]* device)")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data import DistributedSampler  # noqa: E402

MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
STD = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class ResNet(nn.Module):
    """train's CIFAR ResNets: resnet-small = widths (16, 32, 64) x 1 block, resnet18 = widths
    (64, 128, 256, 512) x 2 blocks."""

    def __init__(self, widths=(16, 32, 64), per_stage=1):
        super().__init__()
        self.stem = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(widths[0])
        blocks, cin = [], widths[0]
        for s, w in enumerate(widths):
            for b in range(per_stage):
                blocks.append(Block(cin, w, 2 if s > 0 and b == 0 else 1))
                cin = w
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, 10)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        x = self.blocks(x)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def load(data_dir):
    raw = np.concatenate([np.fromfile(os.path.join(data_dir, f"data_batch_{k}.bin"), np.uint8)
                          for k in range(1, 6)]).reshape(-1, 3073)
    return torch.from_numpy(raw[:, 1:].reshape(-1, 3, 32, 32).copy()), \
        torch.from_numpy(raw[:, 0].astype(np.int64))


def augment(images, gen):
    """Random crop of the 4-padded batch and horizontal flip, then normalisation."""
    n = images.shape[0]
    x = F.pad(images.float() / 255.0, (4, 4, 4, 4))
    dx = torch.randint(0, 9, (n,), generator=gen)
    dy = torch.randint(0, 9, (n,), generator=gen)
    ar = torch.arange(32)
    rows = (dy.view(n, 1, 1, 1) + ar.view(1, 1, 32, 1)).expand(n, 3, 32, 40)
    cols = (dx.view(n, 1, 1, 1) + ar.view(1, 1, 1, 32)).expand(n, 3, 32, 32)
    x = x.gather(2, rows).gather(3, cols)
    flip = torch.rand(n, generator=gen) < 0.5
    x[flip] = x[flip].flip(3)
    return (x - MEAN) / STD


def make_model(a, dev):
    model = ResNet() if a.model == "resnet-small" else ResNet((64, 128, 256, 512), 2)
    model = model.to(dev)
    if a.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def train_step(model, opt, scaler, amp, x, y):
    opt.zero_grad()
    with torch.autocast("cuda", dtype=amp, enabled=amp is not None):
        loss = F.cross_entropy(model(x).float(), y, label_smoothing=0.1)
    if scaler:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    else:
        loss.backward()
        opt.step()
    return loss


def optimizer_of(a, model):
    impl = {} if a.sgd == "default" else {"foreach": a.sgd == "foreach"}
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                          weight_decay=5e-4, **impl)
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.amp)
    scaler = None
    if a.amp == "fp16":
        scaler = (torch.amp.GradScaler("cuda") if hasattr(torch.amp, "GradScaler")
                  else torch.cuda.amp.GradScaler())
    return opt, amp, scaler


def ceiling(a):
    epochs, batch = int(a.epochs), int(a.batch)
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(dev)
    torch.manual_seed(0)
    images, labels = load(a.data_dir)
    images = ((images.to(dev).float() / 255.0) - MEAN.to(dev)) / STD.to(dev)
    labels = labels.to(dev)
    model = make_model(a, dev)
    opt, amp, scaler = optimizer_of(a, model)
    trained, seconds = 0, 0.0
    gen = torch.Generator(device=dev).manual_seed(0)
    for epoch in range(epochs):
        perm = torch.randperm(len(labels), device=dev, generator=gen)
        xs, ys = images[perm], labels[perm]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for b in range(len(labels) // batch):
            x, y = xs[b * batch:(b + 1) * batch], ys[b * batch:(b + 1) * batch]
            if a.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            loss = train_step(model, opt, scaler, amp, x, y)
            trained += batch
        torch.cuda.synchronize()
        seconds += time.perf_counter() - t0
        del xs, ys
    with open(a.metrics, "w") as f:
        json.dump({"world_size": 1, "torch": torch.__version__, "images_trained": trained,
                   "train_seconds": seconds, "images_per_second_per_worker": trained / seconds,
                   "final_train_loss": loss.item(), "mode": "ceiling", "sgd": a.sgd}, f)


def main():
    ap = argparse.ArgumentParser()
    for name in ("data_dir", "epochs", "batch", "metrics"):
        ap.add_argument(name)
    ap.add_argument("--model", default="resnet-small")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--amp", default="off")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--ceiling", action="store_true")
    ap.add_argument("--sgd", default="default", choices=("default", "foreach", "loop"),
                    help="SGD's implementation: PyTorch's default, or forced multi-tensor "
                         "(foreach) or per-parameter (loop), to measure what it costs")
    a = ap.parse_args()
    if a.ceiling:
        return ceiling(a)
    epochs, batch = int(a.epochs), int(a.batch)
    cuda = a.device == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    torch.manual_seed(0)
    images, labels = load(a.data_dir)
    model = DistributedDataParallel(make_model(a, dev),
                                    device_ids=[local_rank] if cuda else None)
    opt, amp, scaler = optimizer_of(a, model)
    sampler = DistributedSampler(range(len(labels)), num_replicas=world, rank=rank,
                                 shuffle=True, seed=0, drop_last=True)
    gen = torch.Generator().manual_seed(rank)
    trained, seconds = 0, 0.0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        idx = torch.tensor(list(sampler))
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for b in range(len(idx) // batch):
            sel = idx[b * batch:(b + 1) * batch]
            x, y = augment(images[sel], gen), labels[sel]
            if cuda:
                x = x.pin_memory().to(dev, non_blocking=True)
                y = y.pin_memory().to(dev, non_blocking=True)
            if a.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            loss = train_step(model, opt, scaler, amp, x, y)
            trained += len(sel)
        if cuda:
            torch.cuda.synchronize()
        seconds += time.perf_counter() - t0
    if rank == 0:
        with open(a.metrics, "w") as f:
            json.dump({"world_size": world, "torch": torch.__version__, "images_trained": trained,
                       "train_seconds": seconds,
                       "images_per_second_per_worker": trained / seconds,
                       "final_train_loss": loss.item()}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
