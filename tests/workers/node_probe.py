"""A multi-node test worker (stdlib only). Appends one JSON line per start to OUT/events.jsonl
(pid, start time, host name, host's node id, ranks, world, store, restart count), then behaves
as told:

  node_probe.py OUT [--fail-rank R] [--fail-restart A] [--code C]
                    [--exit-when-world N] [--until FILE] [--connect-master]
                    [--fail-when-all-started]

  default              exit 0 (or --code when this is the failing rank and restart)
  --exit-when-world N  exit 0 if WORLD_SIZE == N, else wait for a signal
  --until FILE         wait until OUT/FILE exists, then exit as by default; meanwhile a
                       heartbeat every 0.1 s on CRUN_HEARTBEAT_FD when crun gives one (its
                       --hang-timeout counts it as progress)
  --connect-master     first open a TCP connection to MASTER_ADDR:MASTER_PORT (retrying for
                       up to 60 s while it is refused, as PyTorch's store client does) and
                       record the local address it came from ("connected_from")
  --fail-when-all-started  the failing rank fails only once every rank of its restart has
                       recorded its start
"""
import argparse
import json
import os
import signal
import socket
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--fail-rank", type=int, default=-1)
ap.add_argument("--fail-restart", type=int, default=-1)
ap.add_argument("--code", type=int, default=1)
ap.add_argument("--exit-when-world", type=int, default=0)
ap.add_argument("--until", default="")
ap.add_argument("--connect-master", action="store_true")
ap.add_argument("--fail-when-all-started", action="store_true")
args = ap.parse_args()

env = os.environ
event = {k: env.get(k) for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE",
                                 "GROUP_WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                 "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
                                 "TORCHELASTIC_RUN_ID", "NODE_TAG")}
event["pid"] = os.getpid()
event["host"] = socket.gethostname()
if args.connect_master:
    deadline = time.monotonic() + 60
    while True:
        try:
            c = socket.create_connection((env["MASTER_ADDR"], int(env["MASTER_PORT"])), timeout=30)
            break
        except ConnectionRefusedError:  # the store's host may not be listening yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with c:
        event["connected_from"] = c.getsockname()[0]
event["t"] = time.time()  # wall clock: one kernel, so comparable across namespaces
line = (json.dumps(event) + "\n").encode()
fd = os.open(os.path.join(args.out, "events.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
os.write(fd, line)  # one small O_APPEND write: lines of different workers never interleave
os.close(fd)

rank = int(env["RANK"])
restart = int(env["TORCHELASTIC_RESTART_COUNT"])
if args.exit_when_world and int(env["WORLD_SIZE"]) != args.exit_when_world:
    signal.pause()  # SIGTERM (default action) ends it
    sys.exit(1)
if args.until:
    beat = int(env["CRUN_HEARTBEAT_FD"]) if "CRUN_HEARTBEAT_FD" in env else None
    last_beat = 0.0
    while not os.path.exists(os.path.join(args.out, args.until)):
        if beat is not None and time.monotonic() - last_beat >= 0.1:
            os.write(beat, b".")
            last_beat = time.monotonic()
        time.sleep(0.01)
if rank == args.fail_rank and args.fail_restart in (-1, restart):
    if args.fail_when_all_started:
        def started():
            with open(os.path.join(args.out, "events.jsonl")) as f:
                return sum(json.loads(x)["TORCHELASTIC_RESTART_COUNT"] == str(restart)
                           for x in f if x.strip())
        while started() < int(env["WORLD_SIZE"]):
            time.sleep(0.01)
    sys.stderr.write(f"node_probe: rank {rank} fails on purpose with {args.code}\n")
    sys.exit(args.code)
sys.exit(0)
