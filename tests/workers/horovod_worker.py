"""A Horovod worker for crun's --contract horovod (tests/integration/test_contracts.py):
hvd.init() through crun's HTTP rendezvous (Gloo controller), an allreduce of rank + 1, and a
broadcast of rank 0's parameters; writes what it saw to OUT_DIR.

  crun --contract horovod ... horovod_worker.py OUT_DIR [--die-once]

--die-once: on the first attempt the last rank SIGKILLs itself after hvd.init().
"""
import json
import os
import signal
import sys

import horovod.torch as hvd
import torch


def main():
    out = next(a for a in sys.argv[1:] if not a.startswith("--"))
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))  # not under horovodrun
    with open(os.path.join(out, f"hvd_port_{rank}_{attempt}"), "w") as f:
        f.write(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"])
    if "--die-once" in sys.argv and attempt == 0 and rank == size - 1:
        print(f"rank {rank}: SIGKILL to myself (--die-once)", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    total = hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum).item()
    torch.manual_seed(1 + rank)  # different on every rank until the broadcast
    model = torch.nn.Linear(4, 2)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = hvd.allgather(flat.unsqueeze(0))
    same = bool((gathered == gathered[0]).all())
    ok = total == size * (size + 1) / 2 and same
    with open(os.path.join(out, f"hvd_{rank}_{attempt}.json"), "w") as f:
        json.dump({"rank": rank, "size": size, "local_rank": hvd.local_rank(),
                   "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(),
                   "cross_size": hvd.cross_size(), "sum": total, "same_parameters": same,
                   "ok": ok, "env": {k: v for k, v in os.environ.items()
                                     if k.startswith("HOROVOD_")},
                   "torchrun": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}},
                  f)
    print(f"rank {rank}/{size}: allreduce {total}, parameters identical: {same}", flush=True)
    hvd.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
