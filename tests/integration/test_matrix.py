"""The configuration matrix (docs/reliability.md, "The configuration matrix"): real crun
processes over a generated table of dimensions, not hand-picked cases.

  full      backend x contract set x workers a node, every combination, with a shell worker
            (cold starts, crun's cgroups where the machine has them)
  pairwise  backend x contract set x workers a node x start (cold, warm) x cgroups (on, off)
            x the snapshot store (on, off), with a Python worker: a set of cases in which every
            pair of values of any two dimensions meets at least once (a greedy covering array,
            the same every run). With the store on, each rank saves a snapshot and fails, and
            after the restart every rank loads its own back (docs/checkpoints.md).
  snapshot  backend x start x the snapshot store, every combination, with the Python worker
  crashloop backend x start x how the worker fails (at import every time, or after a step),
            every combination (docs/health.md): a worker that fails at import in every attempt
            ends the job after --max-restarts-without-progress attempts with exit code 86 and
            the crash loop's words, though restarts remain; the same failure after a step
            heartbeat spends every restart and ends with the worker's own code
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
            spent and the job ends well in the second attempt. With exclude, the node whose rank is named leaves with exit 87 and
            a spare runs its ranks to the end (service, etcd); the backends that cannot go on
            without a node (--standalone, static) refuse exclude at parse time, starting nothing

Each case checks that every crun exits 0, every rank's environment (ranks unique and complete,
TF_CONFIG of the world's size with the rank's own index, one JAX coordinator, Horovod's ranks
and sizes, DeepSpeed's and the MPI-style ones, and no variable of a contract not asked for),
how each worker started (warm or cold, by tests/pylib/warm_witness) and that nothing is left
running.

  test_matrix.py [-k PATTERN] [--families F,...] [--list]
      --families runs those families' cases only (ctest runs the straggler family, the longest,
      as a test of its own); --list prints the cases and the pairs they cover"""
import itertools
import json
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
from crun_testing import free_port, kill_all, processes_mentioning, wait_for, whole_lines  # noqa: E402
from etcd_cluster import EtcdCluster, Loopback, missing_programs  # noqa: E402

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

# The variables each contract adds (agent/frameworks/contracts.cc, docs/frameworks.md): a case checks
# that those of a contract not asked for are absent.
CONTRACT_VARIABLES = {
    "tensorflow": ("TF_CONFIG",),
    "jax": ("JAX_COORDINATOR_ADDRESS",),
    "horovod": ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_GLOO_RENDEZVOUS_PORT"),
    "deepspeed": ("LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE"),
    "mpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
}


