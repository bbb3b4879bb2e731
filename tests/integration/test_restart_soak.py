"""The restart soak (docs/reliability.md, "The attempt's edge"): N consecutive restarts, the
worker failing on a different rank each attempt, with workers that leave processes behind the
way real jobs do (children in their group, multiprocessing and DataLoader workers, daemonised
grandchildren, SIGTERM ignored, an exit racing the stop). Every attempt must run to its end:
each rank of each attempt starts, the failing rank fails, and no process of an earlier attempt
of the node is still there when an attempt starts. Then the restart count, the exit code, the
words crun used and what is left (nothing) are checked.

Configurations: standalone with crun's cgroups and without them (CRUN_CGROUP=0), standalone
with a health gate before every join (docs/health.md), two agents on
the rendezvous service, two agents on a real etcd, and two nodes of the static backend that
exchange --contract's ports over node 0's store (each restarting with the other).

How many restarts: SOAK_COUNTS picks a table, `ci` (the default: every CI run) or `full` (the
bench, tests/bench/matrix_bench.py, whose last run docs/reliability.md records); SOAK_SCALE
(1) scales it. SOAK_LANES (1) runs that many cases at once (tests/pylib/lanes.py): each case
has its own tag, directory, crun and cgroup, and checks only what carries its tag. A run that
writes the figures (CRUN_SOAK_DOC) runs one at a time, so that each case's rate is its own."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from bench_support import measured_at, write_section  # noqa: E402
from crun_testing import free_port, kill_all, proc_files, whole_lines  # noqa: E402
from etcd_cluster import EtcdCluster, missing_programs  # noqa: E402
from fabric import Fabric  # noqa: E402
import lanes  # noqa: E402

CRUN = os.environ["CRUN_BIN"]
PYTHON = os.environ.get("PYTHON_EXEC", "/usr/bin/python3")
SHELL_WORKER = os.path.join(HERE, "..", "workers", "soak_worker.sh")
PY_WORKER = os.path.join(HERE, "..", "workers", "soak_worker.py")
SCALE = float(os.environ.get("SOAK_SCALE", "1"))
# Restarts per run, by table. `full`: one node 200 (every worker kind, warm ones too), the cold
# DataLoader's 200 (torch imported in every worker of every attempt: about 1 s an attempt alone;
# beside other suites, 200 each took 1,269 s of a fresh-clone CI run here); two nodes what fits
# in about 60 s on a 2-core machine (15.0 and 11.9 restarts/s through the service and etcd at
# the commit docs/reliability.md names). `ci`: an eighth to a quarter of those where an attempt
# is cheap (25-100 ms: 725 restarts in all, 50 or more a case; a leak that every restart adds
# shows within 50: e6381e4's failed every cgroup case by then), an eighth where it is not: 25
# for SIGTERM-ignoring workers, whose every attempt waits out the 0.1 s grace, and 25 for warm
# Python workers (the warm twin), whose every attempt forks and ends processes that map torch
# (95-180 ms an attempt); and 5 for each cold DataLoader case (about 1 s an attempt: both ranks
# fail at least twice). The bench (`full`) runs each of those 200 times.
COUNTS = {
    "full": {"one": 200, "ignore-term": 200, "warm": 200, "dataloader": 200, "service": 800,
             "etcd": 600, "static": 400},
    "ci": {"one": 50, "ignore-term": 25, "warm": 25, "dataloader": 5, "service": 100, "etcd": 75,
           "static": 50},
}
COUNTS_NAME = os.environ.get("SOAK_COUNTS", "ci")
if COUNTS_NAME not in COUNTS:
    sys.exit(f"test_restart_soak.py: SOAK_COUNTS={COUNTS_NAME}: expected ci or full")
RESTARTS = COUNTS[COUNTS_NAME]
LANES = 1 if os.environ.get("CRUN_SOAK_DOC") else int(os.environ.get("SOAK_LANES", "1"))
LIMIT_S = 600
# A DataLoader attempt imports torch in 2 workers, each with 2 loader children: 200 attempts took
# 170 s at 62858bf, and more than 600 s on a machine half as fast. They have a ctest entry of their
# own (tests/integration/CMakeLists.txt), so that they do not share the others' time.
DATALOADER_LIMIT_S = 1500
LEFT_GROUP = "had left their worker's process group"
MEASURED_AT = measured_at()  # before the run
ROWS = []  # (case, restarts, workers, seconds, left): the table CRUN_SOAK_DOC=FILE receives


def restarts(kind):
    return max(2, int(RESTARTS[kind] * SCALE))


def tagged_processes(tag):
    """Processes whose environment carries SOAK_TAG=tag (every worker and what it started)."""
    needle = f"SOAK_TAG={tag}".encode()
    return [pid for pid, env in proc_files("environ") if needle in env.split(b"\0")]


def cgroup2_dir_of(pid):
    """Where crun `pid` makes its cgroup (agent/supervise/worker_cgroup.cc), or None without cgroup2."""
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split() for line in f]
    mount = next((m[4] for m in mounts if m[m.index("-") + 1] == "cgroup2"), None)
    if mount is None:
        return None
    with open("/proc/self/cgroup") as f:
        own = next((line[3:].strip() for line in f if line.startswith("0::")), "/")
    return os.path.join(mount + ("" if own == "/" else own), f"crun-{pid}")


class RestartSoak(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="crun-soak-")
        self.tag = uuid.uuid4().hex
        self.procs = []
        self.t0 = time.monotonic()

    def tearDown(self):
        kill_all(self.procs)
        shutil.rmtree(self.dir, ignore_errors=True)

    def crun(self, node, args, kind, last, env=(), wrap=None):
        # Python workers as users start them (crun runs PYTHON_EXEC -u script), so that with
        # PET_WARM=1 (its warm twin, tests/warm_variant.py) they are forked from the template.
        worker = [PY_WORKER] if kind in ("multiprocessing", "dataloader") else \
            ["--no-python", SHELL_WORKER]
        # TMPDIR: a SIGKILLed Python worker leaves its multiprocessing pymp-* directory behind
        # (thousands in a run); they go with the test's directory.
        e = dict(os.environ, SOAK_OUT=self.dir, SOAK_KIND=kind, SOAK_TAG=self.tag,
                 SOAK_NODE=node, SOAK_LAST=str(last), PYTHON_EXEC=PYTHON, TMPDIR=self.dir,
                 **dict(env))
        # Into a file, not a pipe: hundreds of restarts write more than a pipe holds, and a crun
        # blocked on a full pipe that nobody reads stops keeping its etcd lease alive.
        err = open(os.path.join(self.dir, f"crun-{node}.err"), "w")
        # Its workers fail the same way hundreds of times before any step, by design: not a
        # crash loop here (--max-restarts-without-progress 0; docs/health.md).
        command = [CRUN, "--max-restarts", str(last), "--shutdown-timeout", "0.1",
                   "--max-restarts-without-progress", "0", *args, *worker]
        p = subprocess.Popen(wrap(command) if wrap else command, env=e,
                             stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        err.close()
        p.err_path = err.name
        # A crun in a network namespace sees no cgroup2 (ip netns exec mounts a fresh /sys), so
        # it makes none, nor does one with CRUN_CGROUP=0: a crun-<pid> there would be another
        # crun's, from before the pid came round again.
        makes_one = not wrap and ("CRUN_CGROUP", "0") not in env
        p.cgroup_dir = cgroup2_dir_of(p.pid) if makes_one else None
        self.procs.append(p)
        return p

    def finish(self, procs, last, world, kind):
        outs = []
        limit = DATALOADER_LIMIT_S if kind == "dataloader" else LIMIT_S
        for p in procs:
            try:
                p.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                self.fail(f"crun still running after {limit} s; events:\n"
                          + "\n".join(whole_lines(self.events_path())[-20:]))
            with open(p.err_path) as f:
                outs.append((p.cgroup_dir, p.returncode, f.read()))
        took = time.monotonic() - self.t0
        tails = "\n".join(f"--- crun {p.pid} exited {rc} ---\n{err[-3000:]}"
                          for p, (_, rc, err) in zip(procs, outs))
        for d, rc, err in outs:
            self.assertEqual(rc, 0, tails)
            self.assertEqual(len(re.findall(r"restarting the worker group \(restart \d+ of",
                                            err)), last, tails)
            self.assertIn(f"(restart {last} of at most {last})", err, tails)
            self.assertEqual(tagged_processes(self.tag), [], "left running after crun exited")
            self.assertFalse(d is not None and os.path.exists(d), f"{d} left behind")
            # Children that stayed in their worker's group end with it: no warning. Those that
            # left it (setsid) are named, once per attempt.
            warned = err.count(LEFT_GROUP)
            self.assertEqual(warned, last + 1 if kind == "daemon" else 0, tails)
        self.check_attempts(last, world)
        # The figures docs/reliability.md quotes.
        ROWS.append((self.id().rsplit(".", 1)[-1][5:], last, world, took,
                     len(tagged_processes(self.tag))))
        print(f"soak {self.id().rsplit('.', 1)[-1]}: {last} restarts of {world} workers in "
              f"{took:.1f} s ({last / took:.1f} restarts/s), {len(tagged_processes(self.tag))} "
              f"processes left", file=sys.stderr)

    def events_path(self):
        return os.path.join(self.dir, "events.log")

    def check_attempts(self, last, world):
        lines = [line.split() for line in whole_lines(self.events_path())]
        bad = [" ".join(e) for e in lines if e[0] in ("overlap", "timeout")]
        self.assertEqual(bad, [], "an attempt overlapped an earlier one, or never ran whole")
        for a in range(last + 1):
            started = sorted(int(e[2]) for e in lines if e[0] == "start" and int(e[1]) == a)
            self.assertEqual(started, list(range(world)), f"attempt {a}: ranks started")
            if a < last:
                failed = [int(e[2]) for e in lines if e[0] == "fail" and int(e[1]) == a]
                self.assertEqual(failed, [a % world], f"attempt {a}: the failing rank")
        done = sorted(int(e[2]) for e in lines if e[0] == "done")
        self.assertEqual(done, list(range(world)), "the last attempt's ranks succeeded")
        self.assertEqual(max(int(e[1]) for e in lines), last, "no attempt beyond the last")

    @classmethod
    def tearDownClass(cls):
        doc = os.environ.get("CRUN_SOAK_DOC")
        if not doc or not ROWS:
            return
        scale = "" if SCALE == 1 else f" with SOAK_SCALE={SCALE:g}"
        # Its warm twin (tests/warm_variant.py) writes a table of its own.
        warm = os.environ.get("PET_WARM") == "1"
        command = "python3 tests/integration/test_restart_soak.py"
        if warm:
            command = (f"python3 tests/warm_variant.py -- {command} -k multiprocessing "
                       f"-k dataloader")
        command = f"SOAK_COUNTS={COUNTS_NAME} {command}"
        rows = [f"`CRUN_SOAK_DOC=docs/reliability.md {command}`{scale}. {MEASURED_AT}", "",
                "| case | restarts | workers | time | restarts/s | processes left |",
                "|---|---|---|---|---|---|"]
        rows += [f"| {case.replace('_', ' ')} | {n} | {w} | {t:.1f} s | {n / t:.1f} | {left} |"
                 for case, n, w, t, left in sorted(ROWS)]
        write_section(doc, "soak-warm" if warm else "soak", rows)

    # ---- one node -----------------------------------------------------------------------

    def one_node(self, kind, cgroup=True):
        # Python workers are forked from the template in the warm twin (PET_WARM=1); cold,
        # DataLoader workers import torch every attempt.
        warm = kind in ("multiprocessing", "dataloader") and os.environ.get("PET_WARM") == "1"
        last = restarts("warm" if warm else
                        kind if kind in ("dataloader", "ignore-term") else "one")
        env = () if cgroup else (("CRUN_CGROUP", "0"),)
        p = self.crun("n", ["--standalone", "--nproc-per-node", "2"], kind, last, env)
        self.finish([p], last, 2, kind)

    def test_one_node_with_a_health_check_before_every_join(self):
        """The health gate (docs/health.md) on the restart path: a check that passes and counts
        itself, with disk and memory, before each of the restarts; none may be lost."""
        last = restarts("one")
        gates = os.path.join(self.dir, "gates")
        p = self.crun("n", ["--standalone", "--nproc-per-node", "2", "--health-check",
                            f"echo gate >> {gates}", "--health-check", "disk:1M",
                            "--health-check", "memory:1M"], "daemon", last)
        self.finish([p], last, 2, "daemon")
        self.assertEqual(len(whole_lines(gates)), last + 1, "a join without its gate")

    # ---- two nodes ----------------------------------------------------------------------

    def test_two_agents_on_the_rendezvous_service(self):
        last = restarts("service")
        port = free_port()
        procs = []
        for node in ("a", "b"):
            conf = f"node_id={node},is_host={int(node == 'a')}"
            procs.append(self.crun(node, ["--nnodes", "2", "--nproc-per-node", "2",
                                          "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
                                          "soak", "--rdzv-conf", conf], "daemon", last))
        self.finish(procs, last, 4, "daemon")

    def test_two_static_nodes_exchanging_ports(self):
        """torchrun's static backend with --contract tensorflow: ports go through node 0's
        store, and a node whose peer began the next round restarts its group with it."""
        last = restarts("static")
        port = str(free_port())
        procs = [self.crun(node, ["--nnodes", "2", "--nproc-per-node", "2", "--node-rank", rank,
                                  "--master-addr", "127.0.0.1", "--master-port", port,
                                  "--contract", "tensorflow"], "daemon", last)
                 for node, rank in (("b", "1"), ("a", "0"))]
        self.finish(procs, last, 4, "daemon")

    def test_two_agents_on_etcd(self):
        missing = missing_programs()
        if missing:
            self.skipTest(f"not installed: {', '.join(missing)}")
        last = restarts("etcd")
        # etcd, both agents and their workers in a network namespace of their own: etcd's
        # ports are fixed there, so no other test's connection can take one before etcd binds
        # it (a port found free on the machine's loopback can be gone a moment later).
        with Fabric(["e"]) as fab, \
                EtcdCluster(fab, ["e"], os.path.join(self.dir, "etcd")) as etcd:
            procs = [self.crun(node, ["--nnodes", "2", "--nproc-per-node", "2",
                                      "--rdzv-backend", "etcd-v3", "--rdzv-endpoint",
                                      etcd.endpoints(), "--rdzv-id", "soak", "--rdzv-conf",
                                      "heartbeat_timeout=2,last_call_timeout=0.2"],
                               "daemon", last, wrap=lambda cmd: fab.command("e", cmd))
                     for node in ("a", "b")]
            self.finish(procs, last, 4, "daemon")


# One node: every kind of worker, with crun's cgroups and without (CRUN_CGROUP=0), as
# test_<kind> and test_<kind>_without_cgroup.
# SOAK_SKIP_COLD=kind,...: those kinds are left to another ctest entry, unless the workers are
# warm (PET_WARM=1, the warm twin), where they are quick.
_SKIPPED = set() if os.environ.get("PET_WARM") == "1" else \
    set(filter(None, os.environ.get("SOAK_SKIP_COLD", "").split(",")))
for _kind in ("shell", "daemon", "ignore-term", "exit-at-stop", "multiprocessing", "dataloader"):
    if _kind in _SKIPPED:
        continue
    for _cgroup in (True, False):
        _name = f"test_{_kind.replace('-', '_')}" + ("" if _cgroup else "_without_cgroup")
        setattr(RestartSoak, _name, lambda self, k=_kind, c=_cgroup: self.one_node(k, c))


if __name__ == "__main__":
    lanes.main(LANES)
