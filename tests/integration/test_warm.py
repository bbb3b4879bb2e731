"""Warm starts (`crun --warm`, docs/warm.md) against cold ones, with real processes and stock
PyTorch in the template: a warm worker must be what a cold start makes (environment at both
levels, argv, sys.path, cwd, process group, signals, cgroup, stdin, descriptors), end the same
way (exit codes, signals, tracebacks in the failure report), restart, survive its template's
death, and say which module a template could not import. Run for each interpreter in
TORCH_PYTHONS (Debian's PyTorch 1.13, PyPI's 2.x).

Two cases at once (tests/pylib/lanes.py): nearly all of a case's time is one process (a
template, or a cold worker with --compute) importing torch on one core, so one case leaves the
other core idle. Cases share nothing but the machine: each has its own scratch directory,
socket and crun, and finds templates and spares among its own crun's children. Every wait is
for something observable (a connection, a process gone, a line in a log), with a deadline."""
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import unittest

CRUN = os.environ["CRUN_BIN"]
HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "..", "workers")
PROBE = os.path.join(WORKERS, "warm_probe.py")
PYTHONS = [p for p in os.environ.get("TORCH_PYTHONS", "python3").split(",") if p]
LIMIT_S = 180

sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from crun_testing import (alive, processes_mentioning, scratch_dir, wait_for,  # noqa: E402
                          whole_lines)
import lanes  # noqa: E402

# What names one process or one descriptor, and may differ between any two starts.
PER_PROCESS = {"pid", "ppid", "sid", "started_ns", "cgroup", "fd_count", "warm"}
PER_PROCESS_ENV = {"CRUN_HEARTBEAT_FD", "CRUN_STACKS_FD", "TORCHELASTIC_RUN_ID", "MASTER_PORT",
                   "CRUN_ATTEMPT_LOG_DIR", "TORCHELASTIC_ERROR_FILE", "CRUN_SNAPSHOT_SOCKET"}


def comparable(report):
    r = {k: v for k, v in report.items() if k not in PER_PROCESS}
    for key in ("env", "c_env", "proc_env"):
        r[key] = {k: v for k, v in r[key].items() if k not in PER_PROCESS_ENV}
    # A worker starts with crun's hook directory (one per run) first on PYTHONPATH; the hook
    # takes it off os.environ, not off what /proc shows.
    hook, _, rest = r["proc_env"].get("PYTHONPATH", "").partition(os.pathsep)
    if hook.endswith("/python"):
        r["proc_env"]["PYTHONPATH"] = os.pathsep.join(["<crun's hook>", *rest.split(os.pathsep)])
    return without_module_dir(r)


def without_module_dir(report):
    """The report with crun's crun_worker directory (one per run, which stays on the path) in
    sys.path and PYTHONPATH named alike for every run."""
    def named(p):
        return "<crun's module>" if p.endswith("/python-sdk") else p
    r = dict(report)
    if "path" in r:
        r["path"] = [named(p) for p in r["path"]]
    for key in ("env", "c_env", "proc_env"):
        if key in r and "PYTHONPATH" in r[key]:
            r[key] = dict(r[key], PYTHONPATH=os.pathsep.join(
                named(p) for p in r[key]["PYTHONPATH"].split(os.pathsep)))
    return r


