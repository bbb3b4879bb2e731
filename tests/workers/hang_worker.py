"""A stock PyTorch DDP job (gloo, env://) that hangs on purpose in its first attempt, for crun's
hang detection (tests/integration/test_hangs.py, docs/hangs.md). Each step prints a line, which
crun counts as progress; until the model is built (imports, the process group, DDP: seconds on
a loaded machine), a child prints one every 0.5 s, as docs/hangs.md advises for a slow start, so
that the hang timeouts need only cover the steps. It is gone before step 1: the hang itself is
as silent as ever.

    crun --hang-timeout S hang_worker.py MODE [STEPS]

MODE says what the last rank does in the first attempt (TORCHELASTIC_RESTART_COUNT 0) at step 3,
after its backward pass, while the others go on to average the loss with all_reduce:
  block  blocks in `stuck_in_load_batch`
  stop   stops itself with SIGSTOP (state T) from `stuck_in_load_batch`
  timer  blocks in `stuck_in_load_batch` inside torchelastic's expires(after=2) (the file timer
         crun serves when TORCHELASTIC_ENABLE_FILE_TIMER=1)
  none   nothing
The restarted attempt trains STEPS (default 5) steps and exits 0.

HANG_WORKER_HOLD=PATH in the environment: in the first attempt, the line every 0.5 s goes on
after the model is built, through the hang, until PATH exists (240 s at most), so that a test
can read the hang's stacks before crun's hang timeout starts to run.
"""
import os
import signal
import subprocess
import sys
import time

print(f"rank {os.environ['RANK']}: importing torch", flush=True)
HOLD = (os.environ.get("HANG_WORKER_HOLD", "")
        if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0" else "")
# A process, not a thread: `import torch` holds the GIL for seconds at a time. It ends when
# the model is built (held: when the file HOLD names exists), or with this worker, or after
# 60 s (held: 240 s): a start that hangs is still a hang.
LINES = 480 if HOLD else 120
STARTING = subprocess.Popen(
    ["sh", "-c", f"i=0; while kill -0 {os.getpid()} 2>/dev/null && [ $i -lt {LINES} ] && "
     '{ [ -z "$0" ] || [ ! -e "$0" ]; }; do '
     f"echo 'rank {os.environ['RANK']}: starting'; sleep 0.5; i=$((i+1)); done", HOLD])


def started():
    if HOLD:
        return  # its line goes on until the test creates HOLD
    if STARTING.poll() is None:
        STARTING.kill()
    STARTING.wait()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

HANG_STEP = 3


def stuck_in_load_batch(mode):
    print(f"rank {dist.get_rank()}: loading the next batch", flush=True)
    if mode == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(3600)


def average_loss(loss):
    t = loss.detach().clone()
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def main():
    mode = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    try:
        dist.init_process_group("gloo", init_method="env://")
        rank, world = dist.get_rank(), dist.get_world_size()
        hangs_here = attempt == 0 and rank == world - 1 and mode != "none"
        if mode == "timer" and hangs_here:
            from torch.distributed.elastic import timer
            timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
        torch.manual_seed(0)
        model = DistributedDataParallel(torch.nn.Linear(8, 1))
    finally:
        started()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(1, steps + 1):
        x = torch.randn(16, 8)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if hangs_here and step == HANG_STEP:
            if mode == "timer":
                from torch.distributed.elastic import timer
                with timer.expires(after=2):
                    stuck_in_load_batch(mode)
            else:
                stuck_in_load_batch(mode)
        avg = average_loss(loss)
        print(f"rank {rank} attempt {attempt} step {step}: loss {avg:.4f}", flush=True)
    dist.destroy_process_group()
    print(f"rank {rank} attempt {attempt} done", flush=True)
    # PyTorch 2.x's Gloo threads can still abort a finished program at interpreter exit
    # ("terminate called without an active exception", pytorch/pytorch#190489), which would
    # read as a failure of this test rather than of crun: its work is done, so leave now.
    os._exit(0)


if __name__ == "__main__":
    main()
