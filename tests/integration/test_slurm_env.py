"""crun inside a Slurm job step, with the step's SLURM_* variables as srun sets them but no
Slurm daemons. One crun per node: the node list is expanded by crun, node ranks follow Slurm's
order whatever order the nodes arrive in, the step's first node hosts the rendezvous, and the
run id is the step's. One crun per task (--slurm-direct): each task is one worker with the
torchrun environment of its Slurm task, task 0 hosting the store; a stock PyTorch DDP job runs
across the tasks. Two "nodes" on loopback (127.0.0.1 and 127.0.0.2). Bad Slurm input is an
error naming it, with nothing started. (The suite against real slurmctld/slurmd is issue 7's
next step.)"""
import json
import os
import socket
import subprocess
import sys
import unittest

CRUN = os.environ["CRUN_BIN"]
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "workers", "node_probe.py")
LIMIT_S = 60

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from crun_testing import free_port, kill_all, probe_events, scratch_dir, wait_for  # noqa: E402


TORCH_PYTHON = os.environ.get("TORCH_PYTHON", "/usr/bin/python3")
DDP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "workers", "ddp_train.py")


def step_env(node, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_"))}
    env.update(SLURM_JOB_ID="4242", SLURM_STEP_ID="7", SLURM_STEP_NODELIST="127.0.0.[1-2]",
               SLURM_STEP_NUM_NODES="2", SLURM_NODEID=str(node), SLURM_PROCID=str(node),
               SLURM_LOCALID="0", SLURM_STEP_NUM_TASKS="2", SLURM_STEP_TASKS_PER_NODE="1(x2)",
               NODE_TAG=f"n{node}")
    env.update(extra)
    return env


class OneCrunPerNode(unittest.TestCase):
    def setUp(self):
        self.dir = scratch_dir(self, "crun-slurm-env-")
        self.procs = []

    def tearDown(self):
        kill_all(self.procs)

    def node(self, node, *args, **env):
        p = subprocess.Popen([CRUN, *args, "--nproc-per-node", "2", WORKER, self.dir],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=step_env(node, **env))
        self.procs.append(p)
        return p

    def test_ranks_follow_slurm_node_order_and_the_first_node_hosts(self):
        port = free_port()
        # The second node starts first: the order must still be Slurm's, not arrival's.
        second = self.node(1, "--slurm-port", str(port))
        first = self.node(0, "--slurm-port", str(port))
        for p in (second, first):
            _, err = p.communicate(timeout=LIMIT_S)
            self.assertEqual(p.returncode, 0, err[-3000:])
        ev = probe_events(self.dir)
        self.assertEqual(sorted(int(e["RANK"]) for e in ev), [0, 1, 2, 3])
        for e in ev:
            self.assertEqual(e["WORLD_SIZE"], "4")
            self.assertEqual(e["GROUP_WORLD_SIZE"], "2")
            self.assertEqual(e["GROUP_RANK"], e["NODE_TAG"][1:])
            self.assertEqual(int(e["RANK"]) // 2, int(e["NODE_TAG"][1:]))
            self.assertEqual(e["MASTER_ADDR"], "127.0.0.1")  # the step's first node
            self.assertEqual(e["TORCHELASTIC_RUN_ID"], "slurm-4242.7")

    def test_slurm_is_the_default_inside_a_step_and_the_port_is_the_steps(self):
        # No --slurm and no --slurm-port: the step is recognised and its port derived
        # (10000 + (8 * 4242 + 7) mod 22000 = 21943). SLURM_STEP_ID picks a port free here.
        step_id = 7
        while True:
            want = 10000 + (8 * 4242 + step_id) % 22000
            try:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", want))
                break
            except OSError:
                step_id += 1
        first = self.node(0, SLURM_STEP_ID=str(step_id))
        second = self.node(1, SLURM_STEP_ID=str(step_id))
        for p in (first, second):
            _, err = p.communicate(timeout=LIMIT_S)
            self.assertEqual(p.returncode, 0, err[-3000:])
        ev = probe_events(self.dir)
        self.assertEqual(len(ev), 4)
        self.assertEqual({e["TORCHELASTIC_RUN_ID"] for e in ev}, {f"slurm-4242.{step_id}"})

    def bad(self, args, env, text):
        p = self.node(0, *args, **env)
        _, err = p.communicate(timeout=LIMIT_S)
        self.assertEqual(p.returncode, 2, err)
        self.assertIn(text, err)
        self.assertEqual(probe_events(self.dir), [])  # nothing started

    def test_bad_slurm_input_is_named(self):
        self.bad(["--slurm"], {"SLURM_STEP_NODELIST": "127.0.0.[1-2"},
                 "SLURM_STEP_NODELIST: hostlist '127.0.0.[1-2': '[' without ']'")
        self.bad(["--slurm"], {"SLURM_NODEID": "5"}, "SLURM_NODEID=5 is not below the 2 nodes")
        self.bad(["--slurm", "--nnodes", "2"], {}, "--slurm takes the nodes from the Slurm step")
        self.bad(["--slurm-port", "20000", "--standalone"], {}, "without a Slurm step")

    def test_slurm_outside_a_step_is_named(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        p = subprocess.run([CRUN, "--slurm", WORKER, self.dir], capture_output=True, text=True,
                           env=env, timeout=LIMIT_S)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("SLURM_JOB_ID is not set: not inside a Slurm job step", p.stderr)


def task_env(proc, **extra):
    """Task `proc` of `srun -N2 --ntasks-per-node=2` (block distribution)."""
    return step_env(proc // 2, SLURM_PROCID=str(proc), SLURM_LOCALID=str(proc % 2),
                    SLURM_STEP_NUM_TASKS="4", SLURM_STEP_TASKS_PER_NODE="2(x2)", **extra)


class OneCrunPerTask(unittest.TestCase):
    def setUp(self):
        self.dir = scratch_dir(self, "crun-slurm-direct-")
        self.port = free_port()
        self.procs = []

    def tearDown(self):
        kill_all(self.procs)

    def tasks(self, *program, extra_args=(), **env):
        for proc in (3, 1, 2, 0):  # task 0, the store's host, last
            self.procs.append(subprocess.Popen(
                [CRUN, "--slurm-direct", "--slurm-port", str(self.port), *extra_args, *program],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env=task_env(proc, **env)))
        results = {}
        for proc, p in zip((3, 1, 2, 0), self.procs):
            _, err = p.communicate(timeout=LIMIT_S)
            results[proc] = (p.returncode, err)
        return results

    def test_each_task_is_the_worker_slurm_placed(self):
        results = self.tasks(WORKER, self.dir)
        for proc, (code, err) in results.items():
            self.assertEqual(code, 0, f"task {proc}: {err[-3000:]}")
        ev = sorted(probe_events(self.dir), key=lambda e: int(e["RANK"]))
        self.assertEqual([e["RANK"] for e in ev], ["0", "1", "2", "3"])
        for e in ev:
            rank = int(e["RANK"])
            self.assertEqual(e["LOCAL_RANK"], str(rank % 2))
            self.assertEqual(e["LOCAL_WORLD_SIZE"], "2")
            self.assertEqual(e["GROUP_RANK"], str(rank // 2))
            self.assertEqual(e["GROUP_WORLD_SIZE"], "2")
            self.assertEqual(e["WORLD_SIZE"], "4")
            self.assertEqual(e["MASTER_ADDR"], "127.0.0.1")
            self.assertEqual(e["MASTER_PORT"], str(self.port))
            self.assertEqual(e["TORCHELASTIC_RUN_ID"], "slurm-4242.7")
            self.assertEqual(e["TORCHELASTIC_RESTART_COUNT"], "0")

    def test_stock_pytorch_ddp_across_the_tasks(self):
        results = self.tasks("--no-python", TORCH_PYTHON, DDP, self.dir)
        for proc, (code, err) in results.items():
            self.assertEqual(code, 0, f"task {proc}: {err[-3000:]}")
        # DDP kept every rank's model identical.
        check = subprocess.run(
            [TORCH_PYTHON, "-c",
             "import sys, torch\n"
             "p = [torch.load(f'{sys.argv[1]}/params_{r}.pt') for r in range(4)]\n"
             "assert all(torch.equal(p[0], q) for q in p[1:]), p\n", self.dir],
            capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(check.returncode, 0, check.stderr)

    def test_contracts_get_every_task_s_ports_through_task_0_s_store(self):
        """--contract with ports: each task's crun publishes its worker's port on the store
        task 0 hosts, and every worker gets the same cluster in rank order."""
        script = ('printf "%s\\n" "$TF_CONFIG" "$JAX_COORDINATOR_ADDRESS" '
                  '"$HOROVOD_LOCAL_RANK $HOROVOD_LOCAL_SIZE $HOROVOD_CROSS_RANK '
                  '$HOROVOD_CROSS_SIZE" "$HOROVOD_GLOO_RENDEZVOUS_PORT" > "$0/c_$RANK"')
        results = self.tasks("--contract", "tensorflow,jax,horovod", "--no-python", "sh", "-c",
                             script, self.dir)
        for proc, (code, err) in results.items():
            self.assertEqual(code, 0, f"task {proc}: {err[-3000:]}")
        got = []
        for rank in range(4):
            with open(os.path.join(self.dir, f"c_{rank}")) as f:
                tf, jax, hvd, hvd_port = f.read().splitlines()
            got.append((json.loads(tf), jax, hvd, hvd_port))
        cluster = got[0][0]["cluster"]["worker"]
        self.assertEqual(len(set(cluster)), 4, cluster)
        for rank, (tf, jax, hvd, hvd_port) in enumerate(got):
            self.assertEqual(tf, {"cluster": {"worker": cluster},
                                  "task": {"type": "worker", "index": rank}})
            self.assertEqual(jax, got[0][1])
            self.assertEqual(hvd, f"{rank % 2} 2 {rank // 2} 2")
            self.assertEqual(hvd_port, got[0][3])
        self.assertNotIn(jax.rsplit(":", 1)[1], [w.rsplit(":", 1)[1] for w in cluster])

    def test_a_failing_task_is_reported_with_its_rank_and_code(self):
        results = self.tasks(WORKER, self.dir, "--fail-rank", "2", "--code", "3")
        code, err = results[2]
        self.assertEqual(code, 3, err)
        self.assertIn("rank      : 2 (local rank 0", err)
        for proc in (0, 1, 3):
            self.assertEqual(results[proc][0], 0, results[proc][1][-2000:])

    def task(self, proc, *args):
        p = subprocess.Popen([CRUN, "--slurm-direct", "--slurm-port", str(self.port), *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=task_env(proc))
        self.procs.append(p)
        return p

    def test_task_0_keeps_the_store_up_until_every_task_is_done(self):
        # Task 0's worker is over before the other tasks even start; their workers still
        # reach the store, because task 0's crun waits for every task's crun to say it is done.
        first = self.task(0, WORKER, self.dir)
        wait_for(lambda: len(probe_events(self.dir)) == 1, "task 0's worker to run")
        others = [self.task(proc, WORKER, self.dir, "--connect-master") for proc in (1, 2, 3)]
        for p in [*others, first]:
            _, err = p.communicate(timeout=LIMIT_S)
            self.assertEqual(p.returncode, 0, err[-3000:])
        self.assertEqual(sorted(e["RANK"] for e in probe_events(self.dir)),
                         ["0", "1", "2", "3"])

    def test_task_0_stops_waiting_for_absent_tasks_after_the_grace_period(self):
        first = self.task(0, "--shutdown-timeout", "1", WORKER, self.dir)
        _, err = first.communicate(timeout=LIMIT_S)
        self.assertEqual(first.returncode, 0, err)
        self.assertIn("stopping the store: 1 of 4 crun processes said they were done within "
                      "1000 ms", err)

    def test_direct_mode_refuses_what_belongs_to_slurm(self):
        cases = [(["--nproc-per-node", "2"], "one worker per Slurm task"),
                 (["--max-restarts", "1"], "restarts belong to Slurm"),
                 (["--nnodes", "2"], "--slurm-direct takes the ranks from the Slurm task")]
        for args, text in cases:
            p = subprocess.run([CRUN, "--slurm-direct", *args, WORKER, self.dir],
                               capture_output=True, text=True, env=task_env(1), timeout=LIMIT_S)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(text, p.stderr)
        p = subprocess.run([CRUN, "--slurm-direct", WORKER, self.dir], capture_output=True,
                           text=True, env=task_env(0, SLURM_NODEID="1"), timeout=LIMIT_S)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("task 0 runs on 127.0.0.2, not on the step's first node 127.0.0.1",
                      p.stderr)
        self.assertEqual(probe_events(self.dir), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