class Warm(unittest.TestCase):
    def setUp(self):
        self.dir = scratch_dir(self, "crun-warm-")

    def crun(self, python, *args, warm=True, worker=(PROBE,), cwd=None, nproc=2, stdin=None,
             env=None):
        """Runs crun to its end; returns (CompletedProcess-like with .pid, output dir)."""
        out = tempfile.mkdtemp(dir=self.dir)
        cmd = [CRUN, "--nproc-per-node", str(nproc), "--log-dir", os.path.join(out, "logs"),
               *(["--warm"] if warm else []), *args, *worker, out]
        e = dict(os.environ, PYTHON_EXEC=python, **(env or {}))
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=cwd, env=e, stdin=stdin if stdin is not None else subprocess.DEVNULL)
        try:
            p.stdout_text, p.stderr = p.communicate(timeout=LIMIT_S)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
        return p, out

    def reports(self, out, attempt=0, n=2):
        got = []
        for rank in range(n):
            with open(os.path.join(out, f"report_{rank}_{attempt}.json")) as f:
                got.append(json.load(f))
        return got

    def waiting_job(self, python, max_restarts):
        """crun --warm running 2 probe workers that wait for a byte on a Unix socket (b"x":
        fail); returns (its Popen, the socket's listener, the output directory, its path)."""
        sock_path = os.path.join(self.dir, "go.sock")
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(sock_path)
        listener.listen(8)
        listener.settimeout(LIMIT_S)
        out = tempfile.mkdtemp(dir=self.dir)
        # Its attempts fail alike before any step, by design: no crash loop here
        # (docs/health.md).
        cmd = [CRUN, "--nproc-per-node", "2", "--warm", "--max-restarts", str(max_restarts),
               "--max-restarts-without-progress", "0", "--log-dir", os.path.join(out, "logs"), PROBE, out, "--then",
               f"wait-for:{sock_path}"]
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, env=dict(os.environ, PYTHON_EXEC=python))
        return p, listener, out, sock_path

    def end_waiting_job(self, p, listener, sock_path):
        """What follows a waiting_job, passed or failed: crun ended, the socket gone."""
        if p.poll() is None:
            p.kill()
            p.communicate()
        listener.close()
        os.unlink(sock_path)

    def for_each_python(self, fn):
        for python in PYTHONS:
            with self.subTest(python=python):
                fn(python)

    # ---- a warm worker is what a cold start makes ------------------------------------------

    def test_a_restart_forks_from_spares_which_die_with_their_template(self):
        """Once attempt 0 runs, the template forks one spare per worker; the restart hands each
        worker to a spare (the spares are gone, the workers are warm and crun's children); new
        spares follow, and they die with their template, SIGKILLed."""
        def check(python):
            p, listener, out, sock_path = self.waiting_job(python, 1)
            seen = []
            try:
                conns = [listener.accept()[0] for _ in range(2)]
                template = templates_of(p.pid)
                self.assertEqual(len(template), 1, template)
                wait_for(lambda: len(spares_of(template[0])) == 2, "two spares")
                first = spares_of(template[0])
                seen += first
                conns[0].send(b"x")  # attempt 0 fails: the restart takes the spares
                conns = [listener.accept()[0] for _ in range(2)]
                wait_for(lambda: not any(alive(s) for s in first),
                         "the spares gone into the restart's workers")
                wait_for(lambda: len(spares_of(template[0])) == 2, "two new spares")
                second = spares_of(template[0])
                seen += second
                self.assertFalse(set(first) & set(second))
                os.kill(template[0], signal.SIGKILL)
                wait_for(lambda: not any(alive(s) for s in second),
                         "the spares gone with their template")
                conns[1].send(b"x")
                _, err = p.communicate(timeout=LIMIT_S)
            finally:
                self.end_waiting_job(p, listener, sock_path)
            self.assertEqual(p.returncode, 5, err)
            cgroups = "/attempt-" in self.reports(out, 0)[0]["cgroup"]  # where crun has them
            for report in self.reports(out, 1):
                self.assertTrue(report["warm"], err)
                self.assertEqual(report["ppid"], p.pid, "the warm worker is not crun's child")
                if cgroups:  # the spare moved there before it forked the worker
                    self.assertTrue(report["cgroup"].endswith("/attempt-1"), report["cgroup"])
            self.assertEqual(processes_mentioning(out), [])
            self.assertEqual([s for s in seen if alive(s)], [])
        self.for_each_python(check)

    def test_a_warm_worker_is_what_a_cold_start_makes(self):
        """Everything a worker can see of its start matches a cold one's, crun's own stdin (a
        file here) included: the template's stdin is not the worker's."""
        def check(python):
            path = os.path.join(self.dir, "stdin.txt")
            with open(path, "w") as f:
                f.write("x\n")
            with open(path) as f:
                cold, cold_out = self.crun(python, warm=False, stdin=f)
            with open(path) as f:
                warm, warm_out = self.crun(python, stdin=f)
            self.assertEqual(cold.returncode, 0, cold.stderr)
            self.assertEqual(warm.returncode, 0, warm.stderr)
            self.assertEqual(processes_mentioning(warm_out), [])
            self.assertEqual(glob.glob(os.path.join(warm_out, "logs", "**", "crun_warm.py"),
                                       recursive=True), [], "crun's own file stayed")
            for c, w in zip(self.reports(cold_out), self.reports(warm_out)):
                self.assertFalse(c["warm"])
                self.assertTrue(w["warm"], "the worker was not forked from the template")
                self.assertEqual((c["stdin"], w["stdin"]), (path, path))
                self.assertEqual(c["ppid"], cold.pid)
                self.assertEqual(w["ppid"], warm.pid, "the warm worker is not crun's child")
                self.assertTrue(w["own_group"])
                self.assertEqual(w["threads"], 1)
                self.assertEqual(set(w["env"]), set(c["env"]))
                self.assertEqual(w["env"], w["c_env"], "os.environ and the C environment differ")
                # What others see in /proc is the worker's environment, not the template's
                # (compared with a cold worker's below).
                self.assertNotIn("CRUN_WARM_ROOM", w["proc_env"])
                # In the attempt's cgroup, as a cold worker (where crun has cgroups).
                self.assertEqual("/attempt-" in w["cgroup"], "/attempt-" in c["cgroup"],
                                 (w["cgroup"], c["cgroup"]))
                cw = same_run(comparable(c), cold_out, warm_out)
                ww = comparable(w)
                for key in cw:
                    self.assertEqual(ww[key], cw[key], key)
        self.for_each_python(check)

    def test_one_worker_per_node_starts_warm_with_the_threads_of_a_cold_one(self):
        """One worker: crun sets no OMP_NUM_THREADS, so torch's import starts numpy's BLAS
        pool in the template (on a GPU machine with 16 CPUs, 15 threads). The template must
        still fork, and the worker compute with the threads a cold one has."""
        def check(python):
            reports = []
            for warm in (False, True):
                r, out = self.crun(python, warm=warm, nproc=1, worker=(PROBE, "--compute"))
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertNotIn("warm starts are off", r.stderr)
                reports.append(self.reports(out, n=1)[0])
            cold, warm = reports
            self.assertTrue(warm["warm"], "the worker was not forked from the template")
            self.assertNotIn("OMP_NUM_THREADS", warm["env"])
            self.assertEqual(warm["threads"], 1)
            self.assertEqual(warm["compute"], cold["compute"])
        self.for_each_python(check)

    def test_module_and_run_path_modes(self):
        def check(python):
            for mode in (["-m"], ["--run-path"]):
                worker = ("warm_probe",) if mode == ["-m"] else (PROBE,)
                cold, cold_out = self.crun(python, *mode, warm=False, worker=worker, cwd=WORKERS)
                warm, warm_out = self.crun(python, *mode, worker=worker, cwd=WORKERS)
                self.assertEqual(cold.returncode, 0, cold.stderr)
                self.assertEqual(warm.returncode, 0, warm.stderr)
                c = without_module_dir(same_run(self.reports(cold_out)[0], cold_out, warm_out))
                w = without_module_dir(self.reports(warm_out)[0])
                self.assertTrue(w["warm"])
                for key in ("argv", "orig_argv", "path0", "path", "name", "file", "spec", "cwd"):
                    self.assertEqual(w[key], c[key], (mode, key))
        self.for_each_python(check)

    # ---- it ends as a cold start would ------------------------------------------------------

    def test_exit_codes_signals_and_tracebacks_match_cold(self):
        def check(python):
            for then, code in (("exit:3", 3), ("signal:11", 139), ("interrupt", 130),
                               ("raise", 1)):
                results = []
                for warm in (False, True):
                    r, out = self.crun(python, warm=warm, worker=(PROBE, "--then", then),
                                       nproc=1)
                    results.append((r, out))
                    self.assertEqual(r.returncode, 1 if then == "raise" else code,
                                     (then, warm, r.stderr[-2000:]))
                (cold, cold_out), (warm, warm_out) = results
                if then == "raise":
                    tb_cold = traceback_of(cold.stderr)
                    tb_warm = traceback_of(warm.stderr)
                    self.assertIn("ValueError: intentional failure on rank 0", tb_cold)
                    self.assertEqual(tb_warm, tb_cold)
        self.for_each_python(check)

    # ---- restarts and the template's own life ------------------------------------------------

    def test_restarts_are_warm_and_survive_the_template_s_death(self):
        """Attempt 0 is warm; its template is SIGKILLed; attempt 1 starts cold with one warning;
        once the new template says it is ready, attempt 2 is warm again."""
        def check(python):
            p, listener, out, sock_path = self.waiting_job(python, 2)
            try:
                # Attempt 0: both ranks wait on the socket; kill the template, then fail them.
                conns = [listener.accept()[0] for _ in range(2)]
                template = templates_of(p.pid)
                self.assertEqual(len(template), 1, template)
                os.kill(template[0], signal.SIGKILL)
                wait_for(lambda: not alive(template[0]),
                         "the template gone")
                conns[0].send(b"x")
                # Attempt 1 starts cold; let it fail once a new template is ready.
                conns = [listener.accept()[0] for _ in range(2)]
                wait_for(lambda: ready_count(out) == 2, "the new template ready", limit=120)
                conns[1].send(b"x")
                # Attempt 2: warm again; it fails too, and the job ends after 2 restarts.
                conns = [listener.accept()[0] for _ in range(2)]
                conns[0].send(b"x")
                _, err = p.communicate(timeout=LIMIT_S)
            finally:
                self.end_waiting_job(p, listener, sock_path)
            self.assertEqual(p.returncode, 5, err)
            warm = [self.reports(out, a)[0]["warm"] for a in range(3)]
            self.assertEqual(warm, [True, False, True], err)
            self.assertEqual(err.count("the warm template ended with signal 9 (SIGKILL)"), 1, err)
            self.assertEqual(processes_mentioning(out), [])
        self.for_each_python(check)

    def test_a_module_that_fails_in_the_template_is_named_and_workers_start_cold(self):
        def check(python):
            r, out = self.crun(python, "--warm-modules", "json,crun_no_such_module")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("module 'crun_no_such_module' failed in the template", r.stderr)
            self.assertIn("No module named 'crun_no_such_module'", r.stderr)
            self.assertEqual([x["warm"] for x in self.reports(out)], [False, False])
        self.for_each_python(check)

    def test_bad_warm_modules_are_refused_naming_them(self):
        r = subprocess.run([CRUN, "--warm", "--warm-modules", "torch,bad-name", PROBE, self.dir],
                           capture_output=True, text=True, timeout=LIMIT_S)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("'bad-name' is not a Python module name", r.stderr)
        self.assertEqual(os.listdir(self.dir), [])

    def test_native_programs_start_cold_with_one_line(self):
        r = subprocess.run([CRUN, "--warm", "--no-python", "true"], capture_output=True,
                           text=True, timeout=LIMIT_S)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr.count("--warm applies to Python workers"), 1, r.stderr)

    def test_the_warm_variants_witness_tells_warm_workers_from_cold_ones(self):
        """tests/warm_variant.py, which runs suites again warm, must fail a suite whose workers
        fell back to a cold start, and pass one whose workers all started warm."""
        variant = [sys.executable, os.path.join(HERE, "..", "warm_variant.py"), "--", CRUN,
                   "--nproc-per-node", "2"]
        env = dict(os.environ, PYTHON_EXEC=PYTHONS[0])
        for extra, rc, says in (([], 0, "2 worker(s) started warm, 0 cold"),
                                (["--warm-modules", "crun_no_such_module"], 1,
                                 "0 worker(s) started warm, 2 cold")):
            with self.subTest(extra=extra):
                out = tempfile.mkdtemp(dir=self.dir)
                r = subprocess.run([*variant, *extra, PROBE, out], capture_output=True,
                                   text=True, timeout=LIMIT_S, env=env)
                self.assertEqual(r.returncode, rc, r.stdout + r.stderr)
                self.assertIn(says, r.stdout, r.stdout + r.stderr)


