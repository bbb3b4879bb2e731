"""A stock PyTorch DDP script under `crun --standalone --nproc-per-node 2` trains and ends
with identical parameters on every rank. The interpreter running this file is the one crun
starts the workers with (PYTHON_EXEC), so the suite runs once per PyTorch version."""
import os
import subprocess
import sys
import unittest

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from crun_testing import scratch_dir  # noqa: E402

CRUN = os.environ["CRUN_BIN"]
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "workers", "ddp_train.py")


class DdpUnderCrun(unittest.TestCase):
    def test_ddp_trains_to_identical_parameters(self):
        out = scratch_dir(self, "crun-ddp-")
        env = dict(os.environ, PYTHON_EXEC=sys.executable)
        r = subprocess.run([CRUN, "--standalone", "--nproc-per-node", "2", SCRIPT, out],
                           capture_output=True, text=True, timeout=300, env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("epoch 4", r.stdout)
        p0 = torch.load(os.path.join(out, "params_0.pt"))
        p1 = torch.load(os.path.join(out, "params_1.pt"))
        self.assertTrue(torch.equal(p0, p1), f"{p0} != {p1}")
        # It learned: the weights approach 1..8.
        self.assertLess((p0[:8] - torch.arange(1.0, 9.0)).abs().max().item(), 0.5)


if __name__ == "__main__":
    unittest.main(verbosity=2)
