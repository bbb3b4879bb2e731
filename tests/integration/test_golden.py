"""What users see, byte for byte, against the set recorded in tests/golden/: every command's
--help, each flag's refusal of bad values (the exit status and the whole message), a failure
report and its failure.json, and `crun status` (JSON and table). The help and the refusals come
from tables that move (issue 76); this holds them still. Real processes; the node's host name is
pinned in a UTS namespace, and times, pids, ports and scratch paths are masked.

  python3 tests/integration/test_golden.py --update   records the set anew (review the diff)
"""
import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import unittest

CRUN = os.environ.get("CRUN_BIN", "")
HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "golden")
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from crun_testing import free_port, scratch_dir, wait_for  # noqa: E402

HOST = "golden-host"
LIMIT_S = 30
COMMANDS = ["", "rendezvous", "status", "store", "stacks"]
# Values tried on every option that takes one; a refusal (exit 2 within a second) is recorded.
BAD_VALUES = ["", "bogus", "-1", "nan", "0", "99999999999999999999"]
# What follows the option, so that an accepted value still ends in a refusal, not a run.
TAILS = {"": ["/nonexistent/none.py"], "status": [], "store": [], "rendezvous": [],
         "stacks": []}
FAILING_WORKER = """import os, time
if os.environ["RANK"] == "1":
    raise ValueError("rank one fails on purpose")
time.sleep(60)  # until crun stops it: rank 0 is always ended by SIGTERM
"""


def in_uts(args):
    """`args` run with the host name pinned (root: a UTS namespace of its own)."""
    return ["unshare", "--uts", "sh", "-c", f'hostname {HOST} && exec "$@"', "sh", *args]


def mask(text, scratch=None):
    """The parts that differ from run to run, masked: the binary's path, times, pids, ports,
    the run directory's random suffix and the scratch directory."""
    text = text.replace(CRUN, "crun")
    if scratch:
        text = text.replace(scratch, "<dir>")
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z?", "<time>", text)
    text = re.sub(r"(pid\s*:? )\d+", r"\1<pid>", text)
    text = re.sub(r'("pid": )\d+', r"\1<pid>", text)
    text = re.sub(r"#\d+( *)", lambda m: "#<pid>" + " " * max(1, len(m.group(0)) - 6)
                  if m.group(1) else "#<pid>", text)
    text = re.sub(r"(127\.0\.0\.1:)\d+", r"\1<port>", text)
    text = re.sub(rf"({HOST}_)[A-Za-z0-9]{{6}}", r"\1XXXXXX", text)
    text = re.sub(r'("last_heartbeat_ms_ago": )\d+', r"\1<ms>", text)
    # The goodput ledger's times: its seconds by category and the summary's.
    text = re.sub(r'("(training|redone|starting|detecting|restarting|reloading|waiting)": )'
                  r'[0-9.]+', r"\1<s>", text)
    text = re.sub(r"wall time [0-9.]+ s", "wall time <s>", text)
    # The table's heartbeat column keeps its width: "165 ms ago   " -> "<ms> ms ago  ".
    return re.sub(r"\b\d+ ms ago( *)",
                  lambda m: "<ms> ms ago" + " " * max(1, len(m.group(0)) - 11), text)


def options_of(command):
    """The long options of `crun [command] --help` that take a value."""
    page = subprocess.run([CRUN, *([command] if command else []), "--help"],
                          capture_output=True, text=True, timeout=LIMIT_S).stdout
    found = []
    for line in page.splitlines():
        m = re.match(r"\s+(?:-\w,)?(--[\w-]+)(?:,--\w+)* ([A-Z][A-Z:]*)\b", line)
        if m and m.group(1) != "--print-completion":
            found.append(m.group(1))
    return found


def run(args, cwd, timeout=LIMIT_S):
    r = subprocess.run([CRUN, *args], capture_output=True, text=True, timeout=timeout,
                       cwd=cwd, env=dict(os.environ, TMPDIR=cwd))
    return {"args": args, "exit": r.returncode, "stdout": mask(r.stdout),
            "stderr": mask(r.stderr)}


def help_pages(cwd):
    return [run([*([c] if c else []), "--help"], cwd) for c in COMMANDS]


def discover_refusals(cwd):
    """Every (option, bad value) that crun refuses at once: exit 2 within a second."""
    cases = []
    for command in COMMANDS:
        for option in options_of(command):
            for value in BAD_VALUES:
                args = [*([command] if command else []), option, value, *TAILS[command]]
                try:
                    case = run(args, cwd, timeout=1)
                except subprocess.TimeoutExpired:
                    continue  # accepted: it serves; not a refusal
                if case["exit"] == 2:
                    cases.append(case)
    return cases


