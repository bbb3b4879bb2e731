"""The configuration matrix (docs/reliability.md, "The configuration matrix"): real crun
processes over a generated table of dimensions, not hand-picked cases.

  full      backend x contract set x workers a node, every combination, with a shell worker
            (cold starts, crun's cgroups where the machine has them)
  pairwise  backend x contract set x workers a node x start (cold, warm) x cgroups (on, off)
            x the snapshot store (on, off), with a Python worker: a set of cases in which every
            pair of values of any two dimensions meets at least once (a greedy covering array,
            the same every run). With the store on, each rank saves a snapshot and fails, and
            after the restart every rank loads its own back (docs/checkpoints.md); only those
            cases' workers import torch, and their interpreter is PYTHON_EXEC. Every other
            Python worker here (the store off, crash loops, the health gate) runs a Python
            without torch (Matrix.torchless), so that a warm case's template, which imports
            torch where its interpreter has it (docs/warm.md), does not.
  snapshot  backend x start x the snapshot store, every combination, with the Python worker
  crashloop backend x start x how the worker fails (at import every time, or after a step),
            every combination (docs/health.md): a worker that fails at import in every attempt
            ends the job after --max-restarts-without-progress attempts with exit code 86 and
            the crash loop's words, though restarts remain; the same failure after a step
            heartbeat is no crash loop, and ends the job after --max-repeated-failures attempts
            (a job setting every backend honours: static nodes each weigh it), exit code 86
  health    backend x start x the health gate's verdict, every combination (docs/health.md):
            with checks that pass (a command, disk, memory) on every node the job runs whole;
            with one node's check failing, that node exits 87 having run nothing, and the other
            forms a smaller round (service, etcd: --nnodes 1:2) or, on the static backend, waits
            for it until join_timeout and fails naming it
  straggler backend x start x which ranks are slow (the last rank; every rank of the last node)
            x --straggler-action (warn, restart, exclude), every combination (docs/health.md, "Slow
            ranks"): a rank that computes 2.5 times longer is named by the node that runs it and
            no other rank is; a slow node is named where the comparison is job-wide (the
            service, etcd) and, where a node's ranks are compared among themselves (static, one
            node), nobody is. With restart, the rank named is stopped as failed, one restart is
            spent and the job ends well in the second attempt. With exclude, the node whose
            rank is named leaves with exit 87 and a spare runs its ranks to the end (service,
            etcd); the backends that cannot go on without a node (--standalone, static) refuse
            exclude at parse time, starting nothing

Each case checks that every crun exits 0, every rank's environment (ranks unique and complete,
TF_CONFIG of the world's size with the rank's own index, one JAX coordinator, Horovod's ranks
and sizes, DeepSpeed's and the MPI-style ones, and no variable of a contract not asked for),
how each worker started (warm or cold, by tests/pylib/warm_witness) and that nothing is left
running.

Two covers. `full` runs each family as listed above: the product of its dimensions (the
pairwise family: its 40 cases); tests/bench/matrix_bench.py runs it and records the run in
docs/reliability.md. `ci` (the default; every CI run) runs, for each family, a pairwise cover
of that family's own dimensions (the same greedy pairwise(), ties going to the cheaper case,
and for the pairwise family a case's estimated seconds weighed against the pairs it meets:
the same every run), checked to meet every pair, plus a seeded random sample of K more cases
from the rest of the family's product. The seed changes each run unless given; the first line
of output names it and the command that runs the sampled cases again, and each sampled case's
name ends in _seed<SEED>.

Protocol timeouts are short here, through the flags users have (--rdzv-conf): the cases prove
the features on every backend, not crun's defaults, which are each proven once elsewhere (see
FAST_CONF).

  test_matrix.py [-k PATTERN] [--families F,...] [--cover ci|full] [--sample K] [--seed N]
                 [--list]
      --families runs those families' cases only (ctest runs the straggler family, the longest,
      as a test of its own); --sample K: K sampled cases a family (2; ci only); --seed N
      (else $CRUN_MATRIX_SEED, else a random one); --list prints each family's case counts
      and estimated seconds, and the cover's cases and the pairs they meet (every one, or it
      exits 1), with the sample of that seed under ci"""
import itertools
import json
import os
import random
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from crun_testing import free_port, kill_all, processes_mentioning, wait_for, whole_lines  # noqa: E402
from etcd_cluster import EtcdCluster, Loopback, missing_programs  # noqa: E402
import lanes  # noqa: E402

CRUN = os.environ.get("CRUN_BIN", "crun")
PYTHON = os.environ.get("PYTHON_EXEC", sys.executable)
WORKERS = os.path.join(HERE, "..", "workers")
SHELL_WORKER = os.path.join(WORKERS, "env_dump.sh")
PYTHON_WORKER = os.path.join(WORKERS, "env_dump.py")
CRASH_WORKER = os.path.join(WORKERS, "crash_loop.py")
STRAGGLER_WORKER = os.path.join(WORKERS, "straggler_worker.py")
WITNESS = os.path.join(HERE, "..", "pylib", "warm_witness")
CASE_LIMIT_S = 60  # one case's crun processes, start to end

# The dimensions. A contract set is one value: each contract alone, the pairs and the triple of
# the three that reserve ports, and every contract at once.
BACKENDS = ("local", "static", "service", "etcd")
CONTRACT_SETS = ("tensorflow", "jax", "horovod", "deepspeed", "mpi", "tensorflow,jax",
                 "jax,horovod", "tensorflow,horovod", "tensorflow,jax,horovod",
                 "torch,tensorflow,jax,horovod,deepspeed,mpi")
