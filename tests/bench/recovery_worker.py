"""The worker of the recovery benchmark (tests/bench/recovery_bench.py): stock PyTorch DDP over
gloo on the CPU, written the way a user writes one, that stamps when it reaches each stage.

Each process appends JSON lines {"stage", "t" (ns since the epoch), "rank", "attempt"} to a
file of its own, OUT/r<rank>.a<attempt>.<pid>.jsonl, one whole line per write:
  exec      its first statement (the interpreter has started; nothing is imported yet)
  imported  torch, torch.distributed and torch.nn.parallel imported
  group     init_process_group returned
  built     the model and optimizer built, before any checkpoint is loaded
  step      a step done (with "step": its index); the first one includes building DDP
  loaded    a checkpoint loaded (with --ckpt-mb; "step": the step it holds)
  crash     just before it exits 7 (rank --crash-rank, attempt 0, at step --crash-step)

With --snapshot (and --ckpt-mb), every rank saves its whole state (the model with its bulk,
the optimizer) into crun's node memory after every step with crun_worker.save, and loads it
with crun_worker.load at its start (docs/checkpoints.md), instead of the checkpoint file.

Each attempt's process group meets on its own prefix of the job's store
(TORCHELASTIC_RESTART_COUNT): with torchrun 2.x, a restarted group that met on the bare store
failed to connect (gloo's connectFullMesh refused or reset) in most runs.

With --round-prefix (tests/bench/node_lost_bench.py), the process group meets instead on
the prefix round_<n>, n the times a process of this global rank has joined the store: a node
that replaces a lost one starts its workers at attempt 0 while the survivors are at attempt 1,
yet every rank of a round has joined once more than in the round before.

Usage: recovery_worker.py OUT [--steps N] [--crash-step K] [--crash-rank R]
                              [--ckpt-mb MB (--ckpt-every N --ckpt-dir DIR | --snapshot)]
                              [--hold SOCKET] [--round-prefix] [--stop-file PATH]
"""
import time

T_EXEC = time.time_ns()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

RANK = int(os.environ["RANK"])
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def stamp(out, stage, t=None, **extra):
    line = json.dumps({"stage": stage, "t": t or time.time_ns(), "rank": RANK,
                       "attempt": ATTEMPT, **extra}) + "\n"
    path = os.path.join(out, f"r{RANK}.a{ATTEMPT}.{os.getpid()}.jsonl")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--crash-step", type=int, default=-1)
    ap.add_argument("--crash-rank", type=int, default=1)
    ap.add_argument("--ckpt-mb", type=int, default=0)
    ap.add_argument("--ckpt-every", type=int, default=2)
    ap.add_argument("--ckpt-dir", default="")
    ap.add_argument("--snapshot", action="store_true")
    ap.add_argument("--hold", default="", help="a Unix socket: after the last step, connect "
                    "and wait for one byte (the benchmark reads memory meanwhile)")
    ap.add_argument("--round-prefix", action="store_true")
    ap.add_argument("--stop-file", default="", help="every rank stops before the first step at "
                    "which this file exists on any rank (agreed with an all-reduce)")
    args = ap.parse_args()
    stamp(args.out, "exec", T_EXEC)

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel
    stamp(args.out, "imported")

    from datetime import timedelta
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         is_master=False, timeout=timedelta(seconds=60))
    prefix = f"attempt_{ATTEMPT}"
    if args.round_prefix:
        prefix = f"round_{base.add(f'joins/{RANK}', 1)}"
    store = dist.PrefixStore(prefix, base)
    dist.init_process_group("gloo", store=store, rank=RANK,
                            world_size=int(os.environ["WORLD_SIZE"]))
    stamp(args.out, "group")

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    # The checkpoint's bulk: a buffer of --ckpt-mb MiB that is saved and loaded with the model.
    model.register_buffer("bulk", torch.zeros(args.ckpt_mb * (1 << 20) // 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    path = os.path.join(args.ckpt_dir, "ckpt.pt") if args.ckpt_mb and not args.snapshot else ""
    stamp(args.out, "built")
    if args.snapshot:
        import crun_worker
        # Straight into the model's own tensors (no second copy of the bulk).
        got = crun_worker.load(into={"model": model.state_dict(), "opt": opt.state_dict()})
        if got is not None:
            model.load_state_dict(got[1]["model"])
            opt.load_state_dict(got[1]["opt"])
            start = got[0] + 1
            stamp(args.out, "loaded", step=got[0])
    if path and os.path.exists(path):
        state = torch.load(path, map_location="cpu")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
        stamp(args.out, "loaded", step=state["step"])
    # Resumed, every rank holds the same state (one file, or the step every rank agreed on):
    # DDP need not broadcast rank 0's (where this PyTorch can be told so). Both ways in alike.
    import inspect
    quiet = start > 0 and "init_sync" in inspect.signature(DistributedDataParallel).parameters
    ddp = DistributedDataParallel(model, **({"init_sync": False} if quiet else {}))
    gen = torch.Generator().manual_seed(RANK)
    for step in range(start, args.steps):
        if args.stop_file:
            stop = torch.tensor([1.0 if os.path.exists(args.stop_file) else 0.0])
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if stop.item() > 0:
                break
        if ATTEMPT == 0 and RANK == args.crash_rank and step == args.crash_step:
            stamp(args.out, "crash", step=step)
            os._exit(7)
        x = torch.randn(32, 64, generator=gen)
        y = torch.randint(0, 10, (32,), generator=gen)
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        stamp(args.out, "step", step=step)
        if args.snapshot:
            crun_worker.save(step, {"model": model.state_dict(), "opt": opt.state_dict()})
        if path and RANK == 0 and step % args.ckpt_every == args.ckpt_every - 1:
            # Written aside and renamed, as a careful user does: a crash never leaves half a file.
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                       path + ".tmp")
            os.replace(path + ".tmp", path)
        if path:
            dist.barrier()  # every rank resumes from the same step
    if args.hold:
        import socket
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(120)
            sock.connect(args.hold)
            sock.recv(1)
    # Every rank is done with every collective before any tears its group down: PyTorch
    # 2.15's gloo group aborted ("terminate called without an active exception") in 1 of 6
    # runs when one rank destroyed it while the other was still finishing the last step.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