def failed_job(scratch):
    """A job whose rank 1 fails, on a `crun rendezvous` daemon: its report, failure.json, and
    `crun status` (JSON and table) after it."""
    with open(os.path.join(scratch, "fail.py"), "w") as f:
        f.write(FAILING_WORKER)
    port = free_port()
    daemon = subprocess.Popen([CRUN, "rendezvous", "--host", "127.0.0.1", "--port", str(port),
                               "--log-level", "warn"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        ready, _, _ = select.select([daemon.stdout], [], [], LIMIT_S)
        assert ready and "listening" in daemon.stdout.readline(), "the daemon did not start"
        job = subprocess.run(in_uts([CRUN, "--nnodes", "1", "--nproc-per-node", "2",
                                     "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
                                     "golden", "--redirects", "3", "--log-dir", "logs",
                                     "fail.py"]),
                             capture_output=True, text=True, timeout=LIMIT_S, cwd=scratch)
        status = [subprocess.run([CRUN, "status", "--rdzv-endpoint", f"127.0.0.1:{port}",
                                  *extra], capture_output=True, text=True, timeout=LIMIT_S)
                  for extra in (["--json"], [])]
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=LIMIT_S)
        daemon.stdout.close()
    [report] = [os.path.join(d, "failure.json") for d, _, files in os.walk(scratch)
                if "failure.json" in files]
    with open(report) as f:
        failure_json = f.read()
    return {"report.txt": f"exit {job.returncode}\n{mask(job.stderr, scratch)}",
            "failure.json": mask(failure_json, scratch) + "\n",
            "status.json": mask(status[0].stdout, scratch),
            "status.txt": mask(status[1].stdout, scratch)}


def as_text(cases):
    return "".join(f"$ crun {shlex.join(c['args'])}\nexit {c['exit']}\n{c['stdout']}"
                   f"{c['stderr']}\n" for c in cases)


def record(scratch):
    wd = os.path.join(scratch, "wd")
    os.mkdir(wd)
    written = {"help.txt": as_text(help_pages(wd)),
               "refusals.txt": as_text(discover_refusals(wd)), **failed_job(scratch)}
    for name, text in written.items():
        with open(os.path.join(GOLDEN, name), "w") as f:
            f.write(text)
    return written


class Golden(unittest.TestCase):
    def setUp(self):
        self.dir = scratch_dir(self, "crun-golden-")
        self.wd = os.path.join(self.dir, "wd")
        os.mkdir(self.wd)

    def golden(self, name):
        with open(os.path.join(GOLDEN, name)) as f:
            return f.read()

    def test_help_pages(self):
        self.assertEqual(as_text(help_pages(self.wd)), self.golden("help.txt"))

    def test_every_recorded_refusal(self):
        """The recorded cases replayed one by one; each still exits 2 with the same words, and
        no option's bad values went unrecorded."""
        for block in re.split(r"^(?=\$ crun )", self.golden("refusals.txt"), flags=re.M)[1:]:
            args = shlex.split(block.split("\n", 1)[0].removeprefix("$ crun "))
            with self.subTest(args=args):
                self.assertEqual(as_text([run(args, self.wd)]), block)
        recorded = self.golden("refusals.txt")
        unrecorded = [f"crun {c} {o}".replace("  ", " ") for c in COMMANDS
                      for o in options_of(c) if f"$ crun {c} {o} ".replace("  ", " ")
                      not in recorded and f"{c} {o}".strip() not in NO_REFUSAL]
        self.assertEqual(unrecorded, [], "options whose bad values are no longer refused")
        self.assertEqual(os.listdir(self.wd), [])

    def test_failure_report_failure_json_and_status(self):
        if os.geteuid() != 0:
            self.skipTest("pinning the host name needs a UTS namespace (root)")
        for name, text in failed_job(self.dir).items():
            with self.subTest(name=name):
                self.assertEqual(text, self.golden(name))


# Options none of whose bad values is refused at once (free text, paths, or values checked
# only when used); their refusals, where they have any, are in test_cli_refusals.py.
NO_REFUSAL = {"store --host", "store --allow", "store --metrics-host"}

if __name__ == "__main__":
    if not CRUN:
        sys.exit("test_golden.py: CRUN_BIN names the crun binary")
    if "--update" in sys.argv:
        import tempfile
        with tempfile.TemporaryDirectory(prefix="crun-golden-") as d:
            for name, text in record(d).items():
                print(f"{name}: {text.count(chr(10))} lines")
        sys.exit(0)
    unittest.main()
