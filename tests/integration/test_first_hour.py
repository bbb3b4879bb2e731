"""What a torchrun user meets in the first hour, against the crun binary: unknown options
named, bad input refused before anything is created, GPUs counted as CUDA would (a fake /dev),
NUMA binding seen by the kernel (an invented sysfs topology), duplicate filters, prefix
templates and the event log, logs that no node or rerun overwrites, static run ids, and a
report that names the interpreter when a module is missing. Real processes; stdlib only."""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

CRUN = os.environ["CRUN_BIN"]
HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "..", "workers")
ENV_DUMP = os.path.join(WORKERS, "env_dump.py")
AFFINITY = os.path.join(WORKERS, "affinity_probe.py")
LIMIT_S = 60

sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from crun_testing import free_port, kill_all, scratch_dir  # noqa: E402


def write(path, text=""):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text + "\n")


class FirstHour(unittest.TestCase):
    def setUp(self):
        self.dir = scratch_dir(self, "crun-first-hour-")
        self.procs = []

    def tearDown(self):
        kill_all(self.procs)

    def crun(self, *args, env=None, **kw):
        e = dict(os.environ, **(env or {}))
        return subprocess.run([CRUN, *args], capture_output=True, text=True, timeout=LIMIT_S,
                              env=e, **kw)

    def test_an_unknown_option_is_named_with_the_closest_one(self):
        r = self.crun("--nproc-per-nodes", "2", ENV_DUMP, self.dir)
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown option '--nproc-per-nodes' (did you mean --nproc-per-node?)",
                      r.stderr)
        self.assertNotIn("training script", r.stderr)
        r = self.crun("--max_restart=3", ENV_DUMP, self.dir)
        self.assertIn("unknown option '--max_restart' (did you mean --max_restarts?)", r.stderr)
        # After "--", or after the script, words belong to the worker.
        r = self.crun("--nproc-per-node", "1", "--no-python", "--", "/bin/echo", "--weird")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "--weird")

    def test_bad_input_is_refused_and_creates_nothing(self):
        tmp = os.path.join(self.dir, "tmp")
        os.mkdir(tmp)
        log_dir = os.path.join(self.dir, "not-yet")
        cases = [
            (["--tee", "1x:3"], "--tee '1x:3'"),
            (["-r", "4"], "--redirects '4'"),
            (["--max-restarts", "-1"], "--max-restarts '-1': expected a whole number"),
            (["--nproc-per-node", "0"], "--nproc-per-node '0'"),
            (["--nproc-per-node", "xpu"], "--nproc-per-node xpu"),
            (["--nnodes", "1:x"], "--nnodes '1:x'"),
            (["--shutdown-timeout", "nan"], "--shutdown-timeout 'nan'"),
            (["--monitor-interval", "inf"], "--monitor-interval 'inf'"),
            (["--start-method", "thread"], "--start-method 'thread'"),
            (["--event-log-handler", "file"], "--event-log-handler 'file'"),
            (["--logs-specs", "my_plugin"], "--logs-specs 'my_plugin'"),
            (["--numa-binding", "rack"], "--numa-binding 'rack'"),
            (["--local-ranks-filter", "7"], "'7' is not a local rank"),
            (["--standalone", "--nnodes", "2:3"], "--standalone runs one node"),
            (["--rdzv-endpoint", "127.0.0.1:1", "--rdzv-conf", "store_type=file"],
             "store_type='file'"),
            (["--print-completion", "fish"], "--print-completion 'fish'"),
            (["--nproc-per-nodes", "2"], "unknown option"),
        ]
        for args, message in cases:
            with self.subTest(args=args):
                r = self.crun("--log-dir", log_dir, *args, ENV_DUMP, self.dir,
                              env={"TMPDIR": tmp})
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(message, r.stderr)
                self.assertLess(len(r.stderr), 400, r.stderr)  # a sentence, not a dump
                self.assertEqual(os.listdir(tmp), [], "a refused command created files")
                self.assertFalse(os.path.exists(log_dir), "a refused command made --log-dir")
        # A missing script is named as such, and also leaves nothing behind.
        r = self.crun("missing_script.py", env={"TMPDIR": tmp})
        self.assertEqual(r.returncode, 2)
        self.assertIn("training script 'missing_script.py' does not exist", r.stderr)
        self.assertEqual(os.listdir(tmp), [])

    def test_a_job_that_never_starts_leaves_no_directory(self):
        tmp = os.path.join(self.dir, "tmp")
        os.mkdir(tmp)
        r = self.crun("--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                      "--rdzv-conf", "join_timeout=0.3,is_host=0", ENV_DUMP, self.dir,
                      env={"TMPDIR": tmp})
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("cannot reach the rendezvous service", r.stderr)
        self.assertEqual(os.listdir(tmp), [])
        # With --log-dir, the user's directory stays; crun's own part of it goes.
        logs = os.path.join(self.dir, "logs")
        r = self.crun("--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                      "--rdzv-conf", "join_timeout=0.3,is_host=0", "--log-dir", logs,
                      ENV_DUMP, self.dir)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(os.listdir(logs), [])

    def test_a_finished_job_leaves_only_what_it_wrote(self):
        # torchrun leaves a torchelastic_* directory in the temp dir after every run; crun
        # leaves nothing after a run that wrote nothing (no pid file, no Python hook, no empty
        # attempt or rank directories), Python workers included.
        tmp = os.path.join(self.dir, "tmp")
        os.mkdir(tmp)
        out = tempfile.mkdtemp(dir=self.dir)
        r = self.crun("--nproc-per-node", "2", ENV_DUMP, out,
                      env={"TMPDIR": tmp, "PYTHON_EXEC": sys.executable})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(glob.glob(os.path.join(out, "env_*.json"))), 2)
        self.assertEqual(os.listdir(tmp), [])
        # A failed run keeps its report (its path is printed) and, beside it, where its time
        # went (goodput.json and its timeline, goodput.html), and only that.
        r = self.crun("--nproc-per-node", "2", "--no-python", "false", env={"TMPDIR": tmp})
        self.assertEqual(r.returncode, 1, r.stderr)
        report = re.search(r"failure report written to (\S+)", r.stderr).group(1)
        files = sorted(os.path.relpath(os.path.join(d, f), tmp)
                       for d, _, names in os.walk(tmp) for f in names)
        beside = os.path.relpath(os.path.dirname(report), tmp)
        self.assertEqual(files, sorted([os.path.relpath(report, tmp),
                                        os.path.join(beside, "goodput.html"),
                                        os.path.join(beside, "goodput.json")]))
        # With --redirects, the logs stay where they were written; the user's --log-dir stays.
        logs = os.path.join(self.dir, "logs")
        r = self.crun("--nproc-per-node", "2", "--log-dir", logs, "--redirects", "1:1",
                      "--no-python", "echo", "hi", env={"TMPDIR": tmp})
        self.assertEqual(r.returncode, 0, r.stderr)
        kept = sorted(os.path.relpath(os.path.join(d, f), logs).split(os.sep)[2:]
                      for d, _, names in os.walk(logs) for f in names)
        self.assertEqual(kept, [["attempt_0", "1", "stdout.log"], ["goodput.html"],
                                ["goodput.json"]])
        r = self.crun("--nproc-per-node", "1", "--log-dir", logs, "--no-python", "true")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(os.listdir(logs)), 1, "the second run left a directory")

    def fake_dev(self, *indices):
        root = os.path.join(self.dir, "root")
        for name in ["nvidiactl", "nvidia-uvm"] + [f"nvidia{i}" for i in indices]:
            write(os.path.join(root, "dev", name))
        return root

    def workers_started(self, *args, env):
        out = tempfile.mkdtemp(dir=self.dir)
        r = self.crun(*args, ENV_DUMP, out, env=env)
        return r, len(glob.glob(os.path.join(out, "env_*.json")))

    def test_gpu_and_auto_count_the_gpus_the_workers_can_use(self):
        root = self.fake_dev(0, 1, 3)  # a gap, as after a GPU fell off the bus
        unset = {"CRUN_SYSTEM_ROOT": root, "PYTHON_EXEC": sys.executable}
        env = dict(os.environ, **unset)
        env.pop("CUDA_VISIBLE_DEVICES", None)
        r = subprocess.run([CRUN, "--nproc-per-node", "gpu", ENV_DUMP, self.dir],
                           capture_output=True, text=True, timeout=LIMIT_S, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(glob.glob(os.path.join(self.dir, "env_*.json"))), 3)
        for visible, expected in [("1,0", 2), ("2", 1), ("0,5,1", 1),
                                  ("GPU-8f0c1e2a-aaaa-bbbb-cccc-0123456789ab", 1)]:
            with self.subTest(visible=visible):
                r, n = self.workers_started("--nproc-per-node", "gpu",
                                            env=dict(unset, CUDA_VISIBLE_DEVICES=visible))
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(n, expected)
        r, n = self.workers_started("--nproc-per-node", "gpu",
                                    env=dict(unset, CUDA_VISIBLE_DEVICES="-1"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("CUDA_VISIBLE_DEVICES='-1' leaves no GPU visible", r.stderr)
        # auto: the GPUs when some are visible, else one worker per CPU.
        r, n = self.workers_started("--nproc-per-node", "auto",
                                    env=dict(unset, CUDA_VISIBLE_DEVICES="3,1"))
        self.assertEqual((r.returncode, n), (0, 2), r.stderr)
        r, n = self.workers_started("--nproc-per-node", "auto",
                                    env=dict(unset, CUDA_VISIBLE_DEVICES=""))
        self.assertEqual((r.returncode, n), (0, os.cpu_count()), r.stderr)

    def numa_root(self, cpu_a, cpu_b):
        """Two NUMA nodes on two sockets, one of our real CPUs each; GPUs 0,1 on node 0 and
        2,3 on node 1."""
        root = os.path.join(self.dir, "numa")
        sysd = os.path.join(root, "sys", "devices", "system")
        for node, cpu in ((0, cpu_a), (1, cpu_b)):
            write(f"{sysd}/node/node{node}/cpulist", str(cpu))
            write(f"{sysd}/cpu/cpu{cpu}/topology/physical_package_id", str(node))
            write(f"{sysd}/cpu/cpu{cpu}/topology/thread_siblings_list", str(cpu))
        for gpu, addr in enumerate(["0000:1b:00.0", "0000:1c:00.0", "0000:9a:00.0",
                                    "0000:9b:00.0"]):
            d = os.path.join(root, "sys", "bus", "pci", "devices", addr)
            write(f"{d}/vendor", "0x10de")
            write(f"{d}/class", "0x030200")
            write(f"{d}/numa_node", str(gpu // 2))
        return root

    def test_numa_binding_is_what_the_kernel_enforces(self):
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            self.skipTest("needs two CPUs")
        root = self.numa_root(cpus[0], cpus[1])
        # The memory nodes this machine lets us bind to (a one-node machine has only 0).
        libc_nodes = self.allowed_memory_nodes()
        out = tempfile.mkdtemp(dir=self.dir)
        r = self.crun("--nproc-per-node", "4", "--numa-binding", "node", AFFINITY, out,
                      env={"CRUN_SYSTEM_ROOT": root, "PYTHON_EXEC": sys.executable})
        self.assertEqual(r.returncode, 0, r.stderr)
        seen = {}
        for lr in range(4):
            with open(os.path.join(out, f"affinity_{lr}.json")) as f:
                seen[lr] = json.load(f)
        MPOL_DEFAULT, MPOL_BIND = 0, 2
        for lr in range(4):
            node = lr // 2
            self.assertEqual(seen[lr]["cpus"], str(cpus[node]), f"local rank {lr}")
            if node in libc_nodes:
                self.assertEqual((seen[lr]["policy"], seen[lr]["nodes"]), (MPOL_BIND, [node]))
            else:
                self.assertEqual(seen[lr]["policy"], MPOL_DEFAULT)
                self.assertIn(f"local rank {lr}: this process may not allocate from NUMA node(s) "
                              f"{node}", r.stderr)
        # exclusive: one core per node cannot be shared by its two GPUs.
        r = self.crun("--nproc-per-node", "2", "--numa-binding", "exclusive", AFFINITY, out,
                      env={"CRUN_SYSTEM_ROOT": root, "PYTHON_EXEC": sys.executable})
        self.assertEqual(r.returncode, 2)
        self.assertIn("--numa-binding exclusive: NUMA node 0 has 1 physical cores for 2 GPUs",
                      r.stderr)

    @staticmethod
    def allowed_memory_nodes():
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        mask = (ctypes.c_ulong * 16)()
        if libc.syscall(239, None, mask, 16 * 64, None, 4) != 0:  # MPOL_F_MEMS_ALLOWED
            return {0}
        return {i for i in range(16 * 64) if mask[i // 64] >> (i % 64) & 1}

    def test_filters_prefix_template_and_event_log(self):
        script = ("echo loss=1; echo plain; echo 'warn,x' >&2; echo 'warn y' >&2; "
                  "echo acc=2")
        logs = os.path.join(self.dir, "logs")
        r = self.crun("--nproc-per-node", "2", "--tee", "3", "--log-dir", logs,
                      "--rdzv-id", "f1", "--log-line-prefix-template", "${hostname}:${rank}: ",
                      "--duplicate-stdout-filters", "loss,acc", "--event-log-handler", "console",
                      "--no-python", "/bin/sh", "-c", script,
                      env={"PET_DUPLICATE_STDERR_FILTERS": "warn,,x"})
        self.assertEqual(r.returncode, 0, r.stderr)
        host = os.uname().nodename
        self.assertIn(f"{host}:1: plain", r.stdout)
        (node_dir,) = glob.glob(os.path.join(logs, "f1", "*_*"))
        with open(os.path.join(node_dir, "attempt_0", "filtered_stdout.log")) as f:
            self.assertEqual(sorted(f.read().splitlines()),
                             sorted(f"{host}:{rank}: {line}" for rank in (0, 1)
                                    for line in ("loss=1", "acc=2")))
        with open(os.path.join(node_dir, "attempt_0", "filtered_stderr.log")) as f:
            self.assertEqual(sorted(f.read().splitlines()),
                             [f"{host}:0: warn,x", f"{host}:1: warn,x"])
        events = [json.loads(l) for l in r.stderr.splitlines() if l.startswith('{"')]
        names = [e["name"] for e in events]
        self.assertEqual(names[0], "torchelastic.rendezvous.round")
        self.assertIn("torchelastic.worker.status.HEALTHY", names)
        self.assertEqual(names.count("torchelastic.worker.status.SUCCEEDED"), 3)  # 2 workers, agent
        self.assertEqual(events[-1]["source"], "AGENT")
        self.assertEqual(events[-1]["metadata"]["run_id"], "f1")
        # A role that is not UTF-8 (a variable's raw bytes) is replaced in the events, never a
        # crash of crun.
        r = self.crun("--role", "r\udcff", "--event-log-handler", "console", "--no-python",
                      "/bin/true")
        self.assertEqual(r.returncode, 0, r.stderr)
        events = [json.loads(l) for l in r.stderr.splitlines() if l.startswith('{"')]
        self.assertEqual(events[0]["metadata"]["role"], "r\ufffd")
        # The torchrun variable takes the same macros.
        r = self.crun("--nproc-per-node", "1", "--tee", "1", "--no-python", "/bin/echo", "hi",
                      env={"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${hostname}-${local_rank}] "})
        self.assertEqual(r.stdout.strip(), f"[{host}-0] hi")

    def static_node(self, rank, port, logs):
        cmd = [CRUN, "--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1",
               "--master-port", str(port), "--nproc-per-node", "1", "--log-dir", logs, "--tee",
               "1", "--no-python", "/bin/sh", "-c",
               'echo "node=$GROUP_RANK run=$TORCHELASTIC_RUN_ID err=$TORCHELASTIC_ERROR_FILE"']
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        return p

    def test_nodes_sharing_a_log_dir_and_reruns_keep_every_file(self):
        logs = os.path.join(self.dir, "shared-home-logs")
        outputs = []
        for run in range(2):  # the same command twice: a rerun must not overwrite the first
            port = free_port()
            nodes = [self.static_node(rank, port, logs) for rank in (0, 1)]
            for p in nodes:
                out, err = p.communicate(timeout=LIMIT_S)
                self.assertEqual(p.returncode, 0, err)
                outputs.append(out)
        # Static jobs: every node has the same run id, "none", as under torchrun.
        for out in outputs:
            self.assertRegex(out, r"node=[01] run=none err=")
        dirs = sorted(glob.glob(os.path.join(logs, "none", "*_*")))
        self.assertEqual(len(dirs), 4, dirs)
        host = os.uname().nodename
        for d in dirs:
            self.assertTrue(os.path.basename(d).startswith(host + "_"), d)
        contents = []
        for d in dirs:
            with open(os.path.join(d, "attempt_0", "0", "stdout.log")) as f:
                contents.append(f.read())
        self.assertEqual(sorted(c.split()[0] for c in contents),
                         ["node=0", "node=0", "node=1", "node=1"])
        # Each worker's error file lies in its own node's directory.
        errs = {re.search(r"err=(\S+)", c).group(1) for c in contents}
        self.assertEqual(len(errs), 4)

    def test_standalone_takes_an_elastic_range_as_torchrun_does(self):
        r = self.crun("--standalone", "--nnodes", "1:2", "--nproc-per-node", "2", ENV_DUMP,
                      self.dir, env={"PYTHON_EXEC": sys.executable})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--standalone: running one node", r.stderr)
        self.assertEqual(len(glob.glob(os.path.join(self.dir, "env_*.json"))), 2)

    def test_a_missing_torch_is_reported_with_the_interpreter(self):
        venv = os.path.join(self.dir, "venv-without-torch")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True,
                       timeout=LIMIT_S)
        script = os.path.join(self.dir, "train.py")
        write(script, "import torch\n")
        python = os.path.join(venv, "bin", "python")
        r = self.crun("--nproc-per-node", "1", script, env={"PYTHON_EXEC": python})
        self.assertEqual(r.returncode, 1)
        self.assertIn("No module named 'torch'", r.stderr)
        self.assertIn(f"hint      : the workers ran {python} (from PYTHON_EXEC), which cannot "
                      "import 'torch'; set PYTHON_EXEC", r.stderr)
        # Without PYTHON_EXEC: the python3 found on PATH, named with its path.
        env = dict(os.environ, PATH=os.path.join(venv, "bin") + ":" + os.environ["PATH"])
        env.pop("PYTHON_EXEC", None)
        self.assertTrue(os.path.exists(os.path.join(venv, "bin", "python3")))
        r = subprocess.run([CRUN, "--nproc-per-node", "1", script], capture_output=True,
                           text=True, timeout=LIMIT_S, env=env)
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"the workers ran {venv}/bin/python3 (python3 on PATH; set PYTHON_EXEC to "
                      "use another), which cannot import 'torch'", r.stderr)

    def test_torchrun_only_options_are_accepted(self):
        r = self.crun("--nproc-per-node", "1", "--start-method", "fork", "--logs-specs",
                      "DefaultLogsSpecs", "--event-log-handler", "null", "--monitor-interval",
                      "5", "--no-python", "/bin/true", env={"PET_START_METHOD": "forkserver"})
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.crun("--nproc-per-node", "1", "--no-python", "/bin/true",
                      env={"PET_START_METHOD": "threads"})
        self.assertEqual(r.returncode, 2)
        self.assertIn("--start-method 'threads'", r.stderr)

    def test_print_completion_gives_a_script_bash_accepts(self):
        r = self.crun("--print-completion", "bash")
        self.assertEqual(r.returncode, 0, r.stderr)
        b = subprocess.run(["bash", "-c", r.stdout + "\ncomplete -p crun"], capture_output=True,
                           text=True, timeout=LIMIT_S)
        self.assertEqual(b.returncode, 0, b.stderr)
        self.assertIn("--nproc-per-node", b.stdout)
        self.assertIn("--numa-binding", b.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
