"""A worker that reports what its process is, for the warm-start tests (test_warm.py): run cold
and warm, the two reports must match but for what names one process (pids, descriptor
numbers) and for what the template imported.

  warm_probe.py OUT_DIR [--then exit:N | raise | interrupt | signal:N | wait-for:SOCKET]
                        [--fail-attempt A] [--compute]

It writes OUT_DIR/report_<rank>_<attempt>.json first, then does what --then says on attempt
--fail-attempt (default: every attempt) and exits 0 otherwise.
"""
import time

T0 = time.time_ns()

import argparse  # noqa: E402
import ctypes  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

WARM = "torch" in sys.modules  # a cold worker has imported nothing of torch's yet


def c_environ():
    """The C-level environment (what getenv and a child's exec see), not os.environ."""
    libc = ctypes.CDLL(None)
    environ = ctypes.POINTER(ctypes.c_char_p).in_dll(libc, "environ")
    out = {}
    i = 0
    while environ[i]:
        key, _, value = environ[i].decode().partition("=")
        out[key] = value
        i += 1
    return out


def proc_environ():
    """What /proc/PID/environ shows others (ps e, a tool that finds a job's processes by a
    variable): the environment the process started with, for a warm worker the one crun gave
    it."""
    with open("/proc/self/environ", "rb") as f:
        entries = [e.decode() for e in f.read().split(b"\0") if e]
    return dict(e.partition("=")[::2] for e in entries)


def rlimits():
    """Every resource limit: a warm worker's are crun's, as a cold worker's are."""
    return {name: list(resource.getrlimit(getattr(resource, name)))
            for name in dir(resource) if name.startswith("RLIMIT_")}


def status_field(name):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split()[1]
    return ""


def handlers():
    out = {}
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGHUP,
              signal.SIGUSR1, signal.SIGCHLD):
        h = signal.getsignal(s)
        out[s.name] = h if isinstance(h, int) else getattr(h, "__name__", repr(h))
    return out


def compute_threads():
    """The threads a worker computes with: torch's intra-op count, and the threads running
    once numpy's BLAS and torch have each multiplied two matrices (their pools started)."""
    import numpy
    import torch
    a = numpy.ones((256, 256))
    a @ a
    torch.ones(256, 256) @ torch.ones(256, 256)
    return {"torch": torch.get_num_threads(), "running": len(os.listdir("/proc/self/task"))}


def report(out, compute=False):
    fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    r = {
        "argv": sys.argv,
        "orig_argv": sys.orig_argv[1:],
        "env": dict(os.environ),
        "c_env": c_environ(),
        "proc_env": proc_environ(),
        "cwd": os.getcwd(),
        "path0": sys.path[0],
        "path": sys.path[1:],
        "name": __name__,
        "file": globals().get("__file__"),
        "spec": getattr(globals().get("__spec__"), "name", None),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "own_group": os.getpgid(0) == os.getpid(),
        "sid": os.getsid(0),
        "handlers": handlers(),
        "blocked": status_field("SigBlk"),
        "ignored": status_field("SigIgn"),
        "threads": len(os.listdir("/proc/self/task")),
        "rlimits": rlimits(),
        "cgroup": open("/proc/self/cgroup").read().strip(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "stdin": os.path.realpath("/proc/self/fd/0"),
        "stdout_write_through": sys.stdout.write_through,
        "fd_count": len(fds),
        "warm": WARM,
        "started_ns": T0,
    }
    if compute:
        r["compute"] = compute_threads()
    rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
    path = os.path.join(out, f"report_{rank}_{attempt}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(r, f)
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--then", default="exit:0")
    ap.add_argument("--fail-attempt", type=int, default=-1)
    ap.add_argument("--compute", action="store_true", help="report the compute threads too")
    args = ap.parse_args()
    report(args.out, args.compute)
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if args.fail_attempt not in (-1, attempt):
        return 0
    what, _, value = args.then.partition(":")
    if what == "exit":
        return int(value)
    if what == "raise":
        raise ValueError(f"intentional failure on rank {os.environ['RANK']}")
    if what == "interrupt":
        raise KeyboardInterrupt
    if what == "signal":
        os.kill(os.getpid(), int(value))
    if what == "wait-for":  # the test's word on a Unix socket, then a failure (exit 5)
        import socket
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(60)
            s.connect(value)
            s.recv(1)
        return 5
    return 0


if __name__ == "__main__":
    sys.exit(main())