NPROCS = (1, 2, 3)
STARTS = ("cold", "warm")
CGROUPS = ("cgroup", "no-cgroup")
SNAPSHOTS = ("snapshots", "no-snapshots")
CRASH_MODES = ("import", "steps")  # how the crash-loop worker fails
HEALTH_VERDICTS = ("passes", "fails")
PASSING_CHECKS = ("--health-check", "true", "--health-check", "disk", "--health-check", "memory:1M")
FAILING_CHECK = ("--health-check", "echo sick disk >&2; exit 3")
SLOW = ("rank", "node")  # which ranks compute longer: the last one, or the last node's
JOB_WIDE = ("service", "etcd")  # the backends whose slow ranks are judged among the whole job's
STRAGGLER_ACTIONS = ("warn", "restart", "exclude")
NAMED = re.compile(r"slow rank on \S+ \(local rank (\d+)\): rank (\d+): [\d.]+x the others' ")
PAIRWISE_DIMS = (BACKENDS, CONTRACT_SETS, NPROCS, STARTS, CGROUPS, SNAPSHOTS)
COVERS = ("ci", "full")
DEFAULT_SAMPLE = 2  # sampled cases a family, beyond the ci cover
SEED_VARIABLE = "CRUN_MATRIX_SEED"
# Protocol timeouts through --rdzv-conf, the flag users have, where a case waits on one. The
# slow ranks' figures and verdicts travel with the heartbeats: every 250 ms on the service
# (heartbeat_timeout stays at its 3 s default), and with the etcd lease's keep-alive, a third
# of its TTL (heartbeat_timeout=2: every 667 ms). The static health case waits join_timeout
# for the node that stayed out: 1 s. Each default is proven once elsewhere: the service's
# heartbeats at their defaults carrying slow ranks' figures by test_stragglers.py (AcrossHosts);
# etcd's lease at its default TTL by every other etcd case here; the last call's default (1 s)
# by the health family's failing cases on the service and etcd, which keep it; join_timeout's
# (600 s, not waited on) by tests/unit/service/proto_messages_test.cc and rules_test.cc.
FAST_CONF = {"service": "heartbeat_interval=0.25", "etcd": "heartbeat_timeout=2"}
STATIC_JOIN_TIMEOUT_S = 1
TORCH_IMPORT_S = 1.3  # one `import torch` (Debian's 1.13) on the 2-core CI machine
# What meeting one more pair is worth in the pairwise family's ci cover: a case that costs
# more than that many seconds a pair it meets gives way to cheaper ones (pairwise()). At 3 s
# its snapshot cases take warm starts and one node where the pairs allow: 17 imports of torch
# in 40 cases, where ties alone took 26 (and 2 s would take 42 cases, more than `full`).
PAIRWISE_SECONDS_A_PAIR = 3.0

# The variables each contract adds (agent/frameworks/contracts.cc, docs/frameworks.md): a case checks
# that those of a contract not asked for are absent.
CONTRACT_VARIABLES = {
    "tensorflow": ("TF_CONFIG",),
    "jax": ("JAX_COORDINATOR_ADDRESS",),
    "horovod": ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_GLOO_RENDEZVOUS_PORT"),
    "deepspeed": ("LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE"),
    "mpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
}


def pairwise(dims, cost=None, seconds_a_pair=None):
    """Cases (tuples, one value a dimension) in which every pair of values of any two dimensions
    appears at least once: greedy, each step the combination that covers the most pairs not yet
    covered (ties: the cheaper by `cost`, a case's estimated time, when given; then the first in
    product order), so the list is the same every run. With `seconds_a_pair` (and `cost`), each
    step takes the combination whose pairs not yet covered, less its cost in units of
    `seconds_a_pair`, count most, among those that cover one at least."""
    def pairs_of(case):
        return {(i, case[i], j, case[j]) for i, j in itertools.combinations(range(len(dims)), 2)}

    def worth(case):
        new = len(pairs_of(case) & uncovered)
        if not new:
            return (float("-inf"), 0)
        if cost is None:
            return (new, 0)
        return (new - (cost(case) / seconds_a_pair if seconds_a_pair else 0), -cost(case))

    uncovered = set()
    for i, j in itertools.combinations(range(len(dims)), 2):
        uncovered |= {(i, a, j, b) for a in dims[i] for b in dims[j]}
    candidates = list(itertools.product(*dims))
    cases = []
    while uncovered:
        best = max(candidates, key=worth)
        cases.append(best)
        uncovered -= pairs_of(best)
    return cases


def unmet_pairs(dims, cases):
    """The pairs (dimension i, value, dimension j, value) that no case of `cases` meets."""
    met = {(i, c[i], j, c[j]) for c in cases
           for i, j in itertools.combinations(range(len(dims)), 2)}
    return [(i, a, j, b) for i, j in itertools.combinations(range(len(dims)), 2)
            for a in dims[i] for b in dims[j] if (i, a, j, b) not in met]


def torchless_python(root):
    """An interpreter without torch for the Python workers that save no snapshot: a venv of
    PYTHON's made without its site-packages and without pip (tens of milliseconds). A warm
    case's template imports torch where its interpreter has it (docs/warm.md), about 1.3 s of
    a core a node that these workers never use; warm templates with torch are the snapshot
    cases' here, and test_warm.py's. PYTHON itself, saying so, where no venv can be made."""
    venv = os.path.join(root, "torchless")
    made = subprocess.run([PYTHON, "-m", "venv", "--without-pip", venv], capture_output=True,
                          text=True, timeout=60)
    python = os.path.join(venv, "bin", "python")
    if made.returncode == 0 and os.path.exists(python):
        return python
    print(f"test_matrix.py: no venv of {PYTHON} ({made.stderr.strip()[-300:]}): every Python "
          "worker runs it, torch and all", file=sys.stderr, flush=True)
    return PYTHON


def full_cases():
    # The store as crun starts by default (on, unused by the shell worker).
    return [(b, c, n, "cold", "cgroup", "default") for b, c, n in
            itertools.product(BACKENDS, CONTRACT_SETS, NPROCS)]


def snapshot_cases():
    """The snapshot store on and off with every backend, cold and warm (its dimensions in full,
    as docs/checkpoints.md promises them together): two workers a node, torchrun's contract."""
    return [(b, "torch", 2, start, "cgroup", snap) for b, start, snap in
            itertools.product(BACKENDS, STARTS, SNAPSHOTS)]


def case_name(kind, case):
    backend, contracts, nproc, start, cgroup, snapshots = case
    words = [kind, backend, contracts.replace("torch,", "").replace(",", "_"), f"w{nproc}"]
    if kind == "pairwise":
        words += [start, cgroup.replace("-", "_"), snapshots.replace("-", "_")]
    if kind == "snapshot":
        words = [kind, backend, start, snapshots.replace("-", "_")]
    return "test_" + "_".join(words)


def with_conf(cmd, item):
    """`cmd` with `item` (key=value) added to its --rdzv-conf, which stays one flag."""
    if "--rdzv-conf" in cmd:
        i = cmd.index("--rdzv-conf") + 1
        return cmd[:i] + [f"{cmd[i]},{item}"] + cmd[i + 1:]
    return cmd[:1] + ["--rdzv-conf", item] + cmd[1:]


def read_envs(out):
    """Every worker's environment, by rank, from the env_<rank>.env (shell) or .json (Python)
    files the workers wrote."""
    envs = {}
    for name in os.listdir(out):
        path = os.path.join(out, name)
        if name.endswith(".env"):
            with open(path, "rb") as f:
                items = [x.decode() for x in f.read().split(b"\0") if x]
            env = dict(x.split("=", 1) for x in items if "=" in x)
        elif name.endswith(".json"):
            with open(path) as f:
                env = json.load(f)
        else:
            continue
        envs[int(env["RANK"])] = env
    return envs


