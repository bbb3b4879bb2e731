"""Slow ranks (docs/health.md, "Slow ranks") with real crun processes on one node: a rank that
computes 2.5 times longer than the others is named, by its rank and host, in the window the
detector decides (never a duration asserted), and no other rank is; ranks with jitter are never
named; --straggler-action off reads no records. With torch, the same through a Gloo DDP model
and crun_worker.allreduce_hook, the recommended producer.

Across two hosts (network namespaces) on the rendezvous service: both ranks of one node are
slow, which only a job-wide comparison can tell (among that node's ranks they are equal); the
node that runs them names them, the other node names nobody, and `crun status` shows them.

The evidence for the detector's defaults (1.5x, 10 ms, 5 windows; docs/health.md) is a noisy
job that never trips them: STRAGGLER_NOISY_STEPS steps of its 4 ranks, 1500 here (30 s, 150
windows each) and 9000 (3 minutes, 900 windows) in tests/bench/matrix_bench.py, which records
its last run in docs/reliability.md.

Every test runs at once (tests/pylib/lanes.py): each is a job that sleeps through its steps on a
fraction of a core, and the noisy job, the longest, is the run's length. A verdict compares a
rank's compute time with the median of its own job's other ranks, which the jobs beside it load
alike: the noisy job runs beside them as it runs beside the rest of the suite, and names nobody
before its slow rank turns slow. No case waits on an import against a timeout shorter than
LIMIT_S: a DDP rank's torch import only delays its own job."""
import json
import os
import re
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from crun_testing import kill_all, scratch_dir, wait_for  # noqa: E402
from fabric import Fabric  # noqa: E402
import lanes  # noqa: E402

CRUN = os.environ["CRUN_BIN"]
WORKER = os.path.join(HERE, "..", "workers", "straggler_worker.py")
PYTHON = os.environ.get("PYTHON_EXEC", sys.executable)
# The first that has torch installed (found, not imported: torch 2.x's import took seconds, more
# on a loaded machine, before any test started; a torch that fails to import fails the DDP test).
TORCH_PYTHON = next((p for p in os.environ.get("TORCH_PYTHONS", "").split(",")
                     if p and subprocess.run([p, "-c", "import importlib.util, sys; sys.exit("
                                              "importlib.util.find_spec('torch') is None)"],
                                             capture_output=True).returncode == 0), None)
LIMIT_S = 120
# 90 steps: a rank 2.5 times slower is named in the window of steps 40-49 (2.5 s), with 40
# steps to spare before it ends.
STEPS = "90"
NOISY_STEPS = int(os.environ.get("STRAGGLER_NOISY_STEPS", "1500"))
NAMED = re.compile(r"slow rank on (\S+) \(local rank (\d+)\): rank (\d+): ([\d.]+)x the others' "
                   r"median compute time per step \(steps (\d+)-(\d+)\)")


