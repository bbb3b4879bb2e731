"""Short jobs under repetition: hundreds of two-node jobs whose workers exit at once, so that
each job's end races everything its start set going (the round's store with a client still
waiting in it, the search for the next node's snapshot copies, the service's sessions). Every
crun must exit 0, none may die of a signal, and nothing may be left running.

Found by it: a round's store stopped while a client still waited in it was freed before its
sessions' last handlers ran, and the service's crun died of a corrupted heap in about one job of
twenty (rendezvous/store_server/session.h). SHORT_JOBS scales the count."""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from crun_testing import free_port, kill_all, processes_mentioning  # noqa: E402

CRUN = os.environ["CRUN_BIN"]
JOBS = int(os.environ.get("SHORT_JOBS", "300"))
LIMIT_S = 60  # one job


class ShortJobs(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="crun-short-")
        self.procs = []

    def tearDown(self):
        kill_all(self.procs)
        shutil.rmtree(self.dir, ignore_errors=True)

    def run_jobs(self, commands):
        """Runs JOBS jobs, one after another; `commands(i, port)` gives a job's crun lines."""
        t0 = time.monotonic()
        for i in range(JOBS):
            port = free_port()
            procs = [subprocess.Popen([*cmd, "--no-python", "true"], stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
                     for cmd in commands(i, port)]
            self.procs = procs
            outs = [p.communicate(timeout=LIMIT_S)[1] for p in procs]
            for p, err in zip(procs, outs):
                self.assertEqual(p.returncode, 0, f"job {i}: {' '.join(p.args)}\n{err[-3000:]}")
        self.assertEqual(processes_mentioning(self.dir), [])
        took = time.monotonic() - t0
        print(f"{self.id().rsplit('.', 1)[-1]}: {JOBS} jobs in {took:.1f} s", file=sys.stderr)

    def test_two_agents_on_the_rendezvous_service(self):
        def commands(i, port):
            return [[CRUN, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint",
                     f"127.0.0.1:{port}", "--rdzv-id", f"short{i}", "--log-dir", self.dir,
                     "--rdzv-conf", f"is_host={int(n == 0)},node_id=n{n}"] for n in range(2)]
        self.run_jobs(commands)

    def test_two_static_nodes(self):
        def commands(i, port):
            return [[CRUN, "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(n),
                     "--master-addr", "127.0.0.1", "--master-port", str(port), "--log-dir",
                     self.dir] for n in (1, 0)]
        self.run_jobs(commands)


if __name__ == "__main__":
    unittest.main()
