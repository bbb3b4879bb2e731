"""`crun script.py` on one node with real processes and signals: the worker environment,
restarts, exit codes, signal forwarding, the grace period, and no survivors."""
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import unittest

CRUN = os.environ["CRUN_BIN"]
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "workers", "behave.py")
SIGNAL_PROBE = os.path.join(os.path.dirname(WORKER), "signal_probe.py")
LIMIT_S = 60

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from crun_testing import alive, proc_state, scratch_dir, signal_events, wait_for  # noqa: E402


class Launch(unittest.TestCase):
    def setUp(self):
        self.dir = scratch_dir(self, "crun-launch-")

    def crun(self, *args, nproc=2, worker_args=(), **kw):
        cmd = [CRUN, "--nproc-per-node", str(nproc), *args, WORKER, self.dir, *worker_args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT_S, **kw)

    def start(self, *args, nproc=2, worker_args=()):
        cmd = [CRUN, "--nproc-per-node", str(nproc), *args, WORKER, self.dir, *worker_args]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def run_dir(self, run_id):
        """This run's one log directory: <log-dir>/<run-id>/<host>_<random>."""
        dirs = glob.glob(f"{self.dir}/logs/{run_id}/*_*")
        self.assertEqual(len(dirs), 1, dirs)
        return dirs[0]

    def env(self, rank, attempt=0):
        with open(os.path.join(self.dir, f"env_{rank}_{attempt}.json")) as f:
            return json.load(f)

    def ready(self, n, attempt=0):
        wait_for(lambda: all(os.path.exists(os.path.join(self.dir, f"ready_{r}_{attempt}.json"))
                             for r in range(n)), f"{n} workers ready")
        pids = []
        for r in range(n):
            with open(os.path.join(self.dir, f"ready_{r}_{attempt}.json")) as f:
                pids.append(json.load(f))
        return pids

    def test_worker_environment_contract(self):
        r = self.crun("--rdzv-id", "job7", "--role", "trainer", nproc=3)
        self.assertEqual(r.returncode, 0, r.stderr)
        ports = set()
        for rank in range(3):
            e = self.env(rank)
            expected = {
                "LOCAL_RANK": str(rank), "RANK": str(rank), "GROUP_RANK": "0",
                "ROLE_RANK": str(rank), "ROLE_NAME": "trainer", "LOCAL_WORLD_SIZE": "3",
                "WORLD_SIZE": "3", "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": "3",
                "MASTER_ADDR": "127.0.0.1", "TORCHELASTIC_RESTART_COUNT": "0",
                "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "job7",
                "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                "OMP_NUM_THREADS": "1",
            }
            for k, v in expected.items():
                self.assertEqual(e.get(k), v, f"rank {rank}: {k}")
            # PyTorch 2.x warns on every rank about the old name: only the new one is set.
            self.assertNotIn("NCCL_ASYNC_ERROR_HANDLING", e)
            self.assertIn("TORCHELASTIC_ERROR_FILE", e)
            ports.add(e["MASTER_PORT"])
        self.assertEqual(len(ports), 1)
        self.assertIn("OMP_NUM_THREADS", r.stderr)

    def test_daemonised_descendants_end_with_the_job(self):
        daemonize = os.path.join(os.path.dirname(WORKER), "daemonize.py")
        # With the daemon holding crun's pipes (tee) or not; with crun's cgroup, and with
        # crun as the subreaper alone (CRUN_CGROUP=0, as where no cgroup can be made).
        for tee, cgroup in (("0", "1"), ("3", "1"), ("0", "0"), ("3", "0")):
            with self.subTest(tee=tee, cgroup=cgroup):
                out = tempfile.mkdtemp(dir=self.dir)
                r = subprocess.run([CRUN, "--nproc-per-node", "2", "--tee", tee, daemonize, out],
                                   capture_output=True, text=True, timeout=LIMIT_S,
                                   env=dict(os.environ, CRUN_CGROUP=cgroup))
                self.assertEqual(r.returncode, 0, r.stderr)
                pids = []
                for rank in range(2):
                    with open(os.path.join(out, f"daemon_{rank}.pid")) as f:
                        pids.append(int(f.read()))
                wait_for(lambda: not any(alive(p) for p in pids), "the daemons to be gone",
                         limit=10)
                self.assertIn("had left their worker's process group (setsid or daemonised)",
                              r.stderr)

    def test_an_orphan_that_ends_mid_job_is_reaped_at_once(self):
        # A worker starts a helper that outlives its parent (a subshell that exits at once), so
        # the helper comes to crun, the subreaper; the helper ends while the worker still runs.
        # crun must reap it then, not leave a zombie until the attempt ends (a job that runs
        # for days and starts such helpers would pile them up).
        d = self.dir
        script = ("(setsid sh -c 'echo $$ > %(d)s/h.tmp && mv %(d)s/h.tmp %(d)s/helper; "
                  "while [ ! -e %(d)s/go ]; do sleep 0.01; done' &); "
                  "while [ ! -e %(d)s/stop ]; do sleep 0.01; done" % {"d": d})
        for cgroup in ("1", "0"):
            with self.subTest(cgroup=cgroup):
                for f in ("helper", "go", "stop"):
                    if os.path.exists(os.path.join(d, f)):
                        os.remove(os.path.join(d, f))
                p = subprocess.Popen([CRUN, "--nproc-per-node", "1", "--no-python", "sh", "-c",
                                      script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=dict(os.environ, CRUN_CGROUP=cgroup))
                try:
                    wait_for(lambda: os.path.exists(os.path.join(d, "helper")), "the helper")
                    with open(os.path.join(d, "helper")) as f:
                        helper = int(f.read())

                    def parent():
                        with open(f"/proc/{helper}/stat") as f:
                            return int(f.read().rsplit(")", 1)[1].split()[1])
                    # The helper writes its pid before its subshell has exited; on a loaded
                    # machine the subshell's exit may come later (seen under ASan).
                    wait_for(lambda: parent() == p.pid,
                             "the helper to be crun's orphan (its subshell gone)", limit=10)
                    open(os.path.join(d, "go"), "w").close()
                    wait_for(lambda: proc_state(helper) is None,
                             "crun to reap its ended orphan while the job runs", limit=10)
                    self.assertIsNone(p.poll(), "the job still runs")
                finally:
                    open(os.path.join(d, "stop"), "w").close()
                    _, err = p.communicate(timeout=LIMIT_S)
                self.assertEqual(p.returncode, 0, err)

    def test_crash_restart_success_with_a_fresh_store(self):
        r = self.crun("--max-restarts", "2",
                      worker_args=["--fail-rank", "1", "--fail-attempt", "0", "--code", "3"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.env(0, 1)["TORCHELASTIC_RESTART_COUNT"], "1")
        self.assertNotEqual(self.env(1, 0)["MASTER_PORT"], self.env(1, 1)["MASTER_PORT"])
        self.assertFalse(os.path.exists(os.path.join(self.dir, "env_0_2.json")))
        self.assertIn("rank 1", r.stderr)

    def test_budget_exhausted_returns_the_root_cause_code(self):
        r = self.crun("--max-restarts", "1", worker_args=["--fail-rank", "1", "--code", "7"])
        self.assertEqual(r.returncode, 7, r.stderr)
        self.assertTrue(os.path.exists(os.path.join(self.dir, "env_1_1.json")))
        self.assertIn("rank 1 (local rank 1", r.stderr)
        self.assertIn("exit code 7", r.stderr)

    def test_sigterm_is_forwarded_and_reflected_in_the_exit_code(self):
        p = self.start(worker_args=["--mode", "wait"])
        self.ready(2)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=LIMIT_S)
        self.assertEqual(p.returncode, 128 + signal.SIGTERM, err)
        for rank in range(2):
            path = os.path.join(self.dir, f"signal_{rank}_0.json")
            # Seen once in CI (not reproduced in 160 runs under load): a rank without its file.
            # Say what crun reported and what the workers left, should it come back.
            self.assertTrue(os.path.exists(path),
                            f"rank {rank} recorded no signal; files {sorted(os.listdir(self.dir))};"
                            f" crun said:\n{err}")
            with open(path) as f:
                self.assertEqual(json.load(f)["signal"], signal.SIGTERM)

    def test_sigusr1_is_passed_on_as_a_notice_and_the_job_goes_on(self):
        # Slurm's --signal=USR1@60 style warning: the workers get it from crun, checkpoint and
        # exit 0 on their own, and the job is a success; crun stopped nobody.
        p, _ = self.probe_signalled("--exit-on", "SIGUSR1",
                                    crun_args=("--signals-to-handle", "SIGTERM,SIGUSR1"))
        p.send_signal(signal.SIGUSR1)
        _, err = p.communicate(timeout=LIMIT_S)
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("received SIGUSR1: passing it on to 2 workers", err)
        got = signal_events(self.dir, "signal")
        self.assertEqual(sorted(e["rank"] for e in got), [0, 1])
        for e in got:
            self.assertEqual((e["sig"], e["from_pid"]), ("SIGUSR1", p.pid))
        self.assertEqual(len(signal_events(self.dir, "saved")), 2)

    def probe_signalled(self, *probe_args, crun_args=()):
        """crun over two signal_probe workers, started; returns (crun, send) where send(sig)
        signals crun and returns once both workers have recorded that signal."""
        p = subprocess.Popen([CRUN, "--nproc-per-node", "2", *crun_args, SIGNAL_PROBE, self.dir,
                              *probe_args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: len(signal_events(self.dir, "start")) == 2, "2 workers started")

        def send(sig):
            before = len(signal_events(self.dir, "signal"))
            p.send_signal(sig)
            wait_for(lambda: len(signal_events(self.dir, "signal")) >= before + 2,
                     f"both workers to get {sig.name}")
        return p, send

    def test_a_repeated_sigterm_keeps_the_grace(self):
        # As Slurm does at a time limit: SIGTERM, then SIGTERM again. The workers still get
        # their whole grace to save (1 s each here).
        p, send = self.probe_signalled("--save-s", "1")
        send(signal.SIGTERM)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=LIMIT_S)
        self.assertEqual(p.returncode, 128 + signal.SIGTERM, err)
        self.assertIn("received SIGTERM again: the workers keep their grace period", err)
        self.assertEqual(len(signal_events(self.dir, "saved")), 2, err)

    def test_a_second_ctrl_c_ends_the_grace(self):
        p, send = self.probe_signalled("--exit-on", "SIGINT", "--save-s", "600")
        send(signal.SIGINT)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=LIMIT_S)
        self.assertEqual(p.returncode, 128 + signal.SIGINT, err)
        self.assertIn("received SIGINT again: SIGKILL to the workers now", err)
        self.assertEqual(signal_events(self.dir, "saved"), [])

    def test_worker_ignoring_sigterm_is_killed_after_the_grace(self):
        p = self.start("--shutdown-timeout", "0.3", worker_args=["--mode", "ignore-term"])
        pids = [x["worker"] for x in self.ready(2)]
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=LIMIT_S)
        self.assertEqual(p.returncode, 128 + signal.SIGTERM, err)
        self.assertIn("SIGKILL", err)
        for pid in pids:
            self.assertFalse(alive(pid))

    def test_sigkill_of_crun_leaves_no_worker_or_grandchild(self):
        p = self.start(worker_args=["--mode", "grandchild"])
        procs = self.ready(2)
        pids = [x["worker"] for x in procs] + [x["grandchild"] for x in procs]
        self.assertTrue(all(alive(pid) for pid in pids))
        p.kill()
        p.communicate(timeout=LIMIT_S)
        wait_for(lambda: not any(alive(pid) for pid in pids), "every worker and grandchild gone")

    def test_bad_input_exits_2_naming_the_value_and_starts_nothing(self):
        plain = os.path.join(self.dir, "not_a_program.txt")
        with open(plain, "w") as f:
            f.write("data\n")
        os.chmod(plain, 0o644)
        unrunnable_elf = os.path.join(self.dir, "train_without_x_bit")
        with open("/bin/true", "rb") as src, open(unrunnable_elf, "wb") as dst:
            dst.write(src.read())
        os.chmod(unrunnable_elf, 0o644)
        cases = [
            (["--nproc-per-node", "two", WORKER, self.dir], "two"),
            (["--no-such-flag", WORKER], "--no-such-flag"),
            (["--max-restarts", "-1", WORKER], "-1"),
            (["--nnodes", "2", WORKER, self.dir], "the static backend needs --master-port"),
            (["--nnodes", "x", WORKER, self.dir], "--nnodes 'x'"),
            (["missing_script.py"], "missing_script.py"),
            (["--no-python", plain], plain),
            ([unrunnable_elf], "is a native program but not executable"),
            (["--signals-to-handle", "SIGNOPE", WORKER], "SIGNOPE"),
            ([], "no training script"),
        ]
        if not os.path.exists("/dev/nvidia0"):  # CI machines have no GPU
            cases.append((["--nproc-per-node", "gpu", WORKER, self.dir], "no GPU"))
        for args, needle in cases:
            with self.subTest(args=args):
                r = subprocess.run([CRUN, *args], capture_output=True, text=True, timeout=LIMIT_S)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(needle, r.stderr)
        self.assertEqual(glob.glob(os.path.join(self.dir, "env_*")), [])  # nothing started

    def test_no_python_runs_a_binary_and_substitutes_local_rank(self):
        r = subprocess.run([CRUN, "--nproc-per-node", "2", "--no-python", "sh", "-c",
                            'echo "lr=${local_rank} rank=$RANK" >> ' + self.dir + "/out"],
                           capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(self.dir, "out")) as f:
            self.assertEqual(sorted(f.read().split("\n")[:2]), ["lr=0 rank=0", "lr=1 rank=1"])

    def test_native_program_runs_as_itself_without_no_python(self):
        # `sh` is found on PATH and is an ELF file: Python could not run it, so crun does.
        r = subprocess.run([CRUN, "--nproc-per-node", "2", "sh", "-c",
                            'echo "rank=$RANK" >> ' + self.dir + "/out"],
                           capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(self.dir, "out")) as f:
            self.assertEqual(sorted(f.read().split()), ["rank=0", "rank=1"])
        # A program in the working directory, named without a path, is that one, not PATH's:
        # here ./true is a copy of `false`.
        local = os.path.join(self.dir, "true")
        with open("/bin/false", "rb") as src, open(local, "wb") as dst:
            dst.write(src.read())
        os.chmod(local, 0o755)
        r = subprocess.run([CRUN, "--nproc-per-node", "1", "true"], cwd=self.dir,
                           capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("exit code 1", r.stderr)

    def test_tee_prefixes_console_lines_and_writes_plain_files(self):
        r = self.crun("-t", "3", "--log-dir", self.dir + "/logs", "--rdzv-id", "job1",
                      worker_args=["--mode", "chatty"])
        self.assertEqual(r.returncode, 0, r.stderr)
        for rank in range(2):
            self.assertIn(f"[default{rank}]:out rank={rank} line=2", r.stdout)
            self.assertIn(f"[default{rank}]:err rank={rank} line=2", r.stderr)
            with open(f"{self.run_dir('job1')}/attempt_0/{rank}/stdout.log") as f:
                self.assertTrue(f.readline().startswith(f"out rank={rank} line=0"))

    def test_redirect_keeps_output_off_the_console(self):
        r = self.crun("-r", "3", "--log-dir", self.dir + "/logs", "--rdzv-id", "job2",
                      worker_args=["--mode", "chatty"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("line=", r.stdout + r.stderr)
        with open(f"{self.run_dir('job2')}/attempt_0/1/stderr.log") as f:
            self.assertEqual(len(f.readlines()), 3)

    def test_local_ranks_filter(self):
        r = self.crun("--local-ranks-filter", "1", "-t", "1", worker_args=["--mode", "chatty"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("rank=1", r.stdout)
        self.assertNotIn("rank=0", r.stdout)
        r = self.crun("--local-ranks-filter", "5")
        self.assertEqual(r.returncode, 2)
        self.assertIn("'5'", r.stderr)

    def test_lines_never_interleave_mid_line(self):
        r = self.crun("-t", "3", nproc=4, worker_args=["--mode", "chatty", "--lines", "2000"])
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = [l for l in r.stdout.splitlines() if "line=" in l]
        self.assertEqual(len(lines), 4 * 2000)
        for line in lines:
            self.assertRegex(line, r"^\[default(\d)\]:out rank=\1 line=\d+ x{200}$")

    def test_failure_report_without_error_file_shows_last_stderr_lines(self):
        r = self.crun("--log-dir", self.dir + "/logs", "--rdzv-id", "job3",
                      worker_args=["--mode", "chatty", "--fail-rank", "1", "--code", "4"])
        self.assertEqual(r.returncode, 4)
        report = r.stderr[r.stderr.index("Root cause"):]
        self.assertIn("rank      : 1 (local rank 1", report)
        self.assertIn("exit      : exit code 4", report)
        self.assertIn("error file: <none written>", report)
        self.assertIn("err rank=1 line=2", report)
        with open(f"{self.run_dir('job3')}/failure.json") as f:
            j = json.load(f)
        self.assertEqual(j["failures"][0]["rank"], 1)
        self.assertEqual(j["failures"][0]["exit_code"], 4)
        self.assertTrue(any("line=2" in l for l in j["failures"][0]["stderr_tail"]))

    def test_failure_report_uses_torchelastic_error_file(self):
        parent_error = os.path.join(self.dir, "crun_error.json")
        env = dict(os.environ, PYTHON_EXEC="/usr/bin/python3", TORCHELASTIC_ERROR_FILE=parent_error)
        record = os.path.join(os.path.dirname(WORKER), "record_fail.py")
        r = subprocess.run([CRUN, "--nproc-per-node", "2", "--log-dir", self.dir + "/logs",
                            "--rdzv-id", "job4", record],
                           capture_output=True, text=True, timeout=LIMIT_S, env=env)
        self.assertEqual(r.returncode, 1, r.stderr)
        report = r.stderr[r.stderr.index("Root cause"):]
        self.assertIn(f"error file: {self.run_dir('job4')}/attempt_0/1/error.json", report)
        self.assertIn("error     : ValueError: intentional failure on rank 1", report)
        self.assertIn("traceback :", report)
        self.assertIn("raise ValueError", report)
        with open(parent_error) as f:
            copied = json.load(f)
        self.assertEqual(copied["message"]["errorCode"], 1)
        self.assertIn("intentional failure", copied["message"]["message"])

    def test_virtual_local_rank(self):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="4,5")
        r = subprocess.run([CRUN, "--nproc-per-node", "2", "--virtual-local-rank", WORKER,
                            self.dir], capture_output=True, text=True, timeout=LIMIT_S, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        for rank, gpu in ((0, "4"), (1, "5")):
            self.assertEqual(self.env(rank)["LOCAL_RANK"], "0")
            self.assertEqual(self.env(rank)["RANK"], str(rank))
            self.assertEqual(self.env(rank)["CUDA_VISIBLE_DEVICES"], gpu)

    def test_run_path_runs_the_script_through_runpy(self):
        r = self.crun("--run-path", worker_args=["--fail-rank", "1", "--code", "5"])
        self.assertEqual(r.returncode, 5, r.stderr)
        self.assertEqual(self.env(1)["RANK"], "1")  # written before it failed

    def test_local_addr_is_the_store_address(self):
        r = self.crun("--local-addr", "127.0.0.3")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.env(1)["MASTER_ADDR"], "127.0.0.3")

    def test_exec_failure_is_reported_with_the_shells_code(self):
        broken = os.path.join(self.dir, "broken.sh")
        with open(broken, "w") as f:
            f.write("#!/nonexistent/interpreter\n")
        os.chmod(broken, 0o755)  # executable, but exec fails: its interpreter does not exist
        r = subprocess.run([CRUN, "--nproc-per-node", "2", "--no-python", broken],
                           capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(r.returncode, 127, r.stderr)
        self.assertIn(f"cannot start '{broken}'", r.stderr)

    def test_version_and_help(self):
        r = subprocess.run([CRUN, "--version"], capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(r.returncode, 0)
        self.assertIn("crun 0.1.0", r.stdout)
        r = subprocess.run([CRUN, "--help"], capture_output=True, text=True, timeout=LIMIT_S)
        for flag in ["--nproc-per-node", "--max-restarts", "--shutdown-timeout", "--no-python"]:
            self.assertIn(flag, r.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