def pairwise(dims):
    """Cases (tuples, one value a dimension) in which every pair of values of any two dimensions
    appears at least once: greedy, each step the combination that covers the most pairs not yet
    covered (ties: the first in product order), so the list is the same every run."""
    def pairs_of(case):
        return {(i, case[i], j, case[j]) for i, j in itertools.combinations(range(len(dims)), 2)}

    uncovered = set()
    for i, j in itertools.combinations(range(len(dims)), 2):
        uncovered |= {(i, a, j, b) for a in dims[i] for b in dims[j]}
    candidates = list(itertools.product(*dims))
    cases = []
    while uncovered:
        best = max(candidates, key=lambda c: len(pairs_of(c) & uncovered))
        cases.append(best)
        uncovered -= pairs_of(best)
    return cases


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

    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="crun-matrix-")

    @classmethod
    def tearDownClass(cls):
        if cls.etcd is not None:
            cls.etcd.close()
        shutil.rmtree(cls.root, ignore_errors=True)

    @classmethod
    def etcd_endpoint(cls):
        """One real etcd on loopback for every etcd case (each case is its own job id)."""
        if cls.etcd is None:
            missing = missing_programs()
            if missing:
                raise AssertionError(f"{missing} missing: scripts/install-deps.sh installs etcd")
            ports = {"e": (free_port(), free_port())}
            cls.etcd = EtcdCluster(Loopback(), ["e"], os.path.join(cls.root, "etcd"),
                                   ports=ports)
            cls.etcd.__enter__()
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
        env = dict(os.environ, PYTHON_EXEC=PYTHON)
        env.pop("PET_WARM", None)
        loop_after, restarts = 2, 3
        cmds = self.commands(backend, "torch", 2, CRASH_WORKER, out, restarts=restarts,
                             extra=("--max-restarts-without-progress", str(loop_after)))
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
        else:
            for p, text in zip(procs, texts):
                self.assertEqual(p.returncode, 1, f"{' '.join(p.args)}:\n{text}")
                self.assertNotIn("crash loop", text)
            self.assertEqual(attempts, list(range(restarts + 1)))

    def run_health_case(self, case):
        """The health gate on every backend, cold and warm: all pass, or one node's fails."""
        backend, start, verdict = case
        out = tempfile.mkdtemp(dir=self.root)
        env = dict(os.environ, PYTHON_EXEC=PYTHON)
        env.pop("PET_WARM", None)
        cmds = self.commands(backend, "torch", 2, PYTHON_WORKER, out, extra=PASSING_CHECKS)
        sick = 0  # the failing node: the only one, static's node rank 1, or the service's guest
        if verdict == "fails":
            cmds[sick] = cmds[sick][:1] + list(FAILING_CHECK) + cmds[sick][1:]
            if backend in ("service", "etcd"):
                cmds = [[("1:2" if a == "2" and c[i - 1] == "--nnodes" else a)
                         for i, a in enumerate(c)] for c in cmds]
            if backend == "service":  # the healthy node hosts the service
                for i, c in enumerate(cmds):
                    c[1:1] = ["--rdzv-conf", f"is_host={int(i != sick)}"]
            if backend == "static":
                for c in cmds:
                    c[1:1] = ["--rdzv-conf", "join_timeout=3"]
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
            self.assertIn("round 0: node 1 did not join within 3.0 s (did its health check keep "
                          "it out?", texts[1])
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
        # 300 steps: the fast ranks (6 s) are still running when the slow one is named (50 of
        # its steps, 2.5 s).
        env = dict(env, STRAGGLER_SLOW=",".join(map(str, slow_ranks)), STRAGGLER_ATTEMPTS="0",
                   STRAGGLER_STEPS="300", STRAGGLER_LOG=finished)
        procs, texts = self.run_cruns(cmds, out, env)
        self.assertEqual(processes_mentioning(out), [], "processes left running")
        for p, text in zip(procs, texts):
            self.assertEqual(p.returncode, 0, f"{' '.join(p.args)}:\n{text}")
        # "RANK NODE_TAG RESTART_COUNT" lines, NODE_TAG empty here
        done = sorted((int(w[0]), int(w[-1])) for w in map(str.split, whole_lines(finished)))
        if slow == "node" and not (backend in JOB_WIDE and len(cmds) > 1):
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
        env = dict(env, STRAGGLER_STEPS="600", STRAGGLER_LOG=finished)
        roles = ("fast", "slow", "spare")
        cmds = [cmds[0], cmds[1], list(cmds[1])]
        if backend == "service":  # the fast node hosts the service: it stays to the end
            for role, c in zip(roles, cmds):
                c[1:1] = ["--rdzv-conf", f"is_host={int(role == 'fast')}"]
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
        env = dict(os.environ, PYTHON_EXEC=PYTHON, CRUN_TEST_WARM_LEDGER=ledger,
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


FAMILIES = ("full", "pairwise", "snapshot", "crashloop", "health", "straggler")


def take_families(argv):
    """The families named by --families (taken out of argv, so that unittest does not see it);
    every one when it is not given. A name that is no family is refused, naming it."""
    if "--families" not in argv:
        return set(FAMILIES)
    i = argv.index("--families")
    if i + 1 >= len(argv):
        sys.exit("test_matrix.py: --families needs a value: some of " + ",".join(FAMILIES))
    names = set(argv[i + 1].split(","))
    del argv[i:i + 2]
    unknown = sorted(names - set(FAMILIES))
    if unknown:
        sys.exit(f"test_matrix.py: --families: no family {','.join(unknown)} (there are "
                 + ",".join(FAMILIES) + ")")
    return names


def add_cases(families):
    for kind, cases, python in (("full", full_cases(), False),
                                ("pairwise", pairwise(PAIRWISE_DIMS), True),
                                ("snapshot", snapshot_cases(), True)):
        for case in cases if kind in families else ():
            def test(self, case=case, python=python):
                self.run_case(case, python)
            setattr(Matrix, case_name(kind, case), test)
    for family, cases, run in (("crashloop", crash_cases(), Matrix.run_crash_case),
                               ("health", health_cases(), Matrix.run_health_case),
                               ("straggler", straggler_cases(), Matrix.run_straggler_case)):
        for case in cases if family in families else ():
            def test(self, case=case, run=run):
                run(self, case)
            setattr(Matrix, f"test_{family}_" + "_".join(case), test)


add_cases(take_families(sys.argv))


def describe():
    """The cases and, for the pairwise set, the pairs of dimensions it covers."""
    names = ("backend", "contracts", "workers", "start", "cgroups", "snapshots")
    cases = pairwise(PAIRWISE_DIMS)
    print(f"full: {len(full_cases())} cases ({len(BACKENDS)} backends x {len(CONTRACT_SETS)} "
          f"contract sets x {len(NPROCS)} worker counts), shell worker, cold")
    print(f"pairwise: {len(cases)} cases, Python worker, covering every pair of values of:")
    for i, j in itertools.combinations(range(len(names)), 2):
        met = {(c[i], c[j]) for c in cases}
        print(f"  {names[i]} x {names[j]}: {len(met)} of "
              f"{len(PAIRWISE_DIMS[i]) * len(PAIRWISE_DIMS[j])} pairs")
    for c in cases:
        print("   ", case_name("pairwise", c))
    print(f"snapshot: {len(snapshot_cases())} cases (backend x start x snapshot store, in full), "
          "Python worker, 2 workers a node")
    print(f"crashloop: {len(crash_cases())} cases (backend x start x how the worker fails, in "
          "full), Python worker, 2 workers a node")
    print(f"health: {len(health_cases())} cases (backend x start x the gate's verdict, in "
          "full), Python worker, 2 workers a node")
    print(f"straggler: {len(straggler_cases())} cases (backend x start x which ranks are slow x "
          "action, in full), Python worker, 2 workers a node")


if __name__ == "__main__":
    if "--list" in sys.argv:
        describe()
        sys.exit(0)
    unittest.main()
