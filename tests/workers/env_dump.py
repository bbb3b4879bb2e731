"""Writes this worker's whole environment to OUT_DIR/env_<RANK>.json.

    env_dump.py OUT_DIR [--snapshot | --no-snapshot]

--snapshot: the node's snapshot store across a restart. In attempt 0 a load finds nothing,
every rank saves step 7 with its rank in a tensor, waits until every rank has saved (on the
job's store), and exits 3 (every rank: the static backend restarts each node on its own, and
a node whose workers succeeded would not come back); in attempt 1 every rank loads step 7 with
its own rank back and records it as CRUN_MATRIX_SNAPSHOT. --no-snapshot: the store must be absent (records
"off")."""
import json
import os
import sys

env = dict(os.environ)
if "--snapshot" in sys.argv[2:]:
    from datetime import timedelta

    import torch
    from torch.distributed import TCPStore

    import crun_worker
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    got = crun_worker.load(timeout=60)
    if env["TORCHELASTIC_RESTART_COUNT"] == "0":
        if got is not None:
            sys.exit(f"rank {rank}: a snapshot before any save: step {got[0]}")
        crun_worker.save(7, {"rank": torch.tensor([rank]), "note": f"rank {rank}"})
        store = TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                         timeout=timedelta(seconds=60))
        store.set(f"matrix/saved/{rank}", "1")
        store.wait([f"matrix/saved/{r}" for r in range(world)])
        sys.exit(3)
    if got is None or got[0] != 7 or int(got[1]["rank"][0]) != rank or \
            got[1]["note"] != f"rank {rank}":
        sys.exit(f"rank {rank}: loaded {got!r} after the restart, expected step 7 of this rank")
    env["CRUN_MATRIX_SNAPSHOT"] = str(got[0])
elif "--no-snapshot" in sys.argv[2:]:
    import crun_worker
    if crun_worker.available():
        sys.exit("the snapshot store is there with --snapshots off")
    env["CRUN_MATRIX_SNAPSHOT"] = "off"

with open(os.path.join(sys.argv[1], f"env_{os.environ['RANK']}.json"), "w") as f:
    json.dump(env, f)
