"""Slow ranks (docs/health.md, "Slow ranks") with real crun processes on one node: a rank that
computes 2.5 times longer than the others is named, by its rank and host, in the window the
detector decides (never a duration asserted), and no other rank is; ranks with jitter are never
named; --straggler-action off reads no records. With torch, the same through a Gloo DDP model
and crun_worker.allreduce_hook, the recommended producer.

Across nodes and the actions beyond warn: not built yet (issue 49)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from crun_testing import kill_all  # noqa: E402

CRUN = os.environ["CRUN_BIN"]
WORKER = os.path.join(HERE, "..", "workers", "straggler_worker.py")
PYTHON = os.environ.get("PYTHON_EXEC", sys.executable)
TORCH_PYTHON = next((p for p in os.environ.get("TORCH_PYTHONS", "").split(",")
                     if p and subprocess.run([p, "-c", "import torch"],
                                             capture_output=True).returncode == 0), None)
LIMIT_S = 120
NAMED = re.compile(r"slow rank on (\S+) \(local rank (\d+)\): rank (\d+): ([\d.]+)x the others' "
                   r"median compute time per step \(steps (\d+)-(\d+)\)")


class OneNode(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="crun-stragglers-")
        self.procs = []

    def tearDown(self):
        kill_all(self.procs)
        shutil.rmtree(self.dir, ignore_errors=True)

    def crun(self, nproc, env, args=(), python=PYTHON):
        e = dict(os.environ, PYTHON_EXEC=python, **env)
        p = subprocess.Popen([CRUN, "--standalone", "--nproc-per-node", str(nproc), *args,
                              WORKER], env=e, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        _, err = p.communicate(timeout=LIMIT_S)
        self.assertEqual(p.returncode, 0, err)
        return err

    def assert_named_once(self, err, rank):
        named = NAMED.findall(err)
        self.assertEqual(len(named), 1, err)
        host, local, global_rank, ratio, first, last = named[0]
        self.assertEqual((int(local), int(global_rank)), (rank, rank), err)
        self.assertGreater(float(ratio), 1.5, err)
        # Five windows of 10 steps over: named in the window of steps 40-49, before step 60.
        self.assertLess(int(last), 60, err)

    def test_the_slow_rank_is_named_and_no_other(self):
        for nproc, slow in ((2, 1), (3, 1), (4, 0)):
            with self.subTest(nproc=nproc, slow=slow):
                err = self.crun(nproc, {"STRAGGLER_SLOW": str(slow)})
                self.assert_named_once(err, slow)

    def test_ranks_with_jitter_are_never_named(self):
        err = self.crun(3, {"STRAGGLER_JITTER": "0.3", "STRAGGLER_STEPS": "300",
                            "STRAGGLER_MS": "15"})
        self.assertNotIn("slow rank", err)

    def test_off_reads_no_records(self):
        err = self.crun(2, {"STRAGGLER_SLOW": "1"}, ["--straggler-action", "off"])
        self.assertNotIn("slow rank", err)

    @unittest.skipIf(TORCH_PYTHON is None, "no Python with torch in TORCH_PYTHONS")
    def test_ddp_with_the_comm_hook(self):
        err = self.crun(2, {"STRAGGLER_MODE": "ddp", "STRAGGLER_SLOW": "1",
                            "STRAGGLER_MS": "30"}, python=TORCH_PYTHON)
        self.assert_named_once(err, 1)


if __name__ == "__main__":
    unittest.main()
