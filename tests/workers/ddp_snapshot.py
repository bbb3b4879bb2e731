"""A stock PyTorch DDP job that saves its whole training state into crun's node memory at
every step with the crun_worker module, and resumes from it (tests/integration/test_snapshots.py).

    ddp_snapshot.py OUT_DIR STEPS [HOLD_AT]

With HOLD_AT, rank 1 of the first attempt stops after saving that step and waits to be killed
(the test SIGKILLs it), so that the kill lands at the same place however loaded the machine is.

The state: the model's and Adam's state_dicts, PyTorch's RNG (dropout), the data stream's
generator (its position) and Python's RNG. DDP_LOAD_INTO=1 loads with load(into=...). Each rank writes OUT_DIR/final-RANK.json with a hash
of its parameters and the step it started from."""
import gc
import hashlib
import json
import os
import random
import sys
import threading

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import crun_worker

out_dir, steps = sys.argv[1], int(sys.argv[2])
hold_at = int(sys.argv[3]) if len(sys.argv) > 3 else None
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
random.seed(rank)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Dropout(0.2), torch.nn.ReLU(),
                            torch.nn.Linear(64, 4))
ddp = DistributedDataParallel(model)
optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-2)
data = torch.Generator().manual_seed(1234 + rank)

start = 0
# DDP_LOAD_INTO=1: the model's tensors are filled in place (load(into=...)), not copied twice.
into = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
got = crun_worker.load(into=into if os.environ.get("DDP_LOAD_INTO") == "1" else None)
if got is not None:
    start, state = got
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    data.set_state(state["data"])
    random.setstate(state["python_rng"])
    in_place = state["model"]["0.weight"].data_ptr() == model[0].weight.data_ptr()
    print(f"rank {rank} resumed at step {start} (in place: {in_place})", flush=True)

for step in range(start + 1, steps + 1):
    x = torch.randn(16, 32, generator=data)
    y = torch.randint(0, 4, (16,), generator=data)
    noise = random.random()
    loss = torch.nn.functional.cross_entropy(ddp(x) * (1 + noise * 1e-3), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    crun_worker.save(step, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "rng": torch.get_rng_state(), "data": data.get_state(),
                            "python_rng": random.getstate()})
    crun_worker.heartbeat()
    print(f"rank {rank} step {step}", flush=True)
    if step == hold_at and rank == 1 and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
        print(f"rank {rank} holds at step {step}", flush=True)
        threading.Event().wait()  # until the test's SIGKILL

digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
with open(os.path.join(out_dir, f"final-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "hash": digest.hexdigest(), "start": start}, f)
# PyTorch 2.15's gloo group aborted at the end of this worker ("terminate called without an
# active exception", pytorch/pytorch#190489) once in CI-like runs: every rank is done with
# every collective first, and DDP's reducer, which holds the group, goes before the group.
dist.barrier()
del ddp, optimizer
gc.collect()
dist.destroy_process_group()