def same_run(report, cold_out, warm_out):
    """A cold run's report as the warm run's would read: its output directory renamed."""
    return json.loads(json.dumps(report).replace(cold_out, warm_out))


def traceback_of(stderr):
    """The traceback lines of the failure report in crun's stderr."""
    lines = stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line)
    body = [line.split("]:", 1)[-1].strip() for line in lines[start:]]
    end = next(i for i, line in enumerate(body) if line.startswith("ValueError:"))
    return "\n".join(body[:end + 1])


def children_of(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def live_children(pid, matches):
    """The live children of `pid` whose command line `matches` (bytes -> bool)."""
    out = []
    for child in children_of(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                cmdline = f.read()
        except (FileNotFoundError, ProcessLookupError):  # gone before, or while, it was read
            continue
        if matches(cmdline) and alive(child):
            out.append(child)
    return out


def templates_of(crun_pid):
    """crun's live warm template processes."""
    return live_children(crun_pid, lambda cmdline: b"crun_warm.py" in cmdline)


def spares_of(template):
    """The template's live spares (template.py)."""
    return live_children(template, lambda cmdline: cmdline.startswith(b"crun warm spare"))


def ready_count(out):
    """How many templates have said they are ready, in the log they share (whole lines)."""
    logs = glob.glob(os.path.join(out, "logs", "**", "warm", "template.log"), recursive=True)
    return sum(1 for path in logs for line in whole_lines(path) if " ready" in line)


if __name__ == "__main__":
    lanes.main(2)
