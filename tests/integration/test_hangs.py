"""Hangs under crun, with real workers (docs/hangs.md): a stock PyTorch DDP job (gloo) in which
one rank blocks in a function with a distinctive name while the others wait in all_reduce, with
PyTorch 1.13 (Debian's python: no py-spy, so crun's faulthandler hook) and 2.x (py-spy beside
its python); a native SDK worker whose only progress is its heartbeat (eu-stack); torchelastic's
file timer; a SIGSTOPped worker; `crun stacks` on a running job; and bad input. Each time crun
must name the hung rank and where every rank was, then restart the group and finish.

Two at a time (tests/pylib/lanes.py): the cases whose workers import PyTorch one after another
in a lane of their own (TorchWorkers), and beside them, one after another, those whose workers
import nothing heavy (QuietWorkers, OomKiller): two PyTorch imports at once have kept a
healthy rank in uninterruptible sleep (D: no progress) past a 5 s hang timeout."""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import unittest

CRUN = os.environ["CRUN_BIN"]
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "..", "workers", "hang_worker.py")
NATIVE = os.environ["HANG_NATIVE"]
TORCH1 = os.environ["TORCH1_PYTHON"]
TORCH2 = os.environ.get("TORCH2_PYTHON")
LIMIT_S = 240

sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
import lanes  # noqa: E402
from crun_testing import alive, kill_all, scratch_dir, wait_for  # noqa: E402
from fabric import Fabric  # noqa: E402


class Case(unittest.TestCase):
    """What the cases share: a scratch directory, crun with a log directory there, the
    hang report's checks."""

    def setUp(self):
        self.dir = scratch_dir(self, "crun-hangs-")
        self.logs = os.path.join(self.dir, "logs")
        self.procs = []

    def tearDown(self):
        kill_all(self.procs)

    def env(self, python=None, **extra):
        e = dict(os.environ)
        # Only what the test gives: py-spy is found beside the workers' python or not at all.
        e["PATH"] = "/usr/bin:/bin"
        if python:
            e["PYTHON_EXEC"] = python
        e.update(extra)
        return e

    def crun(self, *args, python=None, env=None, nproc=2):
        cmd = [CRUN, "--nproc-per-node", str(nproc), "--log-dir", self.logs, *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT_S,
                              env=env or self.env(python))

    def hang_json(self, attempt=0):
        found = glob.glob(f"{self.logs}/*/*/attempt_{attempt}/hang.json")
        self.assertEqual(len(found), 1, found)
        with open(found[0]) as f:
            return json.load(f)

    def check_ddp_hang(self, r, world, tool):
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out[-5000:])
        hung = world - 1
        self.assertIn(f"rank {hung} on ", r.stderr)
        self.assertIn(f"rank {hung}: in `stuck_in_load_batch`", r.stderr)
        others = "0" if world == 2 else f"0-{world - 2}"
        self.assertRegex(r.stderr, rf"ranks? {others}: in `all_reduce`")
        for t in [tool] if isinstance(tool, str) else tool:
            self.assertIn(f"by {t}", r.stderr)
        self.assertRegex(r.stderr, r"restarting the worker group \(restart 1 of at most 1\): "
                         rf"rank {hung} \(local rank \d+\) on \S+ failed with a hang: "
                         "no progress for")
        for rank in range(world):
            self.assertIn(f"rank {rank} attempt 1 done", r.stdout)
        h = self.hang_json()
        self.assertEqual([x["rank"] for x in h["ranks"] if x["hung"]], [hung])
        self.assertEqual(h["summary"][0], f"rank {hung}: in `stuck_in_load_batch` <- `main` "
                         "<- `<module>`")
        self.assertEqual(len(h["stacks"]), world)
        for s in h["stacks"]:
            self.assertEqual(s["tool"], tool if isinstance(tool, str) else tool[s["rank"] == hung])
            self.assertTrue(os.path.exists(os.path.join(h["stacks_dir"], f"rank_{s['rank']}.txt")))

    def stacks(self, pid):
        self.last = subprocess.run([CRUN, "stacks", str(pid)], capture_output=True, text=True,
                                   timeout=LIMIT_S)
        return self.last


