"""A test worker that records the signals it receives and who sent them (stdlib only).

  signal_probe.py OUT [--exit-on SIG] [--save-s S] [--fail-rank R --code C]

At start it appends {"event": "start", rank, pid, host} to OUT/signals.jsonl; then it waits for
signals (all catchable ones blocked, taken with sigwaitinfo) and appends one line per signal:
{"event": "signal", rank, sig, from_pid, from_comm, t}. On the first --exit-on signal (default
SIGTERM) it "checkpoints" for --save-s seconds, appends {"event": "saved"} and exits 0.
Rank --fail-rank instead exits with --code right after its start line.
"""
import argparse
import json
import os
import signal
import socket
import time

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--exit-on", default="SIGTERM")
ap.add_argument("--save-s", type=float, default=0.0)
ap.add_argument("--fail-rank", type=int, default=-1)
ap.add_argument("--code", type=int, default=1)
args = ap.parse_args()
exit_on = getattr(signal, args.exit_on)
rank = int(os.environ["RANK"])
caught = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
          signal.SIGUSR2, signal.SIGCONT}
signal.pthread_sigmask(signal.SIG_BLOCK, caught)


def record(event, **fields):
    line = json.dumps({"event": event, "rank": rank, "t": time.time(), **fields}) + "\n"
    fd = os.open(os.path.join(args.out, "signals.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, line.encode())  # one small O_APPEND write: lines never interleave
    os.close(fd)


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


record("start", pid=os.getpid(), host=socket.gethostname(), restart=os.environ.get(
    "TORCHELASTIC_RESTART_COUNT"))
if rank == args.fail_rank:
    raise SystemExit(args.code)
while True:
    info = signal.sigwaitinfo(caught)
    record("signal", sig=signal.Signals(info.si_signo).name, from_pid=info.si_pid,
           from_comm=comm(info.si_pid))
    if info.si_signo == exit_on:
        time.sleep(args.save_s)  # the checkpoint a real job would write
        record("saved")
        raise SystemExit(0)