class Matrix(unittest.TestCase):
    etcd = None
    etcd_dir = None
    etcd_lock = threading.Lock()  # cases run LANES at a time

    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="crun-matrix-")
        cls.torchless = torchless_python(cls.root)

    @classmethod
    def tearDownClass(cls):
        if cls.etcd is not None:
            cls.etcd.close()
        shutil.rmtree(cls.root, ignore_errors=True)

    @classmethod
    def etcd_endpoint(cls):
        """One real etcd on loopback for every etcd case (each case is its own job id)."""
        with cls.etcd_lock:
            if cls.etcd is None:
                missing = missing_programs()
                if missing:
                    raise AssertionError(f"{missing} missing: scripts/install-deps.sh installs "
                                         "etcd")
                ports = {"e": (free_port(), free_port())}
                etcd = EtcdCluster(Loopback(), ["e"], os.path.join(cls.root, "etcd"),
                                   ports=ports)
                etcd.__enter__()
                cls.etcd = etcd
            return cls.etcd.endpoints()

    def commands(self, backend, contracts, nproc, worker, out, snapshots="default",
                 restarts=None, extra=()):
        """The crun command lines of one case: one node, or two on this host."""
        # crun's info lines: a case that fails or hangs shows how far each node got.
        if restarts is None:
            restarts = 1 if snapshots == "snapshots" else 0
        common = ["--log-level", "info", "--contract", contracts, "--nproc-per-node", str(nproc),
                  "--max-restarts", str(restarts), *extra,
                  *(() if worker.endswith(".py") else ("--no-python",)),
                  *(("--snapshots", "off") if snapshots == "no-snapshots" else ())]
        out = [out, *{"snapshots": ["--snapshot"], "no-snapshots": ["--no-snapshot"]}.get(
            snapshots, [])]
        job = uuid.uuid4().hex[:12]
        if backend == "local":
            return [[CRUN, "--standalone", *common, worker, *out]]
        if backend == "static":
            port = str(free_port())
            return [[CRUN, "--nnodes", "2", "--node-rank", rank, "--master-addr", "127.0.0.1",
                     "--master-port", port, *common, worker, *out] for rank in ("1", "0")]
        if backend == "service":
            endpoint = f"127.0.0.1:{free_port()}"
            return [[CRUN, "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                     endpoint, "--rdzv-id", job, *common, worker, *out] for _ in range(2)]
        endpoint = self.etcd_endpoint()
        return [[CRUN, "--nnodes", "2", "--rdzv-backend", "etcd-v3", "--rdzv-endpoint", endpoint,
                 "--rdzv-id", job, *common, worker, *out] for _ in range(2)]

    def start_cruns(self, cmds, out, env, first=0):
        """The crun processes of a case, each with its log (crun_<first + i>.log) and its
        environment (`env`, or one a command); wait_cruns() waits for them."""
        envs = env if isinstance(env, list) else [env] * len(cmds)
        logs = [open(os.path.join(out, f"crun_{first + i}.log"), "w+") for i in range(len(cmds))]
        procs = [subprocess.Popen(c, stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=subprocess.STDOUT, text=True, env=e)
                 for c, log, e in zip(cmds, logs, envs)]
        return procs, logs

    def wait_cruns(self, procs, logs, deadline):
        """Waits for a case's crun processes to end (by `deadline`, else kills them and fails
        showing every crun's output): their texts."""
        try:
            for p in procs:
                try:
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    kill_all(procs)
                    self.fail(f"{' '.join(p.args)} still ran after {CASE_LIMIT_S} s; "
                              "every crun's output:\n" + "\n".join(
                                  f"--- {' '.join(q.args[:8])}:\n{self.tail(log)}"
                                  for q, log in zip(procs, logs)))
        finally:
            kill_all(procs)
        texts = [self.tail(log) for log in logs]
        for log in logs:
            log.close()
        return texts

    @staticmethod
    def mark_when_said(log, words, marker, procs, deadline):
        """Creates the file `marker` once `words` are in `log` (a crun's, polled), so that the
        workers started from then on run their later steps; gives up, harmlessly (they run
        their first count again), when the processes end or `deadline` passes first."""
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            with open(log.name, errors="replace") as f:
                if words in f.read():
                    open(marker, "w").close()
                    return
            time.sleep(0.01)

    def run_cruns(self, cmds, out, env):
        """Runs a case's crun processes to their end (CASE_LIMIT_S at most): their texts."""
        procs, logs = self.start_cruns(cmds, out, env)
        return procs, self.wait_cruns(procs, logs, time.monotonic() + CASE_LIMIT_S)

    def members(self, backend, cmd):
        """How many nodes `crun status` shows as members of the job `cmd` is a node of (service
        or etcd); 0 before its rendezvous answers."""
        backend_args = ("--rdzv-backend", "etcd-v3") if backend == "etcd" else ()
        status = subprocess.run([CRUN, "status", *backend_args, "--rdzv-endpoint",
                                 cmd[cmd.index("--rdzv-endpoint") + 1], "--rdzv-id",
                                 cmd[cmd.index("--rdzv-id") + 1], "--json"],
                                capture_output=True, text=True, timeout=60)
        if status.returncode != 0:
            return 0
        jobs = json.loads(status.stdout)
        return sum(n["state"] == "member" for n in jobs[0]["nodes"]) if jobs else 0

    def run_crash_case(self, case):
        """A worker that fails the same way in every attempt: at import (a crash loop) or
        after a step heartbeat (progress: every restart is spent)."""
        backend, start, mode = case
        out = tempfile.mkdtemp(dir=self.root)
        env = dict(os.environ, PYTHON_EXEC=self.torchless)
        env.pop("PET_WARM", None)
        loop_after, repeats, restarts = 2, 3, 4
        cmds = self.commands(backend, "torch", 2, CRASH_WORKER, out, restarts=restarts,
                             extra=("--max-restarts-without-progress", str(loop_after),
                                    "--max-repeated-failures", str(repeats)))
        cmds = [c[:-1] + [out, mode] for c in cmds]  # the worker's arguments, not env_dump's
        if start == "warm":
            cmds = [c[:1] + ["--warm"] + c[1:] for c in cmds]
        procs, texts = self.run_cruns(cmds, out, env)
        self.assertEqual(processes_mentioning(out), [], "processes left running")
        attempts = sorted({int(line.split()[0]) for line in whole_lines(
            os.path.join(out, "attempts"))})
        if mode == "import":
            for p, text in zip(procs, texts):
                self.assertEqual(p.returncode, 86, f"{' '.join(p.args)}:\n{text}")
                self.assertRegex(
                    text, r"crash loop: rank \d+ \(local rank \d\)( on \S+)? failed with exit "
                    r"code 1 in 2 attempts before any step: ModuleNotFoundError: No module named "
                    r"'missing_module_of_crash_loop' \(--max-restarts-without-progress 2")
            # Stopped by the loop, not by the budget: restarts were left.
            self.assertLess(max(attempts), restarts, attempts)
        else:  # after progress: no crash loop, but the same failure every time
            for p, text in zip(procs, texts):
                self.assertEqual(p.returncode, 86, f"{' '.join(p.args)}:\n{text}")
                self.assertNotIn("crash loop", text)
                self.assertRegex(
                    text, r"repeated failure: rank \d+ \(local rank \d\)( on \S+)? failed with "
                    r"exit code 1 in 3 attempts in a row, progress or not: RuntimeError: a step "
                    r"failed \(--max-repeated-failures 3")
            # Stopped by the repeats, not by the crash loop's 2 or the budget's 4 restarts.
            self.assertEqual(attempts, list(range(repeats)))

    def run_health_case(self, case):
        """The health gate on every backend, cold and warm: all pass, or one node's fails."""
        backend, start, verdict = case
        out = tempfile.mkdtemp(dir=self.root)
        env = dict(os.environ, PYTHON_EXEC=self.torchless)
        env.pop("PET_WARM", None)
        cmds = self.commands(backend, "torch", 2, PYTHON_WORKER, out, extra=PASSING_CHECKS)
        sick = 0  # the failing node: the only one, static's node rank 1, or the service's guest
        if verdict == "fails":
            cmds[sick] = cmds[sick][:1] + list(FAILING_CHECK) + cmds[sick][1:]
            if backend in ("service", "etcd"):
                cmds = [[("1:2" if a == "2" and c[i - 1] == "--nnodes" else a)
                         for i, a in enumerate(c)] for c in cmds]
            if backend == "service":  # the healthy node hosts the service
                cmds = [with_conf(c, f"is_host={int(i != sick)}") for i, c in enumerate(cmds)]
            if backend == "static":
                cmds = [with_conf(c, f"join_timeout={STATIC_JOIN_TIMEOUT_S}") for c in cmds]
        if start == "warm":
            cmds = [c[:1] + ["--warm"] + c[1:] for c in cmds]
        procs, texts = self.run_cruns(cmds, out, env)
        self.assertEqual(processes_mentioning(out), [], "processes left running")
        envs = read_envs(out)
        if verdict == "passes":
            for p, text in zip(procs, texts):
                self.assertEqual(p.returncode, 0, f"{' '.join(p.args)}:\n{text}")
            self.check_environments(envs, "torch", len(cmds), 2)
            return
        self.assertEqual(procs[sick].returncode, 87, texts[sick])
        self.assertIn("failed its health check and does not join: health check `echo sick disk "
                      ">&2; exit 3` failed with exit code 3: sick disk", texts[sick])
        if backend == "local":
            self.assertEqual(envs, {})
        elif backend == "static":  # waits for the node that stayed out, then says so
            self.assertEqual(procs[1].returncode, 1, texts[1])
            self.assertIn(f"round 0: node 1 did not join within {STATIC_JOIN_TIMEOUT_S:.1f} s "
                          "(did its health check keep it out?", texts[1])
            self.assertEqual(envs, {})
        else:  # a round of the healthy node alone
            self.assertEqual(procs[1].returncode, 0, texts[1])
            self.check_environments(envs, "torch", 1, 2)
        if backend == "etcd":  # the job's document keeps the node that stayed out, and why
            run_id = cmds[1][cmds[1].index("--rdzv-id") + 1]
            status = subprocess.run([CRUN, "status", "--rdzv-backend", "etcd-v3",
                                     "--rdzv-endpoint", self.etcd_endpoint(), "--rdzv-id",
                                     run_id, "--json"], capture_output=True, text=True,
                                    timeout=60)
            self.assertEqual(status.returncode, 0, status.stderr)
            job = json.loads(status.stdout)[0]
            self.assertEqual(job["unhealthy_reports"], 1, job)
            self.assertEqual([n["reason"] for n in job["nodes"] if n["state"] == "unhealthy"],
                             ["health check `echo sick disk >&2; exit 3` failed with exit code "
                              "3: sick disk"], job)

    def run_straggler_case(self, case):
        """Slow ranks on every backend, cold and warm, warned of or excluded: 2 workers a node."""
        backend, start, slow, action = case
        out = tempfile.mkdtemp(dir=self.root)
        cmds = self.commands(backend, "torch", 2, STRAGGLER_WORKER, out,
                             restarts=1 if action == "restart" else 0,
                             extra=("--straggler-action", action))
        cmds = [c[:-1] for c in cmds]  # the worker takes no arguments
        if backend in FAST_CONF:
            cmds = [with_conf(c, FAST_CONF[backend]) for c in cmds]
        env = dict(os.environ, PYTHON_EXEC=PYTHON)
        env.pop("PET_WARM", None)
        if start == "warm":
            cmds = [c[:1] + ["--warm"] + c[1:] for c in cmds]
        if action == "exclude":
            return self.run_exclude_case(backend, slow, cmds, out, env)
        if action == "restart":
            return self.run_slow_restart_case(backend, slow, cmds, out, env)
        world = 2 * len(cmds)
        slow_ranks = [world - 1] if slow == "rank" else [world - 2, world - 1]
        env["STRAGGLER_SLOW"] = ",".join(map(str, slow_ranks))
        procs, texts = self.run_cruns(cmds, out, env)
        self.assertEqual(processes_mentioning(out), [], "processes left running")
        for p, text in zip(procs, texts):
            self.assertEqual(p.returncode, 0, f"{' '.join(p.args)}:\n{text}")
        named = [[(int(rank), int(local)) for local, rank in NAMED.findall(t)] for t in texts]
        if slow == "node" and not (backend in JOB_WIDE and len(cmds) > 1):
            expected = []  # equal among their node's ranks: nobody to name them against
        else:
            expected = [(r, r % 2) for r in slow_ranks]
        everyone = sorted(n for node in named for n in node)
        self.assertEqual(everyone, expected, "\n".join(texts))
        # The node that runs the ranks names them, and only it.
        self.assertLessEqual(sum(1 for node in named if node), 1, named)

    def run_slow_restart_case(self, backend, slow, cmds, out, env):
        """--straggler-action restart: the node that runs a rank named slow stops it as failed
        ("a slow rank" in the report), which spends one restart of the job; slow in the first
        attempt only, the job ends well in the second. A rank nobody can name (a slow node
        judged among its own ranks) costs nothing."""
        world = 2 * len(cmds)
        slow_ranks = [world - 1] if slow == "rank" else [world - 2, world - 1]
        finished = os.path.join(out, "finished")
        unnamed = slow == "node" and not (backend in JOB_WIDE and len(cmds) > 1)
        # 300 steps: the fast ranks (6 s) are still running when the slow one is named (50 of
        # its steps, 2.5 s). 600 (12 s) where the job restarts whole (the service, etcd), which
        # stops them at the restart whatever their count: the slow node's workers may start
        # seconds after the fast node's (a warm template's torch import beside other cases).
        # The second attempt runs 120 (2.4 s): long enough for the rank, fast now, to be named
        # again were a verdict of the first attempt kept. A slow node nobody can name runs 120
        # steps (6 s at 2.5 times), as in the warn case.
        first = "120" if unnamed else "300" if backend == "static" else "600"
        env = dict(env, STRAGGLER_SLOW=",".join(map(str, slow_ranks)), STRAGGLER_ATTEMPTS="0",
                   STRAGGLER_STEPS=first, STRAGGLER_LATER_STEPS="120", STRAGGLER_LOG=finished)
        procs, texts = self.run_cruns(cmds, out, env)
        self.assertEqual(processes_mentioning(out), [], "processes left running")
        for p, text in zip(procs, texts):
            self.assertEqual(p.returncode, 0, f"{' '.join(p.args)}:\n{text}")
        # "RANK NODE_TAG RESTART_COUNT" lines, NODE_TAG empty here
        done = sorted((int(w[0]), int(w[-1])) for w in map(str.split, whole_lines(finished)))
        if unnamed:
            self.assertEqual(done, [(r, 0) for r in range(world)], "\n".join(texts))
            self.assertNotIn("--straggler-action restart", "\n".join(texts))
            return
        # Every rank finished once, in the second attempt; on static without --contract ports
        # each node restarts on its own (torchrun's behaviour, docs/frameworks.md), and the
        # other node's workers (no collective here to fail them) finish their first.
        restarted = set(range(world)) if backend != "static" else {2, 3}
        self.assertEqual(done, [(r, int(r in restarted)) for r in range(world)],
                         "\n".join(texts))
        stopped = re.compile(r"crun: rank (\d+) \(local rank (\d)+, pid \d+\) on \S+ is slow: "
                             r"[\d.]+x the others' median compute time per step \(steps \d+-\d+\)"
                             r"; stopping the group to restart it \(--straggler-action restart\)")
        stops = [[int(r) for r, _ in stopped.findall(t)] for t in texts]
        # One node stops one of its slow ranks (the first named), and the job restarts once.
        self.assertEqual(sum(len(node) for node in stops), 1, stops)
        self.assertIn(next(r for node in stops for r in node), slow_ranks, stops)
        for p, text in zip(procs, texts):
            if backend == "static" and "--node-rank 0" in " ".join(p.args):
                continue  # node 0 runs ranks 0 and 1, and does not restart
            self.assertRegex(text, r"restarting the worker group \(restart 1 of at most 1\): "
                             r"rank \d+ \(local rank \d\) on \S+ failed with a slow rank: "
                             r"[\d.]+x the others' median", f"{' '.join(p.args)}:\n{text}")

    def run_exclude_case(self, backend, slow, cmds, out, env):
        """--straggler-action exclude: refused where a round cannot go on without a node; else
        a node whose ranks are slow (its own environment: a spare that takes them is not) is
        named, leaves with exit 87, and the spare runs its ranks to the end."""
        if backend in ("local", "static"):
            procs, texts = self.run_cruns(cmds, out, env)
            which = "--standalone" if backend == "local" else "static"
            for p, text in zip(procs, texts):
                self.assertEqual(p.returncode, 2, text)
                self.assertIn(f"--straggler-action exclude: the {which} rendezvous cannot go on "
                              "without a node", text)
            self.assertEqual(sorted(f for f in os.listdir(out) if not f.startswith("crun_")),
                             [], "files written by a refused job")
            self.assertEqual(processes_mentioning(out), [], "processes left running")
            return
        finished = os.path.join(out, "finished")
        later = os.path.join(out, "later")
        # 600 steps: the fast node's first ranks (12 s) are still running when the slow node is
        # named (50 of its steps, 2.5 s) and leaves. The round of fast and spare, which starts
        # once `later` exists, runs 120 (2.4 s): long enough for the spare to be named, were the
        # slowness its ranks' rather than the slow node's.
        env = dict(env, STRAGGLER_STEPS="600", STRAGGLER_LOG=finished, STRAGGLER_LATER_IF=later,
                   STRAGGLER_LATER_STEPS="120")
        roles = ("fast", "slow", "spare")
        cmds = [cmds[0], cmds[1], list(cmds[1])]
        if backend == "service":  # the fast node hosts the service: it stays to the end
            cmds = [with_conf(c, f"is_host={int(role == 'fast')}") for role, c in zip(roles, cmds)]
        envs = [dict(env, NODE_TAG=role) for role in roles]
        envs[1]["STRAGGLER_SLOW_LOCAL"] = "1" if slow == "rank" else "0,1"
        deadline = time.monotonic() + CASE_LIMIT_S
        procs, logs = self.start_cruns(cmds[:2], out, envs[:2])
        try:  # the spare joins once fast and slow are the round
            wait_for(lambda: self.members(backend, cmds[0]) == 2, "a round of two nodes",
                     limit=CASE_LIMIT_S / 2)
        except AssertionError:
            kill_all(procs)
            raise
        spare, spare_log = self.start_cruns(cmds[2:], out, envs[2:], first=2)
        self.mark_when_said(logs[1], "leaves the job", later, procs + spare, deadline)
        texts = self.wait_cruns(procs + spare, logs + spare_log, deadline)
        procs += spare
        self.assertEqual(processes_mentioning(out), [], "processes left running")
        named = [sorted(int(local) for local, _ in NAMED.findall(t)) for t in texts]
        done = sorted(tuple(line.split()[:2]) for line in whole_lines(finished))
        self.assertEqual(named[0], [], texts[0])
        self.assertEqual(named[1], [1] if slow == "rank" else [0, 1], texts[1])
        self.assertEqual(procs[1].returncode, 87, texts[1])
        self.assertRegex(texts[1], r"this node \(\S+\) leaves the job: slow rank \d+: [\d.]+x "
                         r"the others' median compute time per step \(steps \d+-\d+\) "
                         r"\(--straggler-action exclude\)")
        # The service passes the leaving node's reason on; etcd sees its lease end.
        why = (r"it left: excluded: slow rank \d+: " if backend == "service" else
               r"its etcd lease ended \(the agent left")
        for i in (0, 2):
            self.assertEqual(procs[i].returncode, 0, f"{' '.join(procs[i].args)}:\n{texts[i]}")
            self.assertRegex(texts[i], r"re-forming the job: node \S+ \(\S+\) was lost: " + why)
        # Every rank finished once, in the round of fast and spare; the spare, running the slow
        # node's ranks now, names nobody.
        self.assertEqual(named[2], [], texts[2])
        self.assertEqual(sorted(int(r) for r, _ in done), [0, 1, 2, 3], done)
        self.assertEqual({tag for _, tag in done}, {"fast", "spare"}, done)

    def run_case(self, case, python):
        backend, contracts, nproc, start, cgroup, snapshots = case
        out = tempfile.mkdtemp(dir=self.root)
        ledger = os.path.join(out, "ledger")
        # Only a case that saves snapshots needs torch in its workers (and its warm template).
        python = PYTHON if snapshots == "snapshots" else self.torchless
        env = dict(os.environ, PYTHON_EXEC=python, CRUN_TEST_WARM_LEDGER=ledger,
                   PYTHONPATH=WITNESS)
        env.pop("PET_WARM", None)
        if cgroup == "no-cgroup":
            env["CRUN_CGROUP"] = "0"
        worker = PYTHON_WORKER if python else SHELL_WORKER
        cmds = self.commands(backend, contracts, nproc, worker, out, snapshots)
        if start == "warm":
            cmds = [c[:1] + ["--warm"] + c[1:] for c in cmds]
        procs, texts = self.run_cruns(cmds, out, env)
        for p, text in zip(procs, texts):
            self.assertEqual(p.returncode, 0, f"{' '.join(p.args)}:\n{text[-3000:]}")
        self.assertEqual(processes_mentioning(out), [], "processes left running")
        nodes = len(cmds)
        envs = read_envs(out)
        self.check_environments(envs, contracts, nodes, nproc)
        attempts = 2 if snapshots == "snapshots" else 1
        if snapshots != "default":
            expect = "7" if snapshots == "snapshots" else "off"
            self.assertEqual({r: e.get("CRUN_MATRIX_SNAPSHOT") for r, e in envs.items()},
                             {r: expect for r in envs})
            self.assertEqual({e["TORCHELASTIC_RESTART_COUNT"] for e in envs.values()},
                             {str(attempts - 1)})
        if python:
            lines = whole_lines(ledger) if os.path.exists(ledger) else []
            kinds = sorted(line.split()[0] for line in lines)
            self.assertEqual(kinds, [start] * (nodes * nproc * attempts), lines)

    @staticmethod
    def tail(log):
        log.flush()
        log.seek(0)
        return log.read()[-3000:]

    def check_environments(self, envs, contracts, nodes, nproc):
        world = nodes * nproc
        asked = set(contracts.split(","))
        self.assertEqual(sorted(envs), list(range(world)), "ranks missing or repeated")
        for rank, e in envs.items():
            with self.subTest(rank=rank):
                self.assertEqual(int(e["WORLD_SIZE"]), world)
                self.assertEqual(int(e["LOCAL_WORLD_SIZE"]), nproc)
                node, local = int(e["GROUP_RANK"]), int(e["LOCAL_RANK"])
                self.assertEqual(rank, node * nproc + local)
                for name, variables in CONTRACT_VARIABLES.items():
                    if name not in asked:
                        self.assertEqual([v for v in variables if v in e], [],
                                         f"{name} variables without --contract {name}")
                if "tensorflow" in asked:
                    tf = json.loads(e["TF_CONFIG"])
                    workers = tf["cluster"]["worker"]
                    self.assertEqual(len(workers), world)
                    self.assertEqual(len(set(workers)), world, "two workers share an endpoint")
                    self.assertEqual(tf["task"], {"type": "worker", "index": rank})
                if "horovod" in asked:
                    expect = {"HOROVOD_RANK": rank, "HOROVOD_SIZE": world,
                              "HOROVOD_LOCAL_RANK": local, "HOROVOD_LOCAL_SIZE": nproc,
                              "HOROVOD_CROSS_RANK": node, "HOROVOD_CROSS_SIZE": nodes}
                    self.assertEqual({k: int(e[k]) for k in expect}, expect)
                if "deepspeed" in asked:
                    expect = {"LOCAL_SIZE": nproc, "CROSS_RANK": node, "CROSS_SIZE": nodes}
                    self.assertEqual({k: int(e[k]) for k in expect}, expect)
                if "mpi" in asked:
                    expect = {"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": world,
                              "OMPI_COMM_WORLD_LOCAL_RANK": local,
                              "OMPI_COMM_WORLD_LOCAL_SIZE": nproc,
                              "OMPI_COMM_WORLD_NODE_RANK": node}
                    self.assertEqual({k: int(e[k]) for k in expect}, expect)
        # Job-wide values: the same for every rank.
        for variable, contract in (("TF_CONFIG", "tensorflow"), ("JAX_COORDINATOR_ADDRESS", "jax"),
                                   ("HOROVOD_GLOO_RENDEZVOUS_ADDR", "horovod"),
                                   ("HOROVOD_GLOO_RENDEZVOUS_PORT", "horovod")):
            if contract in asked:
                values = {json.dumps(json.loads(e[variable])["cluster"])
                          if variable == "TF_CONFIG" else e[variable] for e in envs.values()}
                self.assertEqual(len(values), 1, f"{variable} differs between ranks: {values}")
        if "horovod" in asked:
            hosts = {int(e["GROUP_RANK"]): e["HOROVOD_HOSTNAME"] for e in envs.values()}
            self.assertEqual(len(set(hosts.values())), nodes, f"nodes share a host name: {hosts}")


def crash_cases():
    return list(itertools.product(BACKENDS, STARTS, CRASH_MODES))


def health_cases():
    return list(itertools.product(BACKENDS, STARTS, HEALTH_VERDICTS))


def straggler_cases():
    return list(itertools.product(BACKENDS, STARTS, SLOW, STRAGGLER_ACTIONS))


def nodes_of(backend):
    return 1 if backend == "local" else 2


def full_case(combo):
    backend, contracts, nproc = combo
    return (backend, contracts, nproc, "cold", "cgroup", "default")


def snapshot_case(combo):
    backend, start, snapshots = combo
    return (backend, "torch", 2, start, "cgroup", snapshots)


def straggler_seconds(combo):
    backend, _, slow, action = combo
    if action == "exclude":
        return 0.5 if backend in ("local", "static") else 7.5  # refused at parse time, or run
    if action == "restart":
        return 7.5 if slow == "node" and backend in ("local", "static") else 7.0
    return 6.8


class Family:
    """One family: its dimensions (names, values), the cases `full` runs (combinations of those
    values), how a combination runs and is named, and a case's estimated seconds on the 2-core
    CI machine (the ci cover's ties go to the cheaper case; --list sums them). The estimates
    apportion the CI run's 288 s (integration_matrix) and 466 s (the straggler family) by case,
    with the straggler family's per-action times of bc4c491 less what the shorter runs save."""

    def __init__(self, name, dims, full, run, name_of, seconds, seconds_a_pair=None):
        self.name = name
        self.dim_names = tuple(d for d, _ in dims)
        self.values = tuple(v for _, v in dims)
        self.full = full
        self.run = run
        self.name_of = name_of
        self.seconds = seconds
        self.seconds_a_pair = seconds_a_pair  # pairwise(): what one more pair is worth
        self._covers = {}  # cover -> its cases, computed once

    def product(self):
        return list(itertools.product(*self.values))

    def cover(self, cover):
        """The cases of `cover`: `full` as listed in the docstring; `ci` the pairwise cover of
        this family's dimensions, which must meet every pair of them."""
        if cover not in self._covers:
            cases = self.full() if cover == "full" else pairwise(self.values, self.seconds,
                                                                  self.seconds_a_pair)
            unmet = unmet_pairs(self.values, cases)
            if cover == "ci" and unmet:
                raise AssertionError(f"the {self.name} family's ci cover misses {len(unmet)} "
                                     f"pairs, first {self.describe_pair(unmet[0])}")
            self._covers[cover] = cases
        return list(self._covers[cover])

    def sample(self, cover_cases, k, seed):
        """`k` cases of the family's product outside `cover_cases`, drawn with a generator seeded
        by (seed, family): the same seed gives the same cases, whatever families run beside."""
        taken = set(cover_cases)
        rest = [c for c in self.product() if c not in taken]
        picked = set(random.Random(f"{seed}/{self.name}").sample(rest, min(k, len(rest))))
        return [c for c in rest if c in picked]

    def describe_pair(self, pair):
        i, a, j, b = pair
        return f"{self.dim_names[i]}={a} with {self.dim_names[j]}={b}"


def _torch_imports(combo):
    """How many times a pairwise case imports torch: with the store on, in every worker of both
    attempts (cold) or once in each node's template (warm); with it off, never (its workers
    and template run Matrix.torchless)."""
    backend, _, nproc, start, _, snapshots = combo
    if snapshots != "snapshots":
        return 0
    return nodes_of(backend) * (1 if start == "warm" else 2 * nproc)


def _pairwise_seconds(combo):
    backend, _, nproc, _, _, snapshots = combo
    workers = nodes_of(backend) * nproc * (2 if snapshots == "snapshots" else 1)
    return 0.3 * nodes_of(backend) + 0.05 * workers + TORCH_IMPORT_S * _torch_imports(combo)


FAMILIES = {f.name: f for f in (
    Family("full", (("backend", BACKENDS), ("contracts", CONTRACT_SETS), ("workers", NPROCS)),
           lambda: list(itertools.product(BACKENDS, CONTRACT_SETS, NPROCS)),
           lambda self, c: self.run_case(full_case(c), python=False),
           lambda c: case_name("full", full_case(c)),
           lambda c: 0.1 + 0.02 * nodes_of(c[0]) * c[2]),
    Family("pairwise", (("backend", BACKENDS), ("contracts", CONTRACT_SETS), ("workers", NPROCS),
                        ("start", STARTS), ("cgroups", CGROUPS), ("snapshots", SNAPSHOTS)),
           lambda: pairwise(PAIRWISE_DIMS),  # today's 40 cases, ties to product order
           lambda self, c: self.run_case(c, python=True),
           lambda c: case_name("pairwise", c),
           _pairwise_seconds, PAIRWISE_SECONDS_A_PAIR),
    Family("snapshot", (("backend", BACKENDS), ("start", STARTS), ("snapshots", SNAPSHOTS)),
           lambda: [(b, st, sn) for b, _, _, st, _, sn in snapshot_cases()],
           lambda self, c: self.run_case(snapshot_case(c), python=True),
           lambda c: case_name("snapshot", snapshot_case(c)),
           lambda c: _pairwise_seconds(snapshot_case(c))),
    Family("crashloop", (("backend", BACKENDS), ("start", STARTS), ("failure", CRASH_MODES)),
           crash_cases, lambda self, c: self.run_crash_case(c),
           lambda c: "test_crashloop_" + "_".join(c),
           lambda c: 1.6 if c[2] == "import" else 2.9),
    Family("health", (("backend", BACKENDS), ("start", STARTS), ("verdict", HEALTH_VERDICTS)),
           health_cases, lambda self, c: self.run_health_case(c),
           lambda c: "test_health_" + "_".join(c),
           lambda c: 1.0 if c[2] == "passes" or c[0] == "local" else 2.0),
    Family("straggler", (("backend", BACKENDS), ("start", STARTS), ("slow", SLOW),
                         ("action", STRAGGLER_ACTIONS)),
           straggler_cases, lambda self, c: self.run_straggler_case(c),
           lambda c: "test_straggler_" + "_".join(c),
           straggler_seconds),
)}


def take_option(argv, flag, check, default):
    """The value of `flag` (taken out of argv, so that unittest does not see it), checked by
    `check` (which returns it converted, or None when it is no good), else `default`."""
    if flag not in argv:
        return default
    i = argv.index(flag)
    value = argv[i + 1] if i + 1 < len(argv) else None
    converted = check(value) if value is not None else None
    if converted is None:
        sys.exit(f"test_matrix.py: {flag} {value or ''}: expected {check.__doc__}")
    del argv[i:i + 2]
    return converted


def take_families(argv):
    """The families named by --families; every one when it is not given. A name that is no
    family is refused, naming it."""
    def families(value):
        names = set(value.split(","))
        unknown = sorted(names - set(FAMILIES))
        if unknown:
            sys.exit(f"test_matrix.py: --families: no family {','.join(unknown)} (there are "
                     + ",".join(FAMILIES) + ")")
        return names
    families.__doc__ = "some of " + ",".join(FAMILIES)
    return take_option(argv, "--families", families, set(FAMILIES))


def cover_value(value):
    """ci or full"""
    return value if value in COVERS else None


def count_value(value):
    """a whole number, 0 or more"""
    return int(value) if value.isdigit() else None


def chosen_seed(argv):
    """--seed, else $CRUN_MATRIX_SEED, else a fresh random one."""
    given = take_option(argv, "--seed", count_value, None)
    if given is None and os.environ.get(SEED_VARIABLE, "").isdigit():
        given = int(os.environ[SEED_VARIABLE])
    return given if given is not None else secrets.randbelow(10 ** 6)


SELECTED = take_families(sys.argv)
COVER = take_option(sys.argv, "--cover", cover_value, "ci")
SAMPLE = take_option(sys.argv, "--sample", count_value, DEFAULT_SAMPLE)
SEED = chosen_seed(sys.argv)


def planned_cases(family, cover=None, sample=None, seed=None):
    """(test name, combination, sampled) of `family` under the cover, sample and seed chosen
    (those of the command line unless given); `full` samples nothing (it runs the family's
    whole list)."""
    cover, sample, seed = cover or COVER, SAMPLE if sample is None else sample, seed or SEED
    fam = FAMILIES[family]
    cases = fam.cover(cover)
    planned = [(fam.name_of(c), c, False) for c in cases]
    if cover == "ci":
        planned += [(f"{fam.name_of(c)}_seed{seed}", c, True)
                    for c in fam.sample(cases, sample, seed)]
    return planned


def add_cases(families):
    for family in FAMILIES:
        if family not in families:
            continue
        run = FAMILIES[family].run
        for name, combo, _ in planned_cases(family):
            def test(self, combo=combo, run=run):
                run(self, combo)
            setattr(Matrix, name, test)


add_cases(SELECTED)


class Covers(unittest.TestCase):
    """The covers themselves (no crun): every family's ci cover meets every pair of its
    dimensions, and a seed's sample lies outside the cover, inside the product, the same for
    the same seed whichever families run."""

    def test_every_ci_cover_meets_every_pair_of_its_family(self):
        for fam in FAMILIES.values():
            with self.subTest(family=fam.name):
                cases = fam.cover("ci")
                self.assertEqual(unmet_pairs(fam.values, cases), [])
                self.assertLessEqual(len(cases), len(fam.full()))

    def test_a_seed_gives_the_same_sample_outside_the_cover(self):
        for fam in FAMILIES.values():
            with self.subTest(family=fam.name):
                cover = fam.cover("ci")
                first, again = fam.sample(cover, 2, 1234), fam.sample(cover, 2, 1234)
                self.assertEqual(first, again)
                self.assertEqual(set(first) & set(cover), set())
                self.assertTrue(set(first) <= set(fam.product()))


def rerun_command():
    """The command that runs this run's sampled cases again, here."""
    root = os.path.normpath(os.path.join(HERE, "..", ".."))
    script = os.path.relpath(os.path.abspath(__file__), root)
    return (f"cd {shlex.quote(root)} && CRUN_BIN={shlex.quote(CRUN)} "
            f"PYTHON_EXEC={shlex.quote(PYTHON)} python3 {script} --families "
            f"{','.join(f for f in FAMILIES if f in SELECTED)} --cover ci --sample {SAMPLE} "
            f"--seed {SEED} -k _seed{SEED}")


def headline():
    """The first line of output: the cover, and for ci the seed and the command that runs its
    sample again."""
    counts = {f: len(planned_cases(f)) for f in FAMILIES if f in SELECTED}
    listed = ", ".join(f"{f} {n}" for f, n in counts.items())
    if COVER == "full":
        return f"test_matrix.py: cover full: {listed} cases"
    return (f"test_matrix.py: cover ci, seed {SEED}: {listed} cases, {SAMPLE} a family sampled "
            f"(their names end _seed{SEED}); run the sampled cases again: {rerun_command()}")


def describe():
    """Each family: its dimensions, its full and ci case counts with their estimated seconds,
    and for the cover chosen (--cover) the pairs it meets (every one, or exit status 1) and its
    cases, with the sample of this seed under ci."""
    missing = 0
    for fam in FAMILIES.values():
        full, ci = fam.full(), fam.cover("ci")
        sampled = fam.sample(ci, SAMPLE, SEED)
        est = lambda cases: sum(map(fam.seconds, cases))  # noqa: E731
        print(f"{fam.name}: {' x '.join(fam.dim_names)} "
              f"({' x '.join(str(len(v)) for v in fam.values)} = {len(fam.product())}): "
              f"full {len(full)} cases (est. {est(full):.0f} s), ci {len(ci)} + {len(sampled)} "
              f"sampled (est. {est(ci) + est(sampled):.0f} s)")
        listed = fam.cover(COVER)
        for i, j in itertools.combinations(range(len(fam.values)), 2):
            met = {(c[i], c[j]) for c in listed}
            total = len(fam.values[i]) * len(fam.values[j])
            print(f"  {COVER} meets {fam.dim_names[i]} x {fam.dim_names[j]}: {len(met)} of "
                  f"{total} pairs")
        unmet = unmet_pairs(fam.values, listed)
        missing += len(unmet)
        print(f"  every pair met: {'yes' if not unmet else 'NO: ' + fam.describe_pair(unmet[0])}")
        for c in listed:
            print("   ", fam.name_of(c))
        for c in sampled if COVER == "ci" else ():
            print("   ", f"{fam.name_of(c)}_seed{SEED}", "(sampled)")
    return 1 if missing else 0


if __name__ == "__main__":
    if "--list" in sys.argv:
        print(f"seed {SEED} (--seed, or ${SEED_VARIABLE}), {SAMPLE} sampled a family")
        sys.exit(describe())
    print(headline(), flush=True)
    # Cases are real jobs that mostly wait (shell workers, timeouts, sleeps): LANES of them run
    # at once (MATRIX_LANES; 3, and 4 with the slow ranks' family, whose cases each sleep
    # through seconds of steps on a fifth of a core). A verdict compares a rank's compute time
    # with the median of its own job's other ranks, which the cases beside it load alike, and
    # the slow ranks compute 2.5 times longer where 1.5 names them; test_stragglers.py's noisy
    # job, with every test of its suite beside it, shows that such load names nobody.
    default_lanes = "4" if "straggler" in SELECTED else "3"
    lanes.main(int(os.environ.get("MATRIX_LANES", default_lanes)))
