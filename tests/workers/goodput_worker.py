"""A stock PyTorch DDP job over Gloo that logs every step it completes, for the goodput ledger's
test and benchmark (tests/integration/test_goodput.py, tests/bench/goodput_bench.py).

    goodput_worker.py OUT_DIR STEPS STEP_S [FAULT...] [node=NAME] [faults=DIR] [snapshot]
                      [ft]

Each rank appends "<step> <unix time> <attempt>" to OUT_DIR/steps-<node>-<rank>.log after each
step, as a whole line, and tells crun the step (crun_worker.step). A step takes about STEP_S
seconds, every rank's ending together (a barrier). The state: a small model, its optimizer and
STATE_MIB (0) MiB of ballast a rank.
  - By default rank 0 writes a checkpoint with torch.save every CKPT_EVERY (5) steps (aside,
    then renamed) and every rank resumes from it.
  - `snapshot`: every rank saves its state into crun's node memory after every step
    (crun_worker.save) and resumes from it (crun_worker.load), instead.
  - `ft`: NVIDIA's ft_launcher watches the ranks' heartbeats: one after every step.
Collectives time out after 60 s (init_process_group's timeout), as a careful user sets.

Faults, each fired once (a marker file in OUT_DIR says it fired):
    crash@STEP:RANK    the rank raises an exception after that step
    kill@STEP:RANK     the rank SIGKILLs itself after that step
    hang@STEP:RANK     the rank stops before the next collective, for good
    mark@STEP:NAME     rank 0 creates OUT_DIR/NAME after that step (the harness's cue)
and, from a harness, files in faults=DIR: a file "<seq>" holding "<kind> <rank>" (kind: crash,
kill or hang) makes that rank act on it after its next step, once.
node=NAME names the node in the logs' names (else GOODPUT_NODE, else the host name), and in
the command line, where a harness finds a node's processes.
"""
import datetime
import os
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

try:
    import crun_worker  # crun puts it on the path; under another launcher the job runs without
except ImportError:
    crun_worker = None

out_dir, steps, step_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
words = sys.argv[4:]
faults = [f.split("@", 1) for f in words if "@" in f]
options = dict(w.split("=", 1) for w in words if "=" in w and "@" not in w)
flags = {w for w in words if "=" not in w and "@" not in w}
ckpt_every = int(os.environ.get("CKPT_EVERY", "5"))
state_mib = int(os.environ.get("STATE_MIB", "0"))
snapshot = "snapshot" in flags

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
node = options.get("node") or os.environ.get("GOODPUT_NODE", socket.gethostname())
torch.manual_seed(0)
model = torch.nn.Linear(16, 4)
model.register_buffer("ballast", torch.zeros(state_mib * 262144))  # float32: 4 bytes each
ddp = DistributedDataParallel(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)

monitor = None
if "ft" in flags:
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
    monitor = RankMonitorClient()
    monitor.init_workload_monitoring()

ckpt = os.path.join(out_dir, "ckpt.pt")
start = 0
if snapshot:
    got = crun_worker.load(into={"model": model.state_dict(), "opt": optimizer.state_dict()})
    if got is not None:
        model.load_state_dict(got[1]["model"])
        optimizer.load_state_dict(got[1]["opt"])
        start = got[0]
elif os.path.exists(ckpt):
    state = torch.load(ckpt)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["step"]

log = open(os.path.join(out_dir, f"steps-{node}-{rank}.log"), "a", buffering=1)
fault_dir = options.get("faults")


def once(marker):
    """Whether this process is the first to claim `marker` (a file in OUT_DIR)."""
    try:
        os.close(os.open(os.path.join(out_dir, marker), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def due(step):
    """The kind of fault this rank acts on after `step`, or None."""
    for kind, arg in faults:
        at, who = arg.split(":")
        if int(at) != step:
            continue
        if kind == "mark":
            if rank == 0 and once(who):
                pass
            continue
        if int(who) == rank and once(f"fired-{kind}-{at}"):
            return kind
    if fault_dir:
        for seq in sorted(os.listdir(fault_dir)):
            try:
                with open(os.path.join(fault_dir, seq)) as f:
                    kind, who = f.read().split()
            except (OSError, ValueError):
                continue  # being written: the next step reads it
            if int(who) == rank and once(f"fired-{seq}"):
                return kind
    return None


for step in range(start + 1, steps + 1):
    began = time.monotonic()
    x = torch.randn(8, 16)
    loss = ddp(x).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    left = step_s - (time.monotonic() - began)
    if left > 0:
        time.sleep(left)
    dist.barrier()  # every rank's step ends together, as a synchronous job's does
    log.write(f"{step} {time.time():.3f} {attempt}\n")
    if crun_worker is not None:
        crun_worker.step(step)
    if monitor is not None:
        monitor.send_heartbeat()
    if snapshot:
        crun_worker.save(step, {"model": model.state_dict(), "opt": optimizer.state_dict()})
    elif step % ckpt_every == 0 and rank == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "step": step}, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)
    kind = due(step)
    if kind == "crash":
        raise RuntimeError(f"injected crash after step {step}")
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        while True:
            time.sleep(3600)
if monitor is not None:
    monitor.shutdown_workload_monitoring()
dist.barrier()
dist.destroy_process_group()
