"""Real frameworks under crun, unchanged: PyTorch Lightning and Hugging Face accelerate (from
PyPI, in the PyTorch 2.x environment scripts/setup-torch2.sh makes). Each must recognise the
torchelastic environment crun provides (not spawn processes of its own), train on both ranks,
and end with identical weights."""
import glob
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from crun_testing import scratch_dir  # noqa: E402

CRUN = os.environ["CRUN_BIN"]
WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "workers")
LIMIT_S = 300


class Frameworks(unittest.TestCase):
    def launch(self, worker, prefix):
        out = scratch_dir(self, "crun-frameworks-")
        env = dict(os.environ, PYTHON_EXEC=sys.executable)
        p = subprocess.Popen([CRUN, "--standalone", "--nproc-per-node", "2",
                              os.path.join(WORKERS, worker), out],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            stdout, stderr = p.communicate(timeout=LIMIT_S)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
        self.assertEqual(p.returncode, 0, stdout + stderr)
        reports = []
        for path in sorted(glob.glob(os.path.join(out, f"{prefix}_*.json"))):
            with open(path) as f:
                reports.append(json.load(f))
        self.assertEqual(len(reports), 2, stdout + stderr)
        # Both ranks are crun's own children: the framework started no process of its own.
        self.assertEqual({r["ppid"] for r in reports}, {p.pid})
        self.assertEqual(len({r["weights"] for r in reports}), 1, "weights differ between ranks")
        return reports, stderr

    def test_lightning_ddp_detects_torchelastic_and_trains_both_ranks(self):
        reports, stderr = self.launch("lightning_worker.py", "lightning")
        for r in reports:
            self.assertEqual(r["environment"], "TorchElasticEnvironment")
            self.assertEqual(r["world_size"], 2)
            self.assertTrue(r["trained"])
            self.assertGreater(r["steps"], 0)
        self.assertEqual(sorted(r["global_rank"] for r in reports), [0, 1])
        self.assertNotIn("NCCL_ASYNC_ERROR_HANDLING is deprecated", stderr)

    def test_accelerate_cpu_runs_two_processes(self):
        reports, _ = self.launch("accelerate_worker.py", "accelerate")
        for r in reports:
            self.assertEqual(r["distributed_type"], "DistributedType.MULTI_CPU")
            self.assertEqual(r["num_processes"], 2)
            self.assertGreater(r["steps"], 0)
        self.assertEqual(sorted(r["process_index"] for r in reports), [0, 1])


if __name__ == "__main__":
    unittest.main(verbosity=2)
