"""Stands where PyTorch's ProcessGroupNCCL stands for crun's flight-recorder trigger (which
needs NCCL, so a GPU, for the real thing): like its monitor thread, it makes the FIFO
<TORCH_NCCL_DEBUG_INFO_PIPE_FILE><rank>.pipe, holds it open for reading (non-blocking) and
looks at it every 0.3 s (PyTorch: about once a second); when anything has arrived it writes its
"trace" to <TORCH_NCCL_DEBUG_INFO_TEMP_FILE><rank>, in two parts 0.2 s apart. Every rank parks
in `parked_for_the_trigger`, silent, so that crun declares a hang.

    fr_listener.py OUT [--no-pipe-on-rank R]
"""
import os
import sys
import threading
import time

out = sys.argv[1]
rank = os.environ["RANK"]
skip = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--no-pipe-on-rank" else None


def listen(path):
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    while True:
        try:
            data = os.read(fd, 64)
        except BlockingIOError:
            data = b""
        if data:
            with open(os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] + rank, "w") as f:
                f.write(f"asked with {data.decode()!r}\n")
                f.flush()
                time.sleep(0.2)
                f.write("the rest of the trace\n")
            return
        time.sleep(0.3)


if rank != skip:
    pipe = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] + rank + ".pipe"
    os.mkfifo(pipe)
    threading.Thread(target=listen, args=(pipe,), daemon=True).start()
print(f"rank {rank} listening", flush=True)


def parked_for_the_trigger():
    time.sleep(3600)


parked_for_the_trigger()