class OneNode(unittest.TestCase):
    def setUp(self):
        self.dir = scratch_dir(self, "crun-stragglers-")
        self.procs = []

    def tearDown(self):
        kill_all(self.procs)

    def crun(self, nproc, env, args=(), python=PYTHON, limit=LIMIT_S):
        e = dict(os.environ, PYTHON_EXEC=python, STRAGGLER_STEPS=STEPS)
        e.update(env)
        p = subprocess.Popen([CRUN, "--standalone", "--nproc-per-node", str(nproc), *args,
                              WORKER], env=e, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        _, err = p.communicate(timeout=limit)
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

    def test_a_noisy_job_never_trips_the_defaults(self):
        # The evidence for the defaults (docs/health.md): 4 ranks, NOISY_STEPS steps of 20 ms
        # (800 in CI, 16 s and 80 windows each; 9000, 3 minutes and 900 windows, in the
        # bench), every step +-30 % and one in a hundred 5 times as long, on a machine as loaded
        # as the test run makes it. Rank 2 turns slow for the last tenth of the steps (at most
        # 300; named within 5 windows), so the detector is shown judging all along: named then, and nothing before.
        slow_from = NOISY_STEPS - min(300, NOISY_STEPS // 10)
        err = self.crun(4, {"STRAGGLER_JITTER": "0.3", "STRAGGLER_SPIKES": "0.01",
                            "STRAGGLER_STEPS": str(NOISY_STEPS), "STRAGGLER_MS": "20",
                            "STRAGGLER_SLOW": "2", "STRAGGLER_FROM": str(slow_from)},
                        limit=LIMIT_S + NOISY_STEPS * 0.035)
        named = NAMED.findall(err)
        self.assertEqual([int(n[2]) for n in named], [2], err)
        self.assertGreaterEqual(int(named[0][4]), slow_from, err)

    def test_off_reads_no_records(self):
        err = self.crun(2, {"STRAGGLER_SLOW": "1"}, ["--straggler-action", "off"])
        self.assertNotIn("slow rank", err)

    @unittest.skipIf(TORCH_PYTHON is None, "no Python with torch in TORCH_PYTHONS")
    def test_ddp_with_the_comm_hook(self):
        err = self.crun(2, {"STRAGGLER_MODE": "ddp", "STRAGGLER_SLOW": "1",
                            "STRAGGLER_MS": "30"}, python=TORCH_PYTHON)
        self.assert_named_once(err, 1)


class AcrossHosts(unittest.TestCase):
    PORT = 29410
    METRICS = 29411

    def setUp(self):
        self.dir = scratch_dir(self, "crun-stragglers-")
        self.procs = []

    def tearDown(self):
        kill_all(self.procs)

    def node(self, fab, host, env, args=()):
        """`host`'s crun, its stderr into DIR/<host>.err (finish() reads it; a test may watch
        it while the job runs)."""
        rank = () if host == "c" else ("--node-rank", "0" if host == "a" else "1")
        args = [CRUN, "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint",
                f"{fab.addr('a')}:{self.PORT}", "--rdzv-id", "slow", *rank,
                "--metrics-port", str(self.METRICS), *args, WORKER]
        with open(self.err_path(host), "w") as err:
            p = fab.popen(host, args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=err, env=dict(os.environ, NODE_TAG=host, **env))
        self.procs.append(p)
        return p

    def err_path(self, host):
        return os.path.join(self.dir, f"{host}.err")

    def said(self, host):
        with open(self.err_path(host), errors="replace") as f:
            return f.read()

    def finish(self, p, host):
        """Waits for `host`'s crun `p` to exit (LIMIT_S at most): its stderr."""
        try:
            p.wait(timeout=LIMIT_S)
        except subprocess.TimeoutExpired:
            self.fail(f"{host}'s crun still ran after {LIMIT_S} s:\n{self.said(host)[-3000:]}")
        return self.said(host)

    def status(self, fab):
        """The job as `crun status --json` shows it; None before node a serves it."""
        out = subprocess.run(fab.command("a", [
            CRUN, "status", "--rdzv-endpoint", f"{fab.addr('a')}:{self.PORT}",
            "--rdzv-id", "slow", "--json"]), capture_output=True, text=True, timeout=60)
        self.last_status = out.stdout + out.stderr
        return json.loads(out.stdout)[0] if out.returncode == 0 else None

    def metrics(self, fab, host):
        """`host`'s crun's metrics page, read inside its namespace."""
        out = subprocess.run(fab.command(host, [
            sys.executable, "-c", "import sys, urllib.request; sys.stdout.write(urllib.request."
            f"urlopen('http://127.0.0.1:{self.METRICS}/metrics', timeout=10).read().decode())"]),
            capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout

    def test_a_slow_node_is_named_job_wide_by_the_node_that_runs_it(self):
        # Ranks 2 and 3 (node b) compute 2.5x longer. Every rank runs until `crun status` and
        # the metrics have been read, when the test creates the stop file (1200 steps, 60 s for
        # the slow ranks, at most).
        stop = os.path.join(self.dir, "stop")
        env = {"STRAGGLER_SLOW": "2,3", "STRAGGLER_STEPS": "1200", "STRAGGLER_STOP_IF": stop}
        with Fabric(["a", "b"]) as fab:
            nodes = {h: self.node(fab, h, env) for h in ("a", "b")}
            named = {}

            def slow_in_status():
                job = self.status(fab)
                for n in job["nodes"] if job else []:
                    if n["stragglers"]:
                        named[n["group_rank"]] = n["stragglers"]
                return bool(named)
            try:
                wait_for(slow_in_status, "a node with slow ranks in crun status")
            except AssertionError as e:
                raise AssertionError(f"{e}; crun status said: {self.last_status}") from None
            self.assertEqual(list(named), [1], named)
            self.assertEqual(sorted(s["rank"] for s in named[1]), [2, 3], named)
            self.assertTrue(all(s["ratio"] > 1.5 and s["last_step"] < 60 for s in named[1]),
                            named)
            # Each node's metrics: b counts both ranks and shows their ratios; a, none.
            ratio = re.compile(r'^crun_agent_straggler_ratio\{[^}]*rank="(\d+)"\} ([\d.]+)$', re.M)
            wait_for(lambda: len(ratio.findall(self.metrics(fab, "b"))) == 2,
                     "both slow ranks in node b's metrics")
            page = self.metrics(fab, "b")
            self.assertEqual(sorted(int(r) for r, _ in ratio.findall(page)), [2, 3], page)
            self.assertRegex(page, r"(?m)^crun_agent_stragglers_total\{[^}]*\} 2$")
            page = self.metrics(fab, "a")
            self.assertEqual(ratio.findall(page), [], page)
            self.assertRegex(page, r"(?m)^crun_agent_stragglers_total\{[^}]*\} 0$")
            open(stop, "w").close()
            errs = {}
            for h, p in nodes.items():
                errs[h] = self.finish(p, h)
                self.assertEqual(p.returncode, 0, errs[h])
        self.assertNotIn("slow rank", errs["a"])
        found = NAMED.findall(errs["b"])
        self.assertEqual(sorted((int(f[1]), int(f[2])) for f in found), [(0, 2), (1, 3)],
                         errs["b"])
        for host, local, rank, ratio, first, last in found:
            self.assertGreater(float(ratio), 1.5, errs["b"])
            self.assertLess(int(last), 60, errs["b"])

    def test_exclude_hands_a_slow_nodes_ranks_to_a_spare(self):
        # Node b's two ranks are slow (its own environment: whoever runs ranks 2 and 3 next is
        # not). With exclude, b leaves with "requeue without this node" and its host noted; the
        # spare c takes its ranks and the job ends well on a and c.
        done, noted, later = (os.path.join(self.dir, f) for f in ("done", "unhealthy", "later"))
        # 1000 steps: a's first ranks (20 s) cannot finish before b is named (50 of its steps).
        # The round of a and c, which starts once `later` exists (made when b says it leaves),
        # runs 120 (2.4 s): long enough for c to be named, were the slowness b's ranks' rather
        # than b's.
        env = {"STRAGGLER_STEPS": "1000", "STRAGGLER_LOG": done, "STRAGGLER_LATER_IF": later,
               "STRAGGLER_LATER_STEPS": "120"}
        args = ("--straggler-action", "exclude", "--unhealthy-nodes-file", noted)
        with Fabric(["a", "b", "c"]) as fab:
            a = self.node(fab, "a", env, args)
            b = self.node(fab, "b", dict(env, STRAGGLER_SLOW="2,3"), args)

            def members():
                job = self.status(fab)
                return job and sum(n["state"] == "member" for n in job["nodes"]) == 2
            wait_for(members, "a round of a and b")
            c = self.node(fab, "c", env, args)
            wait_for(lambda: "leaves the job" in self.said("b") or b.poll() is not None,
                     "node b to leave", limit=LIMIT_S)
            open(later, "w").close()
            err_b = self.finish(b, "b")
            self.assertEqual(b.returncode, 87, err_b)
            self.assertRegex(err_b, r"this node \(\S+\) leaves the job: slow rank [23]: [\d.]+x "
                             r"the others' median compute time per step \(steps \d+-\d+\) "
                             r"\(--straggler-action exclude\)")
            errs = {}
            for h, p in (("a", a), ("c", c)):
                errs[h] = self.finish(p, h)
                self.assertEqual(p.returncode, 0, errs[h])
        with open(noted) as f:
            self.assertEqual(len(f.read().splitlines()), 1)
        with open(done) as f:
            finished = sorted(tuple(line.split()) for line in f.read().splitlines())
        # Every rank finished once, in the round of a and c (b's ranks never finished).
        self.assertEqual(sorted(int(r) for r, _, _ in finished), [0, 1, 2, 3], finished)
        self.assertEqual({tag for _, tag, _ in finished}, {"a", "c"}, finished)
        # The others were told why b went; c, running b's ranks now, names nobody.
        for h in ("a", "c"):
            self.assertRegex(errs[h], r"re-forming the job: node \S+ \(\S+\) was lost: it left: "
                             r"excluded: slow rank [23]: ")
        self.assertEqual(NAMED.findall(errs["c"]), [], errs["c"])


if __name__ == "__main__":
    lanes.main(7)  # every test at once: the noisy job's length, not the sum