class TorchWorkers(Case):
    """Workers that import PyTorch while crun watches them (cold; warm, their template imported
    it before): one at a time, in a lane of their own."""
    own_lane = True

    def test_ddp_hang_torch_1_13_without_py_spy(self):
        r = self.crun("--hang-timeout", "5", "--max-restarts", "1", WORKER, "block", nproc=3,
                      python=TORCH1)
        # The hung rank (in time.sleep) answers crun's hook at a safe point; the others are
        # blocked in gloo's C++ and answer from the signal handler.
        self.check_ddp_hang(r, 3, ("faulthandler (signal handler)", "faulthandler"))

    def test_ddp_hang_torch_2_with_py_spy(self):
        if not TORCH2:
            self.skipTest("no PyTorch 2.x environment (scripts/setup-torch2.sh)")
        self.assertTrue(os.access(os.path.join(os.path.dirname(TORCH2), "py-spy"), os.X_OK),
                        "scripts/setup-torch2.sh installs py-spy beside the interpreter")
        r = self.crun("--hang-timeout", "5", "--max-restarts", "1", WORKER, "block",
                      python=TORCH2)
        self.check_ddp_hang(r, 2, "py-spy")

    def test_file_timer_expiry_is_a_hang(self):
        # torchrun's opt-in, unchanged: no --hang-timeout at all.
        env = self.env(TORCH1, TORCHELASTIC_ENABLE_FILE_TIMER="1")
        r = self.crun("--max-restarts", "1", WORKER, "timer", env=env)
        self.assertEqual(r.returncode, 0, r.stderr[-5000:])
        self.assertIn("rank 1 on ", r.stderr)
        # The scope is expires()'s caller as PyTorch computes it (1.13: contextlib's frame).
        self.assertRegex(r.stderr, r"torchelastic timer '[^']+#\d+' of pid \d+ expired")
        self.assertIn("rank 1: in `stuck_in_load_batch`", r.stderr)
        self.assertRegex(r.stderr,
                         r"rank 1 \(local rank 1\) on \S+ failed with a hang: torchelastic timer")
        self.assertIn("rank 1 attempt 1 done", r.stdout)
        self.assertEqual(glob.glob(f"{self.logs}/*/*/timer.pipe"), [])  # removed at the end

    def test_sigstopped_worker(self):
        r = self.crun("--hang-timeout", "5", "--max-restarts", "1", WORKER, "stop",
                      python=TORCH1)
        self.assertEqual(r.returncode, 0, r.stderr[-5000:])
        self.assertIn("stopped (T: SIGSTOP or SIGTSTP)", r.stderr)
        h = self.hang_json()
        stopped = [x for x in h["ranks"] if x["state"] == "T"]
        self.assertEqual([x["rank"] for x in stopped], [1])
        self.assertTrue(stopped[0]["hung"])
        self.assertIn("rank 1 attempt 1 done", r.stdout)

    def test_crun_stacks_on_a_running_job(self):
        p = subprocess.Popen([CRUN, "--nproc-per-node", "2", "--log-dir", self.logs, WORKER,
                              "block"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=self.env(TORCH1))
        try:
            # Asked again and again from the moment crun starts (while the workers import
            # torch, too): rank 1 is stuck once it says so; rank 0 then waits in all_reduce.
            # Nothing may crash meanwhile, crun or a worker.
            try:
                wait_for(lambda: self.stacks(p.pid).returncode == 0 and
                         "rank 1: in `stuck_in_load_batch`" in self.last.stdout and
                         "rank 0: in `all_reduce`" in self.last.stdout,
                         "crun stacks to show rank 1 stuck and rank 0 in all_reduce",
                         limit=LIMIT_S)
            except AssertionError as e:
                raise AssertionError(f"{e}; crun {'runs' if alive(p.pid) else 'ended'}; "
                                     f"last answer: {self.last.stdout[-3000:]}"
                                     f"{self.last.stderr[-2000:]}") from None
            self.assertIn("crun stacks: run ", self.last.stdout)
            by_dir = subprocess.run([CRUN, "stacks", "--log-dir", self.logs, "--json"],
                                    capture_output=True, text=True, timeout=LIMIT_S)
            self.assertEqual(by_dir.returncode, 0, by_dir.stderr)
            j = json.loads(by_dir.stdout)
            self.assertEqual(sorted(s["rank"] for s in j["stacks"]), [0, 1])
            self.assertTrue(alive(p.pid))  # reading stacks stops nothing
        finally:
            p.send_signal(signal.SIGTERM)
            p.communicate(timeout=LIMIT_S)
        gone = subprocess.run([CRUN, "stacks", str(p.pid)], capture_output=True, text=True,
                              timeout=LIMIT_S)
        self.assertEqual(gone.returncode, 1)
        self.assertIn(f"crun (pid {p.pid}) is not running here", gone.stderr)

    def test_a_hang_on_one_host_shows_every_hosts_ranks(self):
        """Two hosts (network namespaces, tests/pylib/fabric.py), two ranks each, stock PyTorch
        1.13 DDP over gloo: rank 3 blocks; every node's stacks are read through the rendezvous
        service, the report holds all four ranks, and `crun stacks --rdzv-endpoint` reads them
        too."""
        release = os.path.join(self.dir, "release")
        with Fabric(["a", "b"]) as fab:
            endpoint = f"{fab.addr('a')}:29400"
            # gloo binds to the interface named here, as users set it on real clusters. The
            # workers' output goes on through the hang until `release` exists (hang_worker.py's
            # HANG_WORKER_HOLD): crun's hang timeout starts to run once the stacks are read.
            env = dict(os.environ, PATH="/usr/bin:/bin", PYTHON_EXEC=TORCH1,
                       GLOO_SOCKET_IFNAME="eth0", HANG_WORKER_HOLD=release)
            for host in ("a", "b"):
                self.procs.append(fab.popen(
                    host, [CRUN, "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint",
                           endpoint, "--rdzv-id", "job", "--hang-timeout", "5",
                           "--max-restarts", "1", "--log-dir", os.path.join(self.dir, host),
                           WORKER, "block"],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
            stacks = fab.command("a", [CRUN, "stacks", "--rdzv-endpoint", endpoint,
                                       "--rdzv-id", "job", "--timeout", "30"])
            last = {}

            def every_host_read():
                last["r"] = subprocess.run(stacks, capture_output=True, text=True,
                                           timeout=LIMIT_S)
                return (last["r"].returncode == 0 and
                        "rank 3: in `stuck_in_load_batch`" in last["r"].stdout and
                        "ranks 0-2: in `all_reduce`" in last["r"].stdout)
            try:
                # While the job hangs, before the timeout: one call, both hosts' ranks.
                wait_for(every_host_read, "crun stacks --rdzv-endpoint to show rank 3 stuck "
                         "and ranks 0-2 in all_reduce", limit=LIMIT_S)
            except AssertionError as e:
                raise AssertionError(f"{e}; last answer: {last['r'].stdout[-3000:]}"
                                     f"{last['r'].stderr[-2000:]}") from None
            finally:
                with open(release, "w"):
                    pass  # the hang's silence starts now
            self.assertIn("4 ranks on 2 nodes", last["r"].stdout)
            out = {}
            for host, p in zip(("a", "b"), self.procs):
                o, e = p.communicate(timeout=LIMIT_S)
                out[host] = o + e
                self.assertEqual(p.returncode, 0, out[host][-5000:])
                self.assertEqual(o.count("attempt 1 done"), 2, out[host][-5000:])
        # Every rank falls silent at once, so both nodes may declare the hang; the first to
        # have every node's stacks prints them all (the other may be stopped before its own
        # request is answered, and then prints what it has).
        complete = [t for t in out.values() if "rank 3: in `stuck_in_load_batch`" in t and
                    "ranks 0-2: in `all_reduce`" in t]
        self.assertTrue(complete, "no report holds every host's ranks")
        found = glob.glob(f"{self.dir}/*/*/*/attempt_0/hang.json")
        ranks = []
        for path in found:
            with open(path) as f:
                ranks.append(sorted(s["rank"] for s in json.load(f)["stacks"]))
        self.assertIn([0, 1, 2, 3], ranks)
        # Whichever node's report reached the service first, the restart names rank 3.
        for text in out.values():
            m = re.search(r"restarting the worker group \(restart 1 of at most 1\): (rank \d) "
                          r".*failed with a hang: (.*)", text)
            self.assertTrue(m, text[-5000:])
            self.assertTrue(m.group(1) == "rank 3" or "it waits for rank 3 on " in m.group(2),
                            m.group(0))


class QuietWorkers(Case):
    """Workers that import nothing heavy (native SDK workers, stdlib Python; warm, their
    template imports PyTorch before crun watches them): beside TorchWorkers."""

    def test_nccl_flight_recorder_is_asked_to_dump_on_every_rank(self):
        # PyTorch's side needs NCCL (a GPU); fr_listener.py listens on the same pipes the same
        # way, so that what crun does is checked here: it writes to every rank's pipe before
        # anything is stopped, waits for the traces to be written, says where they are, and
        # names a rank without a pipe.
        prefix = os.path.join(self.dir, "fr_")
        listener = os.path.join(HERE, "..", "workers", "fr_listener.py")
        env = self.env(TORCH1, TORCH_NCCL_DEBUG_INFO_PIPE_FILE=prefix,
                       TORCH_NCCL_DEBUG_INFO_TEMP_FILE=os.path.join(self.dir, "trace_"))
        # 3 s: every rank must have made its pipe before the hang (their starts run beside
        # TorchWorkers' imports).
        r = self.crun("--hang-timeout", "3", listener, self.dir, "--no-pipe-on-rank", "2",
                      env=env, nproc=3)
        self.assertNotEqual(r.returncode, 0)
        for rank in (0, 1):
            with open(os.path.join(self.dir, f"trace_{rank}")) as f:
                self.assertEqual(f.read(), "asked with '1\\n'\nthe rest of the trace\n")
        self.assertFalse(os.path.exists(os.path.join(self.dir, "trace_2")))
        self.assertIn("NCCL flight recorder: every trace written (2 files)", r.stderr)
        self.assertIn(f"NCCL flight recorder: dump asked of ranks 0-1 (written to {prefix}<rank>.pipe);"
                      f" PyTorch writes it to {os.path.join(self.dir, 'trace_')}<rank>", r.stderr)
        self.assertIn(f"NCCL flight recorder: ranks 2 have no open {prefix}<rank>.pipe", r.stderr)
        self.assertIn("parked_for_the_trigger", r.stderr)

    def test_native_worker_heartbeats(self):
        # Silent but for its heartbeats: never hung while it works (attempt 1: 300 steps), hung
        # at once when rank 2 stops beating. 5 s, as the PyTorch cases: its start, silent until
        # the first step's heartbeat, runs beside TorchWorkers' imports.
        r = self.crun("--hang-timeout", "5", "--max-restarts", "1", NATIVE, "300", nproc=3)
        self.assertEqual(r.returncode, 0, r.stderr[-5000:])
        self.assertIn("rank 2: in `StuckInLoadBatch` <- `main`", r.stderr)
        self.assertIn("ranks 0-1: in `crun::worker::", r.stderr)
        self.assertRegex(r.stderr, r"by (eu-stack|gdb)")
        self.assertEqual(r.stderr.count("is hung"), 3)  # the first attempt only
        self.assertRegex(r.stderr, r"restarting the worker group \(restart 1 of at most 1\): "
                         r"rank 2 \(local rank 2\) on \S+ failed with a hang")
        for rank in range(3):
            self.assertIn(f"rank {rank} attempt 1 done", r.stdout)

    def test_hang_with_no_restart_left_is_the_jobs_failure(self):
        # 3 s: rank 0 must not be silent that long before rank 1 blocks (its start runs beside
        # TorchWorkers' imports).
        r = self.crun("--hang-timeout", "3", NATIVE, "5")
        self.assertEqual(r.returncode, 128 + signal.SIGTERM, r.stderr[-5000:])
        self.assertIn("Root cause (first failure):", r.stderr)
        self.assertIn("  hang      : no progress for", r.stderr)
        self.assertIn("(stopped by crun)", r.stderr)
        found = glob.glob(f"{self.logs}/*/*/failure.json")
        self.assertEqual(len(found), 1)
        with open(found[0]) as f:
            report = json.load(f)
        self.assertEqual(report["failures"][0]["rank"], 1)
        self.assertTrue(report["failures"][0]["hang"].startswith("no progress for"))
        self.assertEqual(report["hang"]["summary"][0],
                         "rank 1: in `StuckInLoadBatch` <- `main` <- `__libc_start_call_main`")

    def test_busy_worker_is_not_hung(self):
        script = os.path.join(self.dir, "busy.py")
        with open(script, "w") as f:
            f.write("import time\n"
                    "for i in range(200):\n"
                    "    print('step', i, flush=True)\n"
                    "    time.sleep(0.05)\n")
        # Steps every 50 ms for twice the timeout; the timeout leaves a warm worker's start and
        # exit room on a starved machine (2 s did not: both ranks were called hung at once,
        # one still in torch's set-up, one in its exit handlers, beside the loaded suite).
        r = self.crun("--hang-timeout", "5", script, python=TORCH1)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("hung", r.stderr)
        self.assertEqual(r.stdout.count("step 199"), 2)

    def test_bad_input(self):
        for value in ("abc", "-1", "1e12"):
            r = self.crun("--hang-timeout", value, NATIVE, "5")
            self.assertNotEqual(r.returncode, 0, r.stderr)
            self.assertIn(f"--hang-timeout '{value}'", r.stderr)
        precious = os.path.join(self.dir, "precious.txt")
        with open(precious, "w") as f:
            f.write("someone's data\n")
        env = self.env(TORCHELASTIC_ENABLE_FILE_TIMER="1", TORCHELASTIC_TIMER_FILE=precious)
        r = self.crun(NATIVE, "5", env=env)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn(f"TORCHELASTIC_TIMER_FILE={precious} exists and is not a named pipe",
                      r.stderr)
        with open(precious) as f:
            self.assertEqual(f.read(), "someone's data\n")
        for bad in (["stacks"], ["stacks", "12x"], ["stacks", "--log-dir", "/nonexistent"],
                    ["stacks", "1", "--log-dir", self.dir]):
            r = subprocess.run([CRUN, *bad], capture_output=True, text=True, timeout=LIMIT_S)
            self.assertEqual(r.returncode, 2, (bad, r.stderr))
            self.assertIn("crun stacks:", r.stderr)

    def test_crun_stacks_refusals_through_the_service(self):
        with Fabric(["a"]) as fab:
            def stacks(*args):
                return subprocess.run(fab.command("a", [CRUN, "stacks", *args]),
                                      capture_output=True, text=True, timeout=LIMIT_S)
            r = stacks("--rdzv-endpoint", f"{fab.addr('a')}:29400")
            self.assertEqual(r.returncode, 2)
            self.assertIn("--rdzv-endpoint needs --rdzv-id", r.stderr)
            r = stacks("--rdzv-endpoint", f"{fab.addr('a')}:29400", "--rdzv-id", "job",
                       "--timeout", "2")
            self.assertEqual(r.returncode, 1)
            self.assertIn(f"no answer from the rendezvous service at {fab.addr('a')}:29400",
                          r.stderr)
            r = stacks("--rdzv-endpoint", "no such host:1", "--rdzv-id", "job")
            self.assertEqual(r.returncode, 2)
            self.assertIn("no such host:1", r.stderr)


def memory_cgroup_parent():
    """Where this process may make a memory-limited cgroup: ("v2", dir) when cgroup v2 has the
    memory controller, ("v1", dir) for a v1 memory hierarchy, else None."""
    with open("/proc/self/cgroup") as f:
        lines = [line.strip().split(":", 2) for line in f]
    for _, controllers, path in lines:
        if "memory" in controllers.split(","):
            d = "/sys/fs/cgroup/memory" + path
            if os.path.isdir(d) and os.access(d, os.W_OK):
                return "v1", d
    for _, controllers, path in lines:
        if controllers == "":
            d = "/sys/fs/cgroup" + path
            try:
                with open("/sys/fs/cgroup/cgroup.controllers") as f:
                    has_memory = "memory" in f.read().split()
            except OSError:
                has_memory = False
            if has_memory and os.access(d, os.W_OK):
                return "v2", d
    return None


class OomKiller(unittest.TestCase):
    """A worker that allocates past a memory limit set on a real cgroup, killed by the kernel's
    OOM killer: crun says so, with its RSS, instead of an anonymous SIGKILL."""

    def test_oom_kill_is_reported_as_such(self):
        found = memory_cgroup_parent()
        if found is None:
            self.skipTest("no writable memory cgroup (v1 or v2) on this machine")
        version, parent = found
        cg = tempfile.mkdtemp(prefix="crun-oom-", dir=parent)
        d = scratch_dir(self, "crun-oom-")
        try:
            limit = str(96 << 20)
            if version == "v1":
                with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
                    f.write(limit)
                swap = os.path.join(cg, "memory.memsw.limit_in_bytes")
                if os.path.exists(swap):
                    with open(swap, "w") as f:
                        f.write(limit)
            else:
                with open(os.path.join(cg, "memory.max"), "w") as f:
                    f.write(limit)
                with open(os.path.join(cg, "memory.swap.max"), "w") as f:
                    f.write("0")
            script = os.path.join(d, "alloc.py")
            with open(script, "w") as f:
                f.write("held = []\n"
                        "for i in range(64):\n"
                        "    held.append(b'x' * (16 << 20))  # touched: every page is used\n"
                        "print('allocated 1 GiB: the limit did not hold', flush=True)\n")
            cmd = ["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh", CRUN,
                   "--nproc-per-node", "1", "--log-dir", os.path.join(d, "logs"), script]
            env = dict(os.environ, PYTHON_EXEC=sys.executable)
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT_S, env=env)
            self.assertEqual(r.returncode, 128 + signal.SIGKILL, r.stdout + r.stderr)
            self.assertIn("signal 9 (SIGKILL): killed by the OOM killer (", r.stderr)
            found = glob.glob(f"{d}/logs/*/*/failure.json")
            self.assertEqual(len(found), 1)
            with open(found[0]) as f:
                failure = json.load(f)["failures"][0]
            self.assertTrue(failure["oom"].startswith("killed by the OOM killer ("), failure)
            if "kernel log" in failure["oom"]:
                self.assertRegex(failure["oom"], r"RSS \d+ MiB")
        finally:
            def empty():
                with open(os.path.join(cg, "cgroup.procs")) as f:
                    return not f.read().strip()
            wait_for(empty, "the test cgroup to empty")
            os.rmdir(cg)


if __name__ == "__main__":
    # TorchWorkers in a lane of its own; the other classes' cases one at a time beside it.
    lanes.main(1)
