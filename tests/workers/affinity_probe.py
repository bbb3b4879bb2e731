"""Writes OUT/affinity_<LOCAL_RANK>.json: the CPUs and memory nodes this worker may use, as the
kernel sees them (Cpus_allowed_list from /proc, the memory policy from get_mempolicy(2)).
Stdlib only; x86-64 Linux. tests/workers/cuda_worker.py imports mempolicy() and status()."""
import ctypes
import json
import os
import sys

SYS_get_mempolicy = 239  # x86-64


def mempolicy():
    """(mode, nodes) of this thread's memory policy: MPOL_DEFAULT 0, PREFERRED 1, BIND 2, ..."""
    libc = ctypes.CDLL(None, use_errno=True)
    mode = ctypes.c_int()
    mask = (ctypes.c_ulong * 16)()
    if libc.syscall(SYS_get_mempolicy, ctypes.byref(mode), mask, 16 * 64, None, 0) != 0:
        raise OSError(ctypes.get_errno(), "get_mempolicy")
    return mode.value, [i for i in range(16 * 64) if mask[i // 64] >> (i % 64) & 1]


def status():
    with open("/proc/self/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


if __name__ == "__main__":
    mode, nodes = mempolicy()
    with open(os.path.join(sys.argv[1], f"affinity_{os.environ['LOCAL_RANK']}.json"), "w") as f:
        json.dump({"cpus": status()["Cpus_allowed_list"], "policy": mode, "nodes": nodes}, f)
