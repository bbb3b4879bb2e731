"""The goodput ledger against the workers' own step logs (docs/observability.md, "Goodput").

A two-node job on the rendezvous daemon: stock PyTorch DDP over Gloo, one worker a node, 0.25 s
steps, a checkpoint every 5 steps (tests/workers/goodput_worker.py). Three faults: a worker's
exception, a hang (--hang-timeout 8), and a node lost (its crun and its worker SIGKILLed) with its
replacement started 5 s later. The job runs once for the class; its tests judge it:
  - while it runs, `crun status` and both /metrics pages show goodput, and /goodput pages serve;
  - at its end every node prints the job's line and writes --goodput-file, whose job
    categories agree with what the step logs say within 2 s each;
  - its timeline (`crun timeline`) in a real browser (Debian's chromium, headless): a lane per
    node, a mark per incident with its cause in the tooltip, totals equal to the JSON's; the
    screenshot is kept in $CRUN_TEST_ARTIFACTS (else the scratch directory's parent).
"""
import html.parser
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from crun_testing import (commands_mentioning, free_port, kill_all, processes_mentioning,  # noqa: E402
                          wait_for, whole_lines)

CRUN = os.environ["CRUN_BIN"]
PYTHON = os.environ.get("PYTHON_EXEC", sys.executable)
WORKER = os.path.join(HERE, "..", "workers", "goodput_worker.py")
STEPS, STEP_S = 40, 0.25
TOLERANCE_S = 2.0
# Above the time a loaded machine takes to import torch (a hang is silence from the start too:
# at 3 s, CI's imports were hangs, and three of them a crash loop).
HANG_S = 8
LIMIT_S = 150  # the whole job, well above its ~45 s


def log_figures(out_dir, launched, ended):
    """Training, redone, starting and the rest, in seconds, from rank 0's step logs alone: a
    step's time is from the step before it in the same run; a run starts again where the step
    goes back or the attempt changes; its first step's time is not training (the ledger's
    starting or reloading). The time after the job's last step (the workers' exit, crun's end)
    is counted as the ledger counts it: in the category the last step was in, training here
    (docs/observability.md, "Goodput"); under load it was 2.5 s of a 39 s job."""
    entries = []
    for name in os.listdir(out_dir):
        if re.fullmatch(r"steps-.*-0\.log", name):
            for line in whole_lines(os.path.join(out_dir, name)):
                step, t, attempt = line.split()
                entries.append((float(t), int(step), int(attempt)))
    entries.sort()
    training = redone = 0.0
    starting = entries[0][0] - launched
    done = 0  # the highest step done before this run
    prev = None
    for t, step, attempt in entries:
        if prev is not None and (step <= prev[1] or attempt != prev[2]):
            done = max(done, prev[1])  # a new run
        elif prev is not None and step <= done:
            redone += t - prev[0]
        elif prev is not None:
            training += t - prev[0]
        prev = (t, step, attempt)
    training += ended - prev[0]
    wall = ended - launched
    return {"training": training, "redone": redone, "starting": starting,
            "lost": wall - training - redone - starting, "wall": wall}


