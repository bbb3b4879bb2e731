"""A JAX worker for crun's --contract jax (tests/integration/test_contracts.py): joins the job
through jax.distributed with crun's coordinator and torchrun's RANK and WORLD_SIZE, all-reduces
(psum) each process's rank + 1 over gloo on the CPU, checks the sum, and writes it.

  crun --contract jax ... jax_psum.py OUT_DIR [--die-once]

--die-once: on the first attempt the last rank SIGKILLs itself after the first all-reduce, so
the group restarts; the second attempt must finish.
"""
import json
import os
import signal
import sys

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils


def main():
    out = next(a for a in sys.argv[1:] if not a.startswith("--"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # The one line a script adds under crun: JAX reads the coordinator from
    # JAX_COORDINATOR_ADDRESS, but has no variables for the process count and id.
    jax.distributed.initialize(num_processes=world, process_id=rank)
    assert jax.process_count() == world and jax.process_index() == rank
    want = world * (world + 1) // 2
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    sums = []
    for step in range(3):
        x = jnp.array([rank + 1.0])
        total = multihost_utils.process_allgather(x).sum()
        sums.append(float(total))
        if "--die-once" in sys.argv and attempt == 0 and rank == world - 1 and step == 0:
            print(f"rank {rank}: SIGKILL to myself (--die-once)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    # psum across processes: one device each, mapped over the global device mesh.
    mesh_sum = jax.pmap(lambda v: jax.lax.psum(v, "p"), axis_name="p")
    local = jnp.array([[rank + 1.0]] * jax.local_device_count())
    psum = float(multihost_utils.process_allgather(mesh_sum(local))[0][0][0])
    ok = all(s == want for s in sums) and psum == want * jax.local_device_count()
    with open(os.path.join(out, f"jax_{rank}_{attempt}.json"), "w") as f:
        json.dump({"rank": rank, "world": world, "sums": sums, "psum": psum, "ok": ok,
                   "coordinator": os.environ["JAX_COORDINATOR_ADDRESS"],
                   "devices": jax.device_count(), "jax": jax.__version__}, f)
    print(f"rank {rank}/{world}: allgather sums {sums}, psum {psum} ({'ok' if ok else 'WRONG'})",
          flush=True)
    jax.distributed.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
