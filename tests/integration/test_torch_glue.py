"""The SDK's libtorch glue in real processes under crun (tests/workers/torch_worker.cc):
gradient averaging equals single-process training on the whole batch, and a worker killed
mid-training is restarted by crun and continues from the newest checkpoint to the same
weights as a run that was never interrupted."""
import json
import os
import subprocess
import sys
import unittest

CRUN = os.environ["CRUN_BIN"]
WORKER = os.environ["TORCH_WORKER"]

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from crun_testing import scratch_dir  # noqa: E402


def load(path):
    with open(path) as f:
        return json.load(f)


class TorchGlue(unittest.TestCase):
    def crun(self, nproc, *args, restarts=0):
        r = subprocess.run([CRUN, "--standalone", "--nproc-per-node", str(nproc),
                            "--max-restarts", str(restarts), WORKER, *args],
                           capture_output=True, text=True, timeout=600)
        return r

    def check_gradients(self, nproc):
        out = scratch_dir(self, f"crun-torch-grad-{nproc}-")
        r = self.crun(nproc, "gradcheck", out)
        self.assertEqual(r.returncode, 0, r.stderr[-4000:])
        reps = [load(os.path.join(out, f"rank{k}.json")) for k in range(nproc)]
        for rep in reps:
            self.assertGreater(rep["buckets"], 1)         # several buckets were exercised
            self.assertGreater(rep["moved"], 1e-3)        # training did change the weights
            self.assertLess(rep["max_diff"], 1e-5, rep)   # ...exactly as one process would
        self.assertEqual(len({rep["checksum"] for rep in reps}), 1)  # identical on every rank
        print(f"\n  {nproc} ranks: largest difference from single-process training "
              f"{max(rep['max_diff'] for rep in reps):.2e}")

    def test_gradient_average_equals_single_process_two_ranks(self):
        self.check_gradients(2)

    def test_gradient_average_equals_single_process_three_ranks(self):
        self.check_gradients(3)

    def test_fused_sgd_step_equals_the_optimizers_own_step(self):
        """FusedSgdStep (torch's _foreach kernels) against SGD::step(): three parameter groups
        (Nesterov and weight decay; dampening; plain), twenty steps, parameters and momentum
        buffers."""
        out = scratch_dir(self, "crun-torch-fused-")
        r = subprocess.run([WORKER, "fusedsgd", out], capture_output=True, text=True,
                           timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr[-4000:])
        rep = load(os.path.join(out, "fused.json"))
        self.assertGreater(rep["moved"], 1e-3, rep)     # the steps did change the weights
        self.assertLess(rep["max_diff"], 1e-6, rep)     # ...as the optimizer's own step does
        self.assertLess(rep["buffers_diff"], 1e-6, rep)  # ...and so did its momentum
        self.assertEqual(rep["fused_steps"], 19, rep)  # all but the first, which makes buffers

    def run_resume(self, kill_at):
        out = scratch_dir(self, "crun-torch-resume-")
        ckpt = os.path.join(out, "ckpt")
        r = self.crun(2, "resume", out, ckpt, "10", str(kill_at), restarts=1)
        self.assertEqual(r.returncode, 0, r.stderr[-4000:])
        return r, [load(os.path.join(out, f"final_rank{k}.json")) for k in range(2)]

    def test_killed_worker_resumes_from_the_newest_checkpoint(self):
        r, killed = self.run_resume(5)
        self.assertIn("rank 1: killing myself before step 5", r.stderr)
        for rep in killed:
            self.assertEqual(rep["restart_count"], 1)
            self.assertEqual(rep["resumed_from"], 4)  # checkpoints at 2 and 4; killed before 5
        _, straight = self.run_resume(-1)
        for rep in straight:
            self.assertEqual(rep["restart_count"], 0)
            self.assertEqual(rep["resumed_from"], 0)
        for a, b in zip(killed, straight):
            self.assertAlmostEqual(a["checksum"], b["checksum"], delta=1e-9 * b["checksum"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
