"""The worker SDK's Gloo backend in real processes (tests/workers/gloo_worker.cc): groups of 2 to
8 ranks launched by crun, checked collective by collective up to 64 MiB; and a rank that dies or
hangs in the middle of a 64 MiB allreduce, with the survivors returning an error, not hanging.
Ranks of one host use the shared-memory channel by default; the same checks run with it turned
off (CRUN_GLOO_SHM=0), over Gloo's TCP pairs."""
import json
import os
import signal
import subprocess
import sys
import unittest

CRUN = os.environ["CRUN_BIN"]
WORKER = os.environ["GLOO_WORKER"]
MIB = 1 << 20

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from crun_testing import kill_all, proc_state, scratch_dir, start_store, stop_store  # noqa: E402


def report(out, rank):
    with open(os.path.join(out, f"rank{rank}.json")) as f:
        return json.load(f)


def transport_env(shm):
    env = dict(os.environ)
    env.pop("CRUN_GLOO_SHM", None)
    if not shm:
        env["CRUN_GLOO_SHM"] = "0"
    return env


class GlooUnderCrun(unittest.TestCase):
    def run_check(self, nproc, max_bytes, shm=True):
        out = scratch_dir(self, f"crun-gloo-{nproc}-")
        r = subprocess.run([CRUN, "--standalone", "--nproc-per-node", str(nproc), WORKER, "check",
                            out, str(max_bytes)], capture_output=True, text=True, timeout=500,
                           env=transport_env(shm))
        self.assertEqual(r.returncode, 0, r.stderr[-4000:])
        checks = set()
        for rank in range(nproc):
            rep = report(out, rank)
            self.assertTrue(rep["ok"])
            self.assertEqual(rep["world"], nproc)
            self.assertEqual(rep["shared_memory"], shm)
            checks.add(rep["checks"])
        # Every rank ran the same collectives, and the sweep is the full one (6 dtypes).
        self.assertEqual(len(checks), 1)
        self.assertGreater(checks.pop(), 60)

    def test_two_ranks_up_to_64_mib(self):
        self.run_check(2, 64 * MIB)

    def test_three_ranks(self):
        self.run_check(3, 4 * MIB)

    def test_five_ranks(self):
        self.run_check(5, 4 * MIB)

    def test_eight_ranks_up_to_64_mib(self):
        self.run_check(8, 64 * MIB)

    def test_two_ranks_up_to_64_mib_over_tcp(self):
        self.run_check(2, 64 * MIB, shm=False)

    def test_three_ranks_over_tcp(self):
        self.run_check(3, 4 * MIB, shm=False)

    def test_no_segment_is_left_in_dev_shm(self):
        # The segment is unlinked once every rank has mapped it: nothing named stays behind,
        # whatever happens to the processes later.
        before = set(os.listdir("/dev/shm"))
        self.run_check(4, 1 * MIB)
        left = [n for n in set(os.listdir("/dev/shm")) - before if n.startswith("crun-")]
        self.assertEqual(left, [])


class RankLostMidCollective(unittest.TestCase):
    """Processes started here with the worker environment and a `crun store`, not under crun:
    crun would stop the survivors as soon as the victim died, and the point is what the SDK
    itself tells them."""

    shm = True

    def launch(self, world, victim, mode, timeout_ms):
        out = scratch_dir(self, f"crun-gloo-{mode}-")
        store, port = start_store(CRUN)
        self.addCleanup(stop_store, store)
        procs = []
        for rank in range(world):
            env = dict(transport_env(self.shm), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), TORCHELASTIC_RUN_ID=f"die-{mode}")
            procs.append(subprocess.Popen(
                [WORKER, "die", out, str(victim), mode, str(timeout_ms)], env=env,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        self.addCleanup(kill_all, procs)
        return out, procs

    def survivors(self, out, procs, victim, limit_s):
        for rank, p in enumerate(procs):
            if rank == victim:
                continue
            _, err = p.communicate(timeout=limit_s)
            self.assertEqual(p.returncode, 0, f"rank {rank}: {err[-3000:]}")
        return [report(out, r) for r in range(len(procs)) if r != victim]

    def test_killed_rank_makes_the_others_fail_at_once(self):
        timeout_ms = 60_000
        out, procs = self.launch(4, 2, "kill", timeout_ms)
        reps = self.survivors(out, procs, 2, limit_s=120)
        self.assertEqual(procs[2].wait(timeout=30), -signal.SIGKILL)
        print("\n  survivors of a SIGKILLed rank failed after",
              ", ".join(f"{rep['elapsed_ms']} ms" for rep in reps), "(timeout 60000 ms)")
        for rep in reps:
            self.assertFalse(rep["ok"])
            self.assertEqual(rep["shared_memory"], self.shm)
            self.assertEqual(rep["code"], "unavailable", rep["message"])
            self.assertIn(f"gloo group 'default', rank {rep['rank']} of 4: allreduce of "
                          "16777216 float32 (sum)", rep["message"])
            # A lost peer is seen from its closed connections, not from the 60 s timer.
            self.assertLess(rep["elapsed_ms"], timeout_ms)

    def test_hung_rank_makes_the_others_time_out(self):
        timeout_ms = 2_000
        out, procs = self.launch(3, 1, "hang", timeout_ms)
        # The victim stops itself; it is reaped by the cleanup once the survivors are done.
        reps = self.survivors(out, procs, 1, limit_s=120)
        codes = sorted(rep["code"] for rep in reps)
        print("\n  survivors of a stopped rank:",
              ", ".join(f"{rep['code']} after {rep['elapsed_ms']} ms" for rep in reps),
              f"(timeout {timeout_ms} ms)")
        # The first survivor to give up closes its connections, so the other may hear of it
        # from that instead of from its own timer; at least one of them timed out.
        self.assertIn("timeout", codes)
        for rep in reps:
            self.assertFalse(rep["ok"])
            self.assertIn(rep["code"], ("timeout", "unavailable"), rep["message"])
            self.assertIn(f"rank {rep['rank']} of 3: allreduce of 16777216 float32",
                          rep["message"])
            self.assertEqual(rep["shared_memory"], self.shm)
            if rep["code"] == "timeout":
                self.assertIn("Timed out", rep["message"])
                self.assertGreaterEqual(rep["elapsed_ms"], timeout_ms)
        self.assertIsNone(procs[1].poll())  # still stopped, still there: nothing killed it
        self.assertEqual(proc_state(procs[1].pid), "T")


class RankLostMidCollectiveOverTcp(RankLostMidCollective):
    shm = False


if __name__ == "__main__":
    unittest.main(verbosity=2)
