"""crun under real Slurm: munged, slurmctld and two slurmd daemons (Debian's slurm-wlm), each
node a network namespace with its own address and host name (tests/pylib/slurm_cluster.py),
jobs submitted with sbatch and run by srun as users do. Both patterns: one crun per node
(`srun --ntasks-per-node=1 crun --nproc-per-node 2 ...`) and one crun per task
(`srun --ntasks-per-node=2 crun --slurm-direct ...`). Checked: ranks in Slurm's node order with
global rank 0 on the first node, stock PyTorch DDP (gloo) across the nodes, a failed worker
restarted by crun, the exit codes Slurm records, scancel reaching the workers as SIGTERM with
crun's grace period, Slurm's `--signal=USR1@N` warning reaching them without ending the job,
the sbatch scripts of docs/slurm.md, and no process left on any node after any job.

Needs root and the Slurm packages, as CI has them. When the cluster cannot be built, every test
here fails, saying why; nothing is skipped."""
import os
import re
import subprocess
import sys
import threading
import unittest

CRUN = os.environ["CRUN_BIN"]
TRAIN = os.environ.get("TRAIN_BIN", "")
HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "..", "workers")
PROBE = os.path.join(WORKERS, "node_probe.py")
SIGNAL_PROBE = os.path.join(WORKERS, "signal_probe.py")
DDP = os.path.join(WORKERS, "ddp_train.py")
DOC = os.path.join(HERE, "..", "..", "docs", "slurm.md")
# Interpreters whose torch runs the DDP jobs (Debian's 1.13, PyPI's 2.x), comma-separated.
TORCH_PYTHONS = [p for p in os.environ.get("TORCH_PYTHONS", "/usr/bin/python3").split(",") if p]
NODES = ["node1", "node2"]

sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from crun_testing import ddp_digests, probe_events, signal_events, wait_for, whole_lines  # noqa: E402
from slurm_cluster import SlurmCluster  # noqa: E402


LIMIT_TEST = "test_the_warning_signal_and_the_time_limit_reach_the_workers"


def tests_of(suite):
    for t in suite:
        yield from tests_of(t) if isinstance(t, unittest.TestSuite) else [t]


def load_tests(loader, tests, pattern):
    # unittest calls this with the tests `-k` selected: the time-limit job starts with the
    # cluster only when its test is among them.
    RealSlurm.start_limit_job = any(t.id().endswith(LIMIT_TEST) for t in tests_of(tests))
    return tests


