"""Short jobs under repetition: hundreds of two-node jobs whose workers exit at once, so that
each job's end races everything its start set going (the round's store with a client still
waiting in it, the search for the next node's snapshot copies, the service's sessions). Every
crun must exit 0, none may die of a signal, and nothing may be left running.

Found by it: a round's store stopped while a client still waited in it was freed before its
sessions' last handlers ran, and the service's crun died of a corrupted heap in about one job of
twenty (rendezvous/store_server/session.h). SHORT_JOBS scales the count, SHORT_JOBS_LANES how
many run at once (3)."""
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from crun_testing import free_port, kill_all, processes_mentioning  # noqa: E402

CRUN = os.environ["CRUN_BIN"]
JOBS = int(os.environ.get("SHORT_JOBS", "300"))
LANES = max(1, int(os.environ.get("SHORT_JOBS_LANES", "3")))
LIMIT_S = 60  # one job


class ShortJobs(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="crun-short-")
        self.procs = []

    def tearDown(self):
        kill_all(self.procs)
        shutil.rmtree(self.dir, ignore_errors=True)

    def logs(self, i):
        """Job i's log directory: jobs that run at once write apart."""
        return os.path.join(self.dir, f"job{i}")

    def run_jobs(self, commands):
        """Runs JOBS jobs, LANES at a time (each lane one job after another, on ports of its
        own); `commands(i, port)` gives a job's crun lines. Jobs that overlap also race each
        other's starts and ends on one machine, as a busy cluster's do."""
        t0 = time.monotonic()
        failures = []
        lock = threading.Lock()

        def lane(first):
            try:
                for i in range(first, JOBS, LANES):
                    if failures:
                        return
                    run_job(i)
            except BaseException as e:  # noqa: BLE001 (any end of a lane is a failure)
                failures.append(f"lane {first}: {type(e).__name__}: {e}")

        def run_job(i):
            port = free_port()  # never one it gave before: no two lanes share a port
            procs = []
            try:
                for cmd in commands(i, port):
                    p = subprocess.Popen([*cmd, "--no-python", "true"],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, text=True, errors="replace",
                                         env=dict(os.environ, OMP_NUM_THREADS="1"))
                    procs.append(p)
                    with lock:
                        self.procs.append(p)
                deadline = time.monotonic() + LIMIT_S
                outs = []
                for p in procs:
                    try:
                        outs.append(p.communicate(timeout=max(0.1, deadline -
                                                              time.monotonic()))[1])
                    except subprocess.TimeoutExpired:
                        failures.append(f"job {i}: not done in {LIMIT_S} s: {' '.join(p.args)}")
                        return
            finally:
                kill_all(procs)
            for p, err in zip(procs, outs):
                if p.returncode != 0:
                    failures.append(f"job {i}: exit {p.returncode}: {' '.join(p.args)}\n"
                                    f"{err[-3000:]}")

        lanes = [threading.Thread(target=lane, args=(k,)) for k in range(LANES)]
        for t in lanes:
            t.start()
        for t in lanes:
            t.join(timeout=LIMIT_S * JOBS)
        self.assertFalse(any(t.is_alive() for t in lanes), "a lane never ended")
        self.assertEqual(failures, [])
        self.assertEqual(processes_mentioning(self.dir), [])
        took = time.monotonic() - t0
        print(f"{self.id().rsplit('.', 1)[-1]}: {JOBS} jobs, {LANES} at a time, in {took:.1f} s",
              file=sys.stderr)

    def test_two_agents_on_the_rendezvous_service(self):
        def commands(i, port):
            return [[CRUN, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint",
                     f"127.0.0.1:{port}", "--rdzv-id", f"short{i}", "--log-dir", self.logs(i),
                     "--rdzv-conf", f"is_host={int(n == 0)},node_id=n{n}"] for n in range(2)]
        self.run_jobs(commands)

    def test_two_static_nodes(self):
        def commands(i, port):
            return [[CRUN, "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(n),
                     "--master-addr", "127.0.0.1", "--master-port", str(port), "--log-dir",
                     self.logs(i)] for n in (1, 0)]
        self.run_jobs(commands)


if __name__ == "__main__":
    unittest.main()
