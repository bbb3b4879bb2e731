"""train, the reference workload, as users run it: two CPU workers under crun on synthetic
CIFAR-10. Accuracy rises far above chance with identical parameters on both ranks; a worker
SIGKILLed mid-run is restarted by crun and training resumes from the snapshot in crun's node
memory, ending with exactly the parameters of an uninterrupted run; without snapshots it
resumes from the newest checkpoint, not from epoch 0; and the same when the next attempt has
a different world size."""
import json
import os
import pty
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
import lanes  # noqa: E402

CRUN = os.environ["CRUN_BIN"]
TRAIN = os.environ["TRAIN_BIN"]


def worker_pids(rank, parent):
    """Pids of running train workers of the crun `parent` whose environment says RANK=rank
    (another suite may be running train at the same time)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != parent:
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if not f.read().split(b"\0")[0].endswith(b"/train"):
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"RANK={rank}".encode() in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            continue
    return found


class Train(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="crun-train-")
        self.data = os.path.join(self.dir, "data")
        self.ckpt = os.path.join(self.dir, "ckpt")
        self.metrics = os.path.join(self.dir, "metrics.json")

    def cmd(self, nproc, images, epochs, restarts=0, snapshot_every=0, crun_args=()):
        return [CRUN, "--standalone", "--nproc-per-node", str(nproc), "--max-restarts",
                str(restarts), *crun_args, TRAIN, "--synthetic", str(images), "--data-dir",
                self.data, "--epochs", str(epochs), "--batch-size", "64", "--log-every", "5",
                "--checkpoint-dir", self.ckpt, "--metrics-json", self.metrics,
                "--snapshot-every", str(snapshot_every)]

    def run_killing(self, cmd, kill_when):
        """Runs `cmd`; when a line of its output contains `kill_when`, SIGKILLs rank 1."""
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, killed = [], False
        for line in p.stdout:
            out.append(line)
            if not killed and kill_when in line:
                pids = worker_pids(1, p.pid)
                self.assertEqual(len(pids), 1, pids)
                os.kill(pids[0], signal.SIGKILL)
                killed = True
        p.wait(timeout=600)
        self.assertTrue(killed, "".join(out[-30:]))
        return p.returncode, "".join(out)

    def metrics_json(self):
        with open(self.metrics) as f:
            return json.load(f)

    def test_two_workers_learn_far_above_chance_with_identical_parameters(self):
        t0 = time.monotonic()
        r = subprocess.run(self.cmd(2, 5000, 3), capture_output=True, text=True, timeout=900)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        m = self.metrics_json()
        self.assertEqual(m["world_size"], 2)
        self.assertEqual(len(m["test_accuracy"]), 3)
        # Chance is 0.1; 5000 images reach 0.93 here (8000 reach 0.997, 4000 only 0.64).
        self.assertGreater(m["test_accuracy"][-1], 0.6)
        self.assertTrue(m["parameters_identical"])
        self.assertEqual(len(set(m["parameter_hashes"])), 1)
        self.assertIn("test accuracy", r.stdout)
        self.assertIn("parameters identical on all ranks: yes", r.stdout)
        print(f"\n  2 workers, 5000 images, 3 epochs: test accuracy {m['test_accuracy']} "
              f"in {time.monotonic() - t0:.1f} s")

    def test_killed_worker_is_restarted_and_resumes_from_the_checkpoint(self):
        # Killed at epoch 2's first progress line (step 5 of 15): after epoch 1's checkpoint,
        # which rank 0 writes before it starts epoch 2, and with 10 steps of epoch 2 to go.
        rc, out = self.run_killing(self.cmd(2, 2000, 3, restarts=1), "epoch 2/3 step 5/")
        self.assertEqual(rc, 0, out[-4000:])
        self.assertIn("resuming after epoch 1 (restart 1)", out)
        m = self.metrics_json()
        self.assertEqual(m["start_epoch"], 1)                  # not from epoch 0
        self.assertEqual(m["restart_count"], 1)
        self.assertEqual(len(m["test_accuracy"]), 2)           # epochs 2 and 3 only
        self.assertTrue(m["parameters_identical"])
        self.assertGreater(m["test_accuracy"][-1], 0.3)
        print(f"\n  resumed after epoch 1: test accuracy {m['test_accuracy']}")

    def test_killed_worker_resumes_from_node_memory_with_identical_parameters(self):
        # Uninterrupted: the parameters after three epochs, a snapshot saved at every step.
        r = subprocess.run(self.cmd(2, 1000, 3, snapshot_every=1), capture_output=True,
                           text=True, timeout=900)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        uninterrupted = self.metrics_json()["parameter_hashes"]
        shutil.rmtree(self.ckpt)  # the next run starts afresh
        # Rank 1 SIGKILLed in the middle of epoch 2 (maybe in the middle of a save): both ranks
        # resume at the newest step both hold, with their state, data position and RNG.
        rc, out = self.run_killing(self.cmd(2, 1000, 3, restarts=1, snapshot_every=1),
                                   "epoch 2/3 step 5/")
        self.assertEqual(rc, 0, out[-4000:])
        self.assertIn("from crun's node memory (restart 1)", out)
        m = self.metrics_json()
        self.assertEqual(m["restart_count"], 1)
        self.assertEqual(m["parameter_hashes"], uninterrupted)

    def test_resume_at_a_different_world_size(self):
        # Attempt 1: two workers, no restarts allowed; rank 1 dies in epoch 2 (at its first
        # progress line, after epoch 1's checkpoint).
        rc, out = self.run_killing(self.cmd(2, 2000, 3), "epoch 2/3 step 5/")
        self.assertNotEqual(rc, 0, out[-3000:])
        self.assertIn("SIGKILL", out)
        self.assertIn("step-000000000001.ckpt", os.listdir(self.ckpt))
        # Attempt 2: one worker picks up from epoch 1's checkpoint.
        r = subprocess.run(self.cmd(1, 2000, 3), capture_output=True, text=True, timeout=900)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        self.assertIn("resuming after epoch 1", r.stdout)
        m = self.metrics_json()
        self.assertEqual((m["world_size"], m["start_epoch"]), (1, 1))
        self.assertGreater(m["test_accuracy"][-1], 0.3)
        # And back to two workers for one more epoch.
        r = subprocess.run(self.cmd(2, 2000, 4), capture_output=True, text=True, timeout=900)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        m = self.metrics_json()
        self.assertEqual((m["world_size"], m["start_epoch"]), (2, 3))
        self.assertTrue(m["parameters_identical"])

    def test_progress_bar_on_a_terminal_plain_lines_otherwise(self):
        args = [TRAIN, "--synthetic", "400", "--data-dir", self.data, "--epochs", "1",
                "--batch-size", "50", "--log-every", "2"]
        master, slave = pty.openpty()
        p = subprocess.Popen(args, stdout=slave, stderr=subprocess.PIPE)
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        os.close(master)
        self.assertEqual(p.wait(timeout=300), 0, p.stderr.read())
        tty = b"".join(chunks).decode()
        self.assertIn("\repoch 1/1 [########################] 8/8 loss ", tty)
        self.assertIn("ETA 0:00:00", tty)
        r = subprocess.run(args, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("\r", r.stdout)
        steps = [l for l in r.stdout.splitlines() if l.startswith("epoch 1/1 step ")]
        self.assertEqual([l.split()[3] for l in steps], ["2/8", "4/8", "6/8", "8/8"])

    def test_bad_input_is_named(self):
        r = subprocess.run([TRAIN, "--synthetic", "100", "--epochs", "0"], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--epochs '0' is not valid", r.stderr)
        os.makedirs(self.data)
        r = subprocess.run([TRAIN, "--data-dir", self.data], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn(os.path.join(self.data, "data_batch_1.bin"), r.stderr)
        r = subprocess.run([TRAIN, "--synthetic", "100", "--batch-size", "200"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--batch-size 200 x 1 workers is more than the 100 training images", r.stderr)
        r = subprocess.run([TRAIN, "--synthetic", "100"], capture_output=True, text=True,
                           timeout=60, env=dict(os.environ, WORLD_SIZE="two"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("WORLD_SIZE", r.stderr)


if __name__ == "__main__":
    # Two tests at a time (TRAIN_LANES): alone, one after another, the suite left a core idle a
    # fifth of its time (libtorch's load, crun's restarts, the one-process cases); each test
    # has its own directories and crun, and finds its workers by their crun.
    lanes.main(int(os.environ.get("TRAIN_LANES", "2")))
