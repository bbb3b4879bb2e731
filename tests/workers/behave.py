"""A configurable test worker (stdlib only). Records its environment, then behaves as told:

  behave.py OUT_DIR [--fail-rank R] [--fail-attempt A] [--code C] [--mode MODE]

  exit          exit (with --code when this is the failing rank and attempt, else 0)
  wait          write a ready file, then sleep until a signal; a SIGTERM is recorded
  ignore-term   like wait, but ignore SIGTERM (to be SIGKILLed after the grace period)
  grandchild    start a child that sleeps in the same process group, record both pids, wait
  chatty        write --lines numbered lines to stdout and stderr, then exit like `exit`
"""
import argparse
import json
import os
import signal
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--fail-rank", type=int, default=-1)
ap.add_argument("--fail-attempt", type=int, default=-1)
ap.add_argument("--code", type=int, default=1)
ap.add_argument("--mode", default="exit")
ap.add_argument("--lines", type=int, default=3)
args = ap.parse_args()

rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
tag = f"{rank}_{attempt}"


def write(name, data):
    tmp = os.path.join(args.out, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.rename(tmp, os.path.join(args.out, name))  # readers never see half a file


write(f"env_{tag}.json", dict(os.environ))
if args.mode == "chatty":
    pad = "x" * 200  # long lines: a torn write would show
    for i in range(args.lines):
        sys.stdout.write(f"out rank={rank} line={i} {pad}\n")
        sys.stderr.write(f"err rank={rank} line={i} {pad}\n")
    sys.stdout.flush()
    sys.stderr.flush()
if args.mode in ("exit", "chatty"):
    failing = rank == args.fail_rank and args.fail_attempt in (-1, attempt)
    sys.exit(args.code if failing else 0)

if args.mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    def on_signal(signo, _frame):
        write(f"signal_{tag}.json", {"signal": signo})
        sys.exit(128 + signo)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(s, on_signal)

pids = {"worker": os.getpid()}
if args.mode == "grandchild":
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL of the group ends it
        while True:
            time.sleep(3600)
    pids["grandchild"] = child
write(f"ready_{tag}.json", pids)
while True:
    time.sleep(3600)