def fetch(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return r.read().decode()


def scrape(port):
    return fetch(port, "/metrics")


def sample(page, name, **labels):
    for line in page.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


class DomCounts(html.parser.HTMLParser):
    """What a rendered page holds: lanes, incident marks and their tooltips, the totals."""

    def __init__(self):
        super().__init__()
        self.lanes, self.incidents, self.totals = [], [], {}
        self._in_incident = self._in_title = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = a.get("class", "")
        if tag == "g" and cls == "lane":
            self.lanes.append(a.get("data-node"))
        if tag == "g" and cls == "incident":
            self.incidents.append({"kind": a.get("data-kind"), "title": ""})
            self._in_incident = True
        if tag == "title" and self._in_incident:
            self._in_title = True
        if tag == "tr" and "data-category" in a:
            self.totals[a["data-category"]] = int(a["data-ms"])

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False
        if tag == "g":
            self._in_incident = False

    def handle_data(self, data):
        if self._in_title and self.incidents:
            self.incidents[-1]["title"] += data


class Goodput(unittest.TestCase):
    """The job runs once (setUpClass); each test judges a part of what it left."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="crun-goodput-")
        cls.procs = []
        cls.seen = {}  # what was looked at while the job ran
        try:
            cls.run_job()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        kill_all(cls.procs)
        for pid in processes_mentioning(cls.dir):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not os.environ.get("CRUN_KEEP_TEST_DIRS"):
            shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def node(cls, tag, metrics_port=None):
        cmd = [CRUN, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", cls.endpoint,
               "--rdzv-id", cls.run_id, "--rdzv-conf", f"node_id={tag}", "--max-restarts", "5",
               "--hang-timeout", str(HANG_S), "--goodput-file", os.path.join(cls.dir, f"{tag}.json")]
        if metrics_port:
            cmd += ["--metrics-port", str(metrics_port)]
        # The script as crun runs one (PYTHON_EXEC, crun_worker on the path).
        cmd += [WORKER, cls.dir, str(STEPS), str(STEP_S), "crash@8:1", "hang@18:0",
                "mark@28:lose", f"node={tag}"]
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHON_EXEC=PYTHON))
        cls.procs.append(p)
        return p

    @classmethod
    def status(cls, *extra):
        r = subprocess.run([CRUN, "status", "--rdzv-endpoint", cls.endpoint, "--rdzv-id",
                            cls.run_id, *extra], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise AssertionError(f"crun status: {r.stderr}")
        return json.loads(r.stdout)[0] if "--json" in extra else r.stdout

    @classmethod
    def run_job(cls):
        daemon_metrics = free_port()
        daemon = subprocess.Popen(
            [CRUN, "rendezvous", "--host", "127.0.0.1", "--port", "0", "--metrics-port",
             str(daemon_metrics)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        cls.procs.append(daemon)
        line = daemon.stdout.readline()
        assert "crun rendezvous listening on" in line, line
        cls.endpoint = "127.0.0.1:" + line.rsplit(":", 1)[1].strip()
        cls.run_id = "gp" + uuid.uuid4().hex[:8]
        a_metrics = free_port()
        cls.launched = time.time()
        a = cls.node("a", a_metrics)
        b = cls.node("b")
        deadline = time.monotonic() + LIMIT_S
        # Training after the crash: the figures are there while the job runs.
        wait_for(lambda: os.path.exists(os.path.join(cls.dir, "fired-crash-8"))
                 and any(int(l.split()[0]) >= 12 for l in
                         whole_lines(os.path.join(cls.dir, "steps-a-0.log"))),
                 "training after the crash", limit=deadline - time.monotonic(), every=0.1)
        wait_for(lambda: (cls.status("--json").get("goodput") or {}).get("known"),
                 "the job's goodput in crun status", limit=10, every=0.5)
        cls.seen["status"] = cls.status("--json")
        cls.seen["table"] = cls.status()
        cls.seen["node page"] = scrape(a_metrics)
        cls.seen["daemon page"] = scrape(daemon_metrics)
        cls.seen["node timeline"] = fetch(a_metrics, "/goodput")
        cls.seen["daemon timeline"] = fetch(daemon_metrics, f"/goodput?run_id={cls.run_id}")
        cls.seen["daemon json"] = fetch(daemon_metrics, f"/goodput.json?run_id={cls.run_id}")
        # The node lost: at the cue, its crun and its worker SIGKILLed together.
        wait_for(lambda: os.path.exists(os.path.join(cls.dir, "lose")), "the cue to lose b",
                 limit=deadline - time.monotonic(), every=0.05)
        b.send_signal(signal.SIGKILL)
        for pid, _ in commands_mentioning("node=b"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        b.communicate()
        cls.procs.remove(b)
        time.sleep(5)  # the harness brings the replacement 5 s later, for every launcher alike
        b2 = cls.node("b2")
        cls.errs, cls.codes = {}, {}
        for tag, p in (("a", a), ("b2", b2)):
            _, cls.errs[tag] = p.communicate(timeout=max(1, deadline - time.monotonic()))
            cls.codes[tag] = p.returncode
            cls.procs.remove(p)

    def test_every_node_ends_with_the_jobs_line_and_file(self):
        for tag in ("a", "b2"):
            self.assertEqual(self.codes[tag], 0, f"node {tag}:\n{self.errs[tag][-4000:]}")
            self.assertRegex(self.errs[tag], r"crun: goodput \d+\.\d % .*\(the job, 3 nodes\)")
        with open(os.path.join(self.dir, "a.json")) as f:
            ledger = json.load(f)
        self.assertEqual(sorted(n["node"] for n in ledger["nodes"]), ["a", "b", "b2"])
        self.assertEqual(processes_mentioning(self.dir), [], "processes left running")

    def test_ledger_agrees_with_the_step_logs(self):
        with open(os.path.join(self.dir, "a.json")) as f:
            ledger = json.load(f)
        ours = ledger["job"]
        kinds = [i["kind"] for i in ours["incidents"]]
        print("incidents:", kinds, "\nsummary:", ledger["summary"], flush=True)
        self.assertEqual(len(kinds), 3, ours["incidents"])
        self.assertEqual(kinds[:2], ["exception", "hang"])
        # Until the ledger's last figure: the cruns' own ends (the test's clock reads a moment
        # after, once both are reaped).
        logs = log_figures(self.dir, self.launched, ours["until_ms"] / 1000)
        s = {k: v / 1000 for k, v in ours["totals_ms"].items()}
        got = {"training": s["training"], "redone": s["redone"], "starting": s["starting"],
               "lost": s["detecting"] + s["restarting"] + s["reloading"] + s["waiting"]}
        print("ledger:", {k: round(v, 2) for k, v in got.items()},
              "\nlogs:  ", {k: round(v, 2) for k, v in logs.items()}, flush=True)
        for k in ("training", "redone", "starting", "lost"):
            self.assertLess(abs(got[k] - logs[k]), TOLERANCE_S, f"{k}: ledger {got[k]:.2f} s, "
                            f"step logs {logs[k]:.2f} s")
        self.assertGreater(s["waiting"], 3.0, "the 5 s wait for the replacement is waiting")
        self.assertGreater(s["detecting"], HANG_S - 1, "the hang's silence before it was declared")

    def test_status_metrics_and_pages_while_it_runs(self):
        job = self.seen["status"]
        self.assertGreater(job["goodput"]["ratio"], 0)
        self.assertLess(job["goodput"]["ratio"], 1)
        self.assertEqual(job["goodput"]["incidents"], 1, job["goodput"])
        self.assertTrue(all(n["goodput"] for n in job["nodes"]), job["nodes"])
        self.assertIn("GOODPUT", self.seen["table"])
        self.assertRegex(self.seen["table"], r"\n  goodput \d+\.\d %")
        page = self.seen["node page"]
        self.assertGreater(sample(page, "crun_agent_goodput_seconds_total", category="training"), 0)
        self.assertIsNotNone(sample(page, "crun_agent_goodput_ratio"))
        self.assertIsNotNone(sample(self.seen["daemon page"], "crun_rendezvous_job_goodput_ratio",
                                    run_id=self.run_id))
        for name in ("node timeline", "daemon timeline"):
            self.assertIn("<svg", self.seen[name], name)
        self.assertEqual(len(json.loads(self.seen["daemon json"])["nodes"]), 2)

    def test_timeline_in_a_browser(self):
        browser = shutil.which("chromium")
        if browser is None:
            self.skipTest("no chromium (scripts/install-deps.sh installs Debian's)")
        source = os.path.join(self.dir, "a.json")
        page = os.path.join(self.dir, "timeline.html")
        r = subprocess.run([CRUN, "timeline", source, "-o", page], capture_output=True,
                           text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", f"--user-data-dir={self.dir}/chromium"]
        dom = subprocess.run([browser, *flags, "--dump-dom", "file://" + page],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(dom.returncode, 0, dom.stderr[-2000:])
        counts = DomCounts()
        counts.feed(dom.stdout)
        with open(source) as f:
            ledger = json.load(f)
        self.assertEqual(sorted(counts.lanes), sorted(n["node"] for n in ledger["nodes"]))
        incidents = ledger["job"]["incidents"]
        self.assertEqual(len(counts.incidents), len(incidents))
        self.assertGreaterEqual(len({i["kind"] for i in incidents}), 3, incidents)
        for mark, incident in zip(counts.incidents, incidents):
            self.assertEqual(mark["kind"], incident["kind"])
            self.assertIn(incident["cause"], mark["title"])
        self.assertEqual(counts.totals, ledger["job"]["totals_ms"])
        shots = os.environ.get("CRUN_TEST_ARTIFACTS") or os.path.dirname(self.dir)
        os.makedirs(shots, exist_ok=True)
        shot = os.path.join(shots, "goodput-timeline.png")
        r = subprocess.run([browser, *flags, "--hide-scrollbars", "--window-size=1200,640",
                            f"--screenshot={shot}", "file://" + page],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertGreater(os.path.getsize(shot), 10_000, "an empty screenshot")
        print("screenshot:", shot, flush=True)


if __name__ == "__main__":
    unittest.main()
