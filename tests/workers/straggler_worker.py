"""A training loop's shape for the slow-rank tests (docs/health.md, "Slow ranks"): each step
computes (sleeps) then sends its step record, as crun_worker.step does.

  STRAGGLER_MODE   explicit: crun_worker.step(n, compute_seconds=...) after a timed sleep
                   ddp: a Gloo DDP model with crun_worker.allreduce_hook, the sleep before
                   backward (torch needed)
  STRAGGLER_SLOW   the ranks that compute longer, comma-separated ("" for none)
  STRAGGLER_SLOW_LOCAL  the same by LOCAL_RANK, for one node's environment: whoever runs
                   those ranks on another node (a spare) is not slow ("" for none)
  STRAGGLER_FROM   the step from which the slow ranks are slow (0)
  STRAGGLER_ATTEMPTS  the attempts (TORCHELASTIC_RESTART_COUNT), comma-separated, in which the
                   slow ranks are slow ("" for every one)
  STRAGGLER_STEPS  steps to run (120)
  STRAGGLER_LATER_STEPS  steps to run in a later run of the rank (STRAGGLER_STEPS): an attempt
                   after the first (TORCHELASTIC_RESTART_COUNT above 0), or one that starts
                   once the file STRAGGLER_LATER_IF exists (a test creates it when the first
                   round is over: a round re-formed around a spare need not be a restart).
                   Read once, at the rank's start: a rank already running keeps its count.
  STRAGGLER_STOP_IF  a file: once it exists, an explicit-mode rank ends after its current step
                   as if its steps were done ("": run every step). DDP ranks ignore it (they
                   must agree on their steps)
  STRAGGLER_MS     a step's compute, ms (20); the slow rank's is 2.5 times it
  STRAGGLER_LOG    a file each rank appends "RANK NODE_TAG RESTART_COUNT" to when done ("")
  STRAGGLER_JITTER every rank's compute times a random factor in [1 - J, 1 + J] (0)
  STRAGGLER_SPIKES the share of steps that take 5 times as long on one rank (a garbage
                   collection, a checkpoint's copy): 0.01 is one step in a hundred (0)
"""
import os
import random
import time

import crun_worker

rank = int(os.environ["RANK"])
slow = {int(r) for r in os.environ.get("STRAGGLER_SLOW", "").split(",") if r}
if str(os.environ["LOCAL_RANK"]) in os.environ.get("STRAGGLER_SLOW_LOCAL", "").split(","):
    slow.add(rank)
attempts = [a for a in os.environ.get("STRAGGLER_ATTEMPTS", "").split(",") if a]
if attempts and os.environ["TORCHELASTIC_RESTART_COUNT"] not in attempts:
    slow = set()
steps = int(os.environ.get("STRAGGLER_STEPS", "120"))
later_if = os.environ.get("STRAGGLER_LATER_IF", "")
if os.environ["TORCHELASTIC_RESTART_COUNT"] != "0" or (later_if and os.path.exists(later_if)):
    steps = int(os.environ.get("STRAGGLER_LATER_STEPS", str(steps)))
stop_if = os.environ.get("STRAGGLER_STOP_IF", "")
base = float(os.environ.get("STRAGGLER_MS", "20")) / 1000
jitter = float(os.environ.get("STRAGGLER_JITTER", "0"))
spikes = float(os.environ.get("STRAGGLER_SPIKES", "0"))
slow_from = int(os.environ.get("STRAGGLER_FROM", "0"))
rng = random.Random(rank)


def compute_seconds(step):
    t = base * (2.5 if rank in slow and step >= slow_from else 1)
    if spikes and rng.random() < spikes:
        t *= 5
    return t * rng.uniform(1 - jitter, 1 + jitter)


if os.environ.get("STRAGGLER_MODE", "explicit") == "ddp":
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(64, 64))
    model.register_comm_hook(None, crun_worker.allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 64)
    for step in range(steps):
        loss = model(x).sum()
        time.sleep(compute_seconds(step))  # the forward's cost, before backward hands over buckets
        loss.backward()
        opt.step()
        opt.zero_grad()
        crun_worker.step(step)
    # Teardown in order: every rank past its last collective, then DDP's reducer (which holds
    # the group and its last work) gone, then the group. Left to the interpreter's exit, Gloo's
    # threads were once torn down under a live reducer: std::terminate, SIGABRT (2.x, loaded).
    dist.barrier()
    del opt, model
    dist.destroy_process_group()
else:
    for step in range(steps):
        t = time.monotonic()
        time.sleep(compute_seconds(step))
        crun_worker.step(step, compute_seconds=time.monotonic() - t)
        if stop_if and os.path.exists(stop_if):
            break

if os.environ.get("STRAGGLER_LOG"):
    with open(os.environ["STRAGGLER_LOG"], "a") as f:
        f.write(f"{rank} {os.environ.get('NODE_TAG', '')} "
                f"{os.environ['TORCHELASTIC_RESTART_COUNT']}\n")
