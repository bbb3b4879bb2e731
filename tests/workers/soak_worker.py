"""A worker of the restart soak (tests/integration/test_restart_soak.py) in Python, with the
children real training jobs have. Same environment and events.log lines as soak_worker.sh.
Kinds:
  multiprocessing  two multiprocessing.Process children (fork), each with a child of its own
  dataloader       stock PyTorch's DataLoader(num_workers=2), iterated until the stop
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from crun_testing import proc_files, whole_lines  # noqa: E402

A = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
R = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
EV = os.path.join(os.environ["SOAK_OUT"], "events.log")
KIND = os.environ["SOAK_KIND"]


def say(line):
    """One whole line in one write (O_APPEND): readers never see half of it."""
    fd = os.open(EV, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def overlaps():
    """Processes of an earlier attempt of this node that are still there."""
    tag = f"SOAK_TAG={os.environ['SOAK_TAG']}".encode()
    node = f"SOAK_NODE={os.environ['SOAK_NODE']}".encode()
    found = []
    for pid, environ in proc_files("environ"):
        env = environ.split(b"\0")
        if tag not in env or node not in env:
            continue
        for e in env:
            if e.startswith(b"TORCHELASTIC_RESTART_COUNT=") and int(e.split(b"=")[1]) < A:
                found.append(pid)
    return found


def all_started():
    deadline = time.monotonic() + 60
    while True:
        n = sum(1 for line in whole_lines(EV) if line.startswith(f"start {A} "))
        if n >= WORLD:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


def grandchild_sleeper():
    import multiprocessing
    multiprocessing.Process(target=time.sleep, args=(600,)).start()
    time.sleep(600)


def main():
    if os.environ["LOCAL_RANK"] == "0":
        for p in overlaps():
            say(f"overlap {A} {R} {p}")
    keep = []
    if KIND == "multiprocessing":
        import multiprocessing
        ctx = multiprocessing.get_context("fork")
        for _ in range(2):
            c = ctx.Process(target=grandchild_sleeper)
            c.start()
            keep.append(c)
        batches = None
    else:
        import torch
        from torch.utils.data import DataLoader, IterableDataset

        class Endless(IterableDataset):
            def __iter__(self):
                i = 0
                while True:
                    yield torch.tensor([i])
                    i += 1
        batches = iter(DataLoader(Endless(), batch_size=4, num_workers=2))
        next(batches)  # both workers are up
    # Its children are all there before it says it started: a stop from here on meets them.
    say(f"start {A} {R} {os.getpid()}")
    if not all_started():
        say(f"timeout {A} {R}")
        sys.exit(3)
    if A >= int(os.environ["SOAK_LAST"]):
        say(f"done {A} {R}")
        os._exit(0)  # leaving the children to crun, as a job that ends without joining them
    if R == A % WORLD:
        say(f"fail {A} {R}")
        os._exit(7)  # as a crash: no clean-up of the children
    while True:  # until the stop signal
        if batches is not None:
            next(batches)
        time.sleep(0.01)


if __name__ == "__main__":
    main()