def job_pids(pids, job):
    """Those of `pids` that belong to Slurm job `job`: a process or one of its ancestors is the
    job's slurmstepd ("slurmstepd: [JOB.STEP]" or "[JOB.batch]")."""
    def cmdline(pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def parent(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return 0

    mine = set()
    for pid in pids:
        p = pid
        while p > 1:
            if cmdline(p).startswith(f"slurmstepd: [{job}."):
                mine.add(pid)
                break
            p = parent(p)
    return mine


def job_script(body, python=sys.executable, path_dirs=()):
    """A batch script running `body` (bash), with crun's workers started by `python`."""
    path = ":".join([*path_dirs, os.environ["PATH"]])
    return f"#!/bin/bash\nexport PYTHON_EXEC={python} PATH={path}\n{body}\n"


class RealSlurm(unittest.TestCase):
    cluster = None
    start_limit_job = True
    limit_job = None  # the time-limit job, while it may still run beside the other tests
    limit_end_moved = None  # whether its end moved (end_limit_job_after_its_warning), or why not

    @classmethod
    def setUpClass(cls):
        # A ClusterError here fails every test of the class with its reason.
        # Five CPUs a node: the time-limit job's one beside the whole node (four) that the
        # scripts of docs/slurm.md ask for.
        cls.cluster = SlurmCluster(NODES, cpus_per_node=5, kill_wait_s=30).__enter__()
        cls.addClassCleanup(cls.cluster.close)  # also when what follows fails
        if cls.start_limit_job:
            # It idles on purpose until its time limit (moved to just after the warning): it
            # runs beside the others, and its test, last in unittest's order, checks it.
            cls.limit_out = cls.cluster.path("jobs", "time-limit-job")
            os.makedirs(cls.limit_out)
            os.chmod(cls.limit_out, 0o777)
            cls.limit_job = cls.cluster.sbatch(
                job_script(f"srun {CRUN} --nproc-per-node 2 {SIGNAL_PROBE} {cls.limit_out} "
                           "--save-s 1"),
                "--nodes=2", "--ntasks-per-node=1", "--time=1", "--signal=USR1@55")
            cls.limit_mover = threading.Thread(target=cls.end_limit_job_after_its_warning,
                                               args=(cls.limit_job,), daemon=True)
            cls.limit_mover.start()

    @classmethod
    def end_limit_job_after_its_warning(cls, job):
        """slurmctld looks at time limits every 30 s from its start (PERIODIC_TIMEOUT, compiled
        in), and signals only then: the warning at the first look that finds the end less than
        55 + 30 s away (here the first after the job starts), SIGTERM at the first look after
        the end. A one-minute end (the least --time takes) falls between the second and third
        looks, so the job would idle 90 s. Once the warning has reached the workers, its end
        moves to 5 s later: the next look, 30 s after the warning, ends it. The same signals,
        in the same order, from the same checks, one look sooner. The move waits for the
        warning, so it never lands in the look that sends it (that look holds the job lock the
        move needs); when it comes too late or fails, the job keeps its minute."""
        try:
            wait_for(lambda: cls.limit_job != job or any(
                e["sig"] == "SIGUSR1" for e in signal_events(cls.limit_out, "signal")),
                "the time-limit job's warning", limit=120)
            if cls.limit_job == job:
                cls.cluster.end_job_at(job, "now+5")
                cls.limit_end_moved = "moved to 5 s after the warning"
        except Exception as e:  # noqa: BLE001 (printed by its test; the job keeps its minute)
            cls.limit_end_moved = f"not moved ({e}): it ran its full minute"

    @classmethod
    def tearDownClass(cls):
        if cls.limit_job is not None:  # its test did not run to the end
            job, cls.limit_job = cls.limit_job, None  # (the mover, if still waiting, gives up)
            cls.cluster.scancel(job)
            cls.cluster.wait_job(job)

    def setUp(self):
        self.c = self.cluster
        self.out = self.c.path("jobs", self.id().rsplit(".", 1)[-1])
        os.makedirs(self.out)
        os.chmod(self.out, 0o777)

    def tearDown(self):
        # Whatever the job was, nothing of it may outlive it on any node: only slurmd is left,
        # beside the time-limit job while it runs (its own test then checks all of it).
        limit = type(self).limit_job
        for node in NODES:
            daemon = self.c.daemons[f"slurmd-{node}"].pid

            def others():
                pids = self.c.host_pids(node)
                return sorted(set(pids) - job_pids(pids, limit)) if limit else pids
            wait_for(lambda: others() == [daemon],
                     f"{node} to run nothing but slurmd (it runs {others()})", limit=60)

    def submit(self, body, *sbatch_args, python=sys.executable, path_dirs=()):
        """sbatch a script running `body` (bash), with crun's workers started by `python`."""
        return self.c.sbatch(job_script(body, python, path_dirs), *sbatch_args)

    def output(self, job):
        with open(self.c.path("jobs", f"slurm-{job}.out"), errors="replace") as f:
            return f.read()

    def finished(self, job, state, exit_code, limit=300):
        fields = self.c.wait_job(job, limit=limit)
        got = (fields["JobState"], fields["ExitCode"])
        self.assertEqual(got, (state, exit_code), self.output(job)[-4000:])
        return fields

    def check_ddp(self, job):
        """Every rank of the job ended with the same parameters (their digests, printed by
        each)."""
        digests = ddp_digests(self.output(job), 4)
        self.assertEqual(len(set(digests.values())), 1, digests)

    # --- one crun per node -------------------------------------------------------------------

    def probe_job(self, crun_args, tasks_per_node):
        """A job of node_probe workers, 2 per node, each connecting to MASTER_ADDR:MASTER_PORT;
        checks what both patterns share and returns the workers' records in rank order."""
        job = self.submit(f"srun {CRUN} {crun_args} {PROBE} {self.out} --connect-master",
                          "--nodes=2", f"--ntasks-per-node={tasks_per_node}")
        self.finished(job, "COMPLETED", "0:0")
        events = sorted(probe_events(self.out), key=lambda e: int(e["RANK"]))
        self.assertEqual([e["RANK"] for e in events], ["0", "1", "2", "3"])
        for e in events:
            rank = int(e["RANK"])
            node = NODES[rank // 2]  # Slurm's node order: rank 0 on the first node
            self.assertEqual((e["host"], e["GROUP_RANK"], e["LOCAL_RANK"]),
                             (node, str(rank // 2), str(rank % 2)), e)
            self.assertEqual(e["WORLD_SIZE"], "4")
            self.assertEqual(e["TORCHELASTIC_RUN_ID"], f"slurm-{job}.0")
            self.assertEqual(e["MASTER_ADDR"], "node1")  # the step's first node, by name
            # Every worker reached MASTER_ADDR, from its own node's address.
            self.assertEqual(e["connected_from"], self.c.fabric.addr(node))
        return events

    def test_per_node_ranks_follow_slurm_and_global_rank_0_is_on_the_first_node(self):
        events = self.probe_job("--nproc-per-node 2", 1)
        self.assertEqual({e["LOCAL_WORLD_SIZE"] for e in events}, {"2"})

    def test_stock_pytorch_ddp_across_the_nodes(self):
        # Each pattern once, and each PyTorch once (a pair of each): the first with the
        # oldest, the second with the newest. Stock DDP across hosts with each PyTorch and crun
        # in its own right: test_netns.py.
        patterns = (("--nproc-per-node 2", 1, TORCH_PYTHONS[0]),
                    ("--slurm-direct", 2, TORCH_PYTHONS[-1]))
        for crun_args, tasks, python in patterns:
            with self.subTest(pattern=crun_args, python=python):
                for f in os.listdir(self.out):
                    os.unlink(os.path.join(self.out, f))
                job = self.submit(f"srun {CRUN} {crun_args} {DDP} {self.out}", "--nodes=2",
                                  f"--ntasks-per-node={tasks}", python=python)
                self.finished(job, "COMPLETED", "0:0")
                self.assertIn("epoch 4", self.output(job))
                self.check_ddp(job)

    def test_per_node_a_failed_worker_is_restarted_by_crun(self):
        job = self.submit(f"srun {CRUN} --nproc-per-node 2 --max-restarts 1 {PROBE} {self.out} "
                          f"--fail-rank 3 --fail-restart 0 --code 5 --fail-when-all-started",
                          "--nodes=2", "--ntasks-per-node=1")
        self.finished(job, "COMPLETED", "0:0")
        starts = sorted((int(e["TORCHELASTIC_RESTART_COUNT"]), int(e["RANK"]))
                        for e in probe_events(self.out))
        self.assertEqual(starts, [(a, r) for a in (0, 1) for r in range(4)])
        out = self.output(job)
        self.assertIn("rank 3 (local rank 1", out)
        self.assertIn("on node2", out)

    def test_a_failure_is_reported_and_slurm_records_its_code(self):
        # (pattern, srun tasks per node, failing rank, its code, the srun task that reports it)
        cases = [("--nproc-per-node 2", 1, 2, 7, 1), ("--slurm-direct", 2, 3, 9, 3)]
        # Both jobs at once (three CPUs a node beside the time-limit job's one); what is
        # checked is each job's own output.
        jobs = [self.submit(f"srun {CRUN} {crun_args} {PROBE} {self.out} --fail-rank {rank} "
                            f"--code {code}", "--nodes=2", f"--ntasks-per-node={tasks}")
                for crun_args, tasks, rank, code, _ in cases]
        for job, (crun_args, tasks, rank, code, task) in zip(jobs, cases):
            with self.subTest(pattern=crun_args):
                self.finished(job, "FAILED", f"{code}:0")
                out = self.output(job)
                self.assertIn(f"rank      : {rank} (local rank {rank % 2}", out)
                self.assertIn("host      : node2", out)
                self.assertIn(f"exit      : exit code {code}", out)
                self.assertIn(f"task {task}: Exited with exit code {code}", out)  # srun's line

    def test_nodes_that_fail_their_health_check_exit_87_and_are_named_for_the_script(self):
        """docs/health.md: every node's gate fails here (one alone would leave the other
        waiting for it until join_timeout); Slurm records 87, and the file names both."""
        noted = os.path.join(self.out, "unhealthy")
        job = self.submit(f"srun {CRUN} --nproc-per-node 2 --health-check 'echo sick; exit 3' "
                          f"--unhealthy-nodes-file {noted} {PROBE} {self.out}", "--nodes=2",
                          "--ntasks-per-node=1")
        self.finished(job, "FAILED", "87:0")
        self.assertEqual(sorted(whole_lines(noted)), sorted(NODES))
        self.assertEqual(probe_events(self.out), [], "a node that failed its gate ran workers")
        self.assertIn("failed with exit code 3: sick", self.output(job))

    # --- one crun per task -------------------------------------------------------------------

    def test_direct_each_task_is_its_worker_and_rank_0_is_on_the_first_node(self):
        events = self.probe_job("--slurm-direct", 2)
        self.assertEqual({e["LOCAL_WORLD_SIZE"] for e in events}, {"2"})

    def test_direct_with_kill_on_bad_exit_a_failure_ends_every_task(self):
        # The others would wait for the lost rank forever; srun --kill-on-bad-exit=1 (as
        # docs/slurm.md advises for this mode) ends the step, and each crun stops its worker.
        job = self.submit(f"srun --kill-on-bad-exit=1 {CRUN} --slurm-direct {SIGNAL_PROBE} "
                          f"{self.out} --fail-rank 2 --code 6",
                          "--nodes=2", "--ntasks-per-node=2")
        # srun's exit status is its tasks' highest: 143, of those it terminated.
        self.finished(job, "FAILED", "143:0")
        terms = {e["rank"] for e in signal_events(self.out, "signal") if e["sig"] == "SIGTERM"}
        self.assertEqual(terms, {0, 1, 3})
        out = self.output(job)
        self.assertIn("rank      : 2 (local rank 0", out)
        self.assertIn("task 2: Exited with exit code 6", out)

    # --- signals -----------------------------------------------------------------------------

    def scancel_when_started(self, job, out_dir, n):
        try:
            wait_for(lambda: len(signal_events(out_dir, "start")) == n, f"{n} workers started",
                     limit=120)
        finally:
            self.c.scancel(job)  # also when they did not all start: nothing is left running

    def test_scancel_reaches_every_worker_as_sigterm_with_the_grace_period(self):
        patterns = {"per-node": ("--ntasks-per-node=1", "--nproc-per-node 2"),
                    "direct": ("--ntasks-per-node=2", "--slurm-direct")}
        # Both jobs at once (three CPUs a node beside the time-limit job's one), each writing
        # to a directory of its own, so that their seconds of saving overlap.
        jobs = {}
        for name, (tasks, mode) in patterns.items():
            out_dir = os.path.join(self.out, name)
            os.makedirs(out_dir)
            os.chmod(out_dir, 0o777)
            # Each worker takes 2 s to save a checkpoint after SIGTERM: crun's grace (30 s by
            # default) and Slurm's KillWait (30 s) must both leave it that time.
            jobs[name] = (self.submit(f"srun {CRUN} {mode} {SIGNAL_PROBE} {out_dir} --save-s 2",
                                      "--nodes=2", tasks), out_dir)
        for name, (job, out_dir) in jobs.items():
            with self.subTest(pattern=name, step="scancel"):
                self.scancel_when_started(job, out_dir, 4)
        for name, (job, out_dir) in jobs.items():
            with self.subTest(pattern=name):
                self.finished(job, "CANCELLED", "0:15")
                terms = {e["rank"] for e in signal_events(out_dir, "signal")
                         if e["sig"] == "SIGTERM"}
                self.assertEqual(terms, {0, 1, 2, 3})
                saved = sorted(e["rank"] for e in signal_events(out_dir, "saved"))
                self.assertEqual(saved, [0, 1, 2, 3], self.output(job)[-3000:])
                self.assertIn("received SIGTERM: forwarding it to", self.output(job))

    def test_scancel_a_worker_outstaying_cruns_grace_is_killed_by_crun(self):
        # The checkpoint takes 20 s, crun's grace is 1 s: crun, not Slurm's KillWait (30 s),
        # ends the workers, and says so.
        job = self.submit(f"srun {CRUN} --nproc-per-node 2 --shutdown-timeout 1 {SIGNAL_PROBE} "
                          f"{self.out} --save-s 20", "--nodes=2", "--ntasks-per-node=1")
        self.scancel_when_started(job, self.out, 4)
        self.finished(job, "CANCELLED", "0:15")
        self.assertEqual(signal_events(self.out, "saved"), [])
        out = self.output(job)
        self.assertEqual(len(re.findall(r"still running 1000 ms after the stop signal: SIGKILL",
                                        out)), 4, out[-3000:])

    def test_the_warning_signal_and_the_time_limit_reach_the_workers(self):
        # --signal=USR1@55 on a one-minute job: Slurm's controller sends the warning at its next
        # time-limit check (every 30 s), then SIGTERM at the limit. crun, which Slurm signals
        # too, passes the warning on as a notice and goes on; at the limit the workers get
        # SIGTERM and the grace period to save.
        # Submitted with the cluster (setUpClass): it ran beside the other tests, its end moved
        # to just after the warning (end_limit_job_after_its_warning).
        job, out_dir = self.limit_job, self.limit_out
        try:
            self.finished(job, "TIMEOUT", "0:15", limit=180)
        finally:
            type(self).limit_job = None  # ended, or failed: every later tearDown sees all
        self.limit_mover.join(timeout=30)
        print(f"\n  time-limit job {job}: its end {self.limit_end_moved}", file=sys.stderr)
        for rank in range(4):
            got = [e["sig"] for e in signal_events(out_dir, "signal")
                   if e["rank"] == rank and e["sig"] != "SIGCONT"]
            # Each may come twice: Slurm signals every process of the step, and crun passes
            # its own copy on (docs/slurm.md, "Signals").
            order = [sig for i, sig in enumerate(got) if i == 0 or got[i - 1] != sig]
            self.assertEqual(order, ["SIGUSR1", "SIGTERM"], f"rank {rank}: {got}")
        out = self.output(job)
        self.assertEqual(len(signal_events(out_dir, "saved")), 4,
                         f"{signal_events(out_dir)}\n{out[-3000:]}")
        self.assertIn("received SIGUSR1: passing it on to 2 workers", out)
        self.assertIn("DUE TO TIME LIMIT", out)

    # --- the documentation's scripts ---------------------------------------------------------

    def test_the_sbatch_scripts_of_docs_slurm_md_run_as_written(self):
        with open(DOC) as f:
            scripts = re.findall(r"```bash\n(#!/bin/bash\n.*?)```", f.read(), re.S)
        scripts = [s for s in scripts if "#SBATCH" in s]
        self.assertEqual(len(scripts), 3,
                         "docs/slurm.md should show both patterns and the requeue script")
        self.assertTrue(TRAIN, "TRAIN_BIN is not set")
        for i, script in enumerate(scripts):
            with self.subTest(script=i):
                # crun and train on PATH, as after `cmake --install`; the script runs verbatim.
                path = ":".join([os.path.dirname(CRUN), os.path.dirname(TRAIN),
                                 os.environ["PATH"]])
                job = self.c.sbatch(script, env={"PATH": path})
                fields = self.c.wait_job(job, limit=600)
                if "--requeue" in script:
                    # A crash loop (docs/health.md): 86 from every crun, and no requeue.
                    out = self.output(job)
                    self.assertEqual((fields["JobState"], fields["ExitCode"]),
                                     ("FAILED", "86:0"), out[-4000:])
                    self.assertEqual(fields.get("Restarts"), "0", fields)
                    self.assertIn("a crash loop: not requeueing", out)
                    self.assertRegex(out, r"crash loop: rank \d+ .* failed with exit code 2 in 3 "
                                          r"attempts before any step")
                    continue
                self.assertEqual((fields["JobState"], fields["ExitCode"]), ("COMPLETED", "0:0"),
                                 self.output(job)[-4000:])
                self.assertRegex(self.output(job), r"\(4 worker\(s\)\).*parameters identical "
                                                   r"on all ranks: yes")


if __name__ == "__main__":
    unittest.main(verbosity=2)
