"""Metrics as operators meet them (docs/observability.md): a real Prometheus (Debian's package)
scraping the rendezvous daemon, two crun agents and a `crun store` while a job fails once and
restarts, queried over its HTTP API; each page checked by `promtool check metrics`; the
endpoints over TLS when the job uses TLS; bad metrics flags; `crun status --watch`. Real
processes, sockets and signals; every wait has a deadline."""
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

CRUN = os.environ["CRUN_BIN"]
PYTHON = os.environ.get("PYTHON_EXEC", sys.executable)
LIMIT_S = 120

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from crun_testing import (free_port, kill_all, make_certificates, start_store,  # noqa: E402
                          stop_store, wait_for)

PYLIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib")

# A job's worker: every start says so on stdout (log bytes); on the first attempt rank 3
# fails with exit code 3 and the others wait to be stopped; on the restart each worker adds 1
# to key "ready" of the side store (STORE_PORT), then waits for OUT/release.
WORKER = textwrap.dedent("""\
    import os, signal, sys, time
    sys.path.insert(0, sys.argv[2])
    from crun_testing import connect_2x, raw_add
    out = sys.argv[1]
    rank = int(os.environ["RANK"])
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    print(f"worker rank {rank} restart {restart} " + "x" * 100, flush=True)
    if restart == 0:
        if rank == 3:
            sys.exit(3)
        signal.pause()  # crun's SIGTERM ends it
    c = connect_2x(int(os.environ["STORE_PORT"]))
    raw_add(c, "ready", 1)
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(out, "release")) and time.monotonic() < deadline:
        time.sleep(0.01)
    sys.exit(0)
""")


def page_values(text):
    """{series: value} of a Prometheus text page."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def scrape(url, context=None):
    with urllib.request.urlopen(url, timeout=10, context=context) as r:
        return r.read().decode()


def check_with_promtool(test, text):
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=30)
    test.assertEqual((r.returncode, r.stdout + r.stderr), (0, ""))


def read_line_with(proc, stream, needle, limit=LIMIT_S):
    """Reads `proc`'s `stream` line by line until one contains `needle` (or it ends)."""
    deadline = time.monotonic() + limit
    seen = []
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return line
    raise AssertionError(f"no line with {needle!r}: {''.join(seen)[-2000:]}")


class Observability(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="crun-observability-")
        self.procs = []
        with open(os.path.join(self.dir, "worker.py"), "w") as f:
            f.write(WORKER)

    def tearDown(self):
        kill_all(self.procs)
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, cmd, **kw):
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
        self.procs.append(p)
        return p

    def daemon(self, *args):
        """`crun rendezvous` on a free port with metrics on another; (proc, port, metrics URL)."""
        p = self.start([CRUN, "rendezvous", "--host", "127.0.0.1", "--port", "0",
                        "--metrics-port", "0", *args])
        line = read_line_with(p, p.stdout, "listening on")
        port = int(line.rsplit(":", 1)[1])
        url = read_line_with(p, p.stdout, "metrics on").split("metrics on ", 1)[1].strip()
        return p, port, url

    def agent(self, node, rdzv_port, metrics_port, *args, env=None):
        cmd = [CRUN, "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint",
               f"127.0.0.1:{rdzv_port}", "--rdzv-id", "obs", "--max-restarts", "2",
               "--rdzv-conf", f"node_id={node}", "--metrics-port", str(metrics_port), *args,
               "--no-python", PYTHON, os.path.join(self.dir, "worker.py"), self.dir, PYLIB]
        return self.start(cmd, env=dict(os.environ, **(env or {})))

    def finish(self, p):
        out, err = p.communicate(timeout=LIMIT_S)
        return p.returncode, out, err

    @unittest.skipUnless(shutil.which("prometheus"), "Debian's prometheus is not installed")
    def test_prometheus_scrapes_daemon_agents_and_store_through_a_failure_and_a_restart(self):
        store, store_port = start_store(CRUN, "--host", "127.0.0.1", "--port", "0",
                                        "--metrics-port", "0")
        self.procs.append(store)
        store_url = store.stdout.readline().decode().split("metrics on ", 1)[1].strip()
        daemon, rdzv_port, daemon_url = self.daemon()
        metrics_ports = {"a": free_port(), "b": free_port()}
        env = {"STORE_PORT": str(store_port)}
        agents = {n: self.agent(n, rdzv_port, metrics_ports[n], env=env) for n in ("a", "b")}

        prom_port = free_port()
        targets = [urllib.parse.urlsplit(u).netloc for u in (daemon_url, store_url)]
        targets += [f"127.0.0.1:{p}" for p in metrics_ports.values()]
        config = os.path.join(self.dir, "prometheus.yml")
        with open(config, "w") as f:
            f.write(textwrap.dedent(f"""\
                global:
                  scrape_interval: 1s
                  scrape_timeout: 1s
                scrape_configs:
                  - job_name: crun
                    static_configs:
                      - targets: {json.dumps(targets)}
                """))
        prom = self.start(["prometheus", f"--config.file={config}",
                           f"--storage.tsdb.path={os.path.join(self.dir, 'tsdb')}",
                           f"--web.listen-address=127.0.0.1:{prom_port}"])

        def query(q):
            url = (f"http://127.0.0.1:{prom_port}/api/v1/query?" +
                   urllib.parse.urlencode({"query": q}))
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    body = json.load(r)
            except (urllib.error.URLError, ConnectionError):
                return None  # not listening yet
            self.assertEqual(body["status"], "success", body)
            return body["data"]["result"]

        def value(q):
            r = query(q)
            return float(r[0]["value"][1]) if r else None

        # The restart is running (every worker added 1 to the store's key) and Prometheus has
        # scraped it everywhere: four targets up, the store counted the four adds.
        wait_for(lambda: value('count(up{job="crun"} == 1)') == 4, "four targets up", LIMIT_S)
        wait_for(lambda: value('sum(crun_store_requests_total{op="add"})') == 4,
                 "the restart's workers to reach the store, scraped", LIMIT_S)
        wait_for(lambda: value('sum(crun_agent_workers{state="running"})') == 4,
                 "four workers running, scraped", LIMIT_S)

        # The daemon: one job, running, one restart, one failure by exit code, two rounds.
        self.assertEqual(value('crun_rendezvous_jobs{phase="running"}'), 1)
        self.assertEqual(value('crun_rendezvous_restarts_total{run_id="obs"}'), 1)
        self.assertEqual(value('crun_rendezvous_failures_total{run_id="obs",cause="exit_code"}'),
                         1)
        self.assertEqual(value('sum(crun_rendezvous_failures_total{run_id="obs"})'), 1)
        self.assertEqual(value('crun_rendezvous_rounds_total{run_id="obs"}'), 2)
        self.assertEqual(value("crun_rendezvous_agents_connected"), 2)
        self.assertEqual(value("crun_rendezvous_round_formation_seconds_count"), 2)
        # The agents: rank 3 (node b's local rank 1) failed with its exit code; crun stopped
        # the three others; each node counts the restart, two rounds and one recovery.
        self.assertEqual(value('sum(crun_agent_worker_exits_total{cause="exit_code"})'), 1)
        self.assertEqual(value('sum(crun_agent_worker_exits_total{cause="stopped"})'), 3)
        self.assertEqual(value('sum(crun_agent_worker_exits_total{cause="signal"})'), 0)
        by_node = {r["metric"]["node"]: float(r["value"][1])
                   for r in query('crun_agent_worker_exits_total{cause="exit_code"}')}
        self.assertEqual(by_node, {"a": 0, "b": 1})
        for r in query("crun_agent_restarts_total"):
            self.assertEqual((r["metric"]["run_id"], float(r["value"][1])), ("obs", 1))
        self.assertEqual(value("sum(crun_agent_rounds_total)"), 4)
        self.assertEqual(value("sum(crun_agent_recovery_seconds_count)"), 2)
        self.assertGreater(value('sum(crun_agent_log_bytes_total{stream="stdout"})'), 4 * 100)
        self.assertGreater(value("min(crun_agent_last_rendezvous_timestamp_seconds)"),
                           time.time() - 600)
        # The operators' example queries of docs/observability.md answer (once two scrapes
        # give rates something to work with).
        wait_for(lambda: value('sum by (run_id) (increase(crun_rendezvous_restarts_total[1h]))')
                 is not None, "restarts per hour per job", LIMIT_S)
        wait_for(lambda: value("histogram_quantile(0.99, sum by (le) "
                               "(rate(crun_rendezvous_round_formation_seconds_bucket[5m])))")
                 is not None, "the p99 round formation time", LIMIT_S)

        # Every page passes promtool; then the job ends and everything stops cleanly.
        for url in (daemon_url, store_url, *(f"http://127.0.0.1:{p}/metrics"
                                             for p in metrics_ports.values())):
            check_with_promtool(self, scrape(url))
        open(os.path.join(self.dir, "release"), "w").close()
        for n, p in agents.items():
            code, _, err = self.finish(p)
            self.assertEqual(code, 0, err)
        # The job's end shows on the daemon (its page is rendered on demand).
        final = page_values(scrape(daemon_url))
        self.assertEqual(final['crun_rendezvous_jobs_finished_total{outcome="succeeded"}'], 1)
        for p in (daemon, prom):
            p.send_signal(signal.SIGTERM)
            self.assertEqual(self.finish(p)[0], 0)
        self.assertEqual(stop_store(store)[0], 0)

    def test_daemon_and_agent_metrics_over_tls_when_the_job_uses_tls(self):
        certs = make_certificates(os.path.join(self.dir, "certs"))
        token = os.path.join(self.dir, "token")
        with open(token, "w") as f:
            f.write("obs-token\n")
        # Mutual TLS: the daemon requires client certificates signed by the CA.
        daemon, rdzv_port, url = self.daemon(
            "--token-file", token, "--tls-cert", certs["service.pem"], "--tls-key",
            certs["service.key"], "--tls-ca", certs["ca.pem"])
        self.assertTrue(url.startswith("https://127.0.0.1:"), url)
        trusted = ssl.create_default_context(cafile=certs["ca.pem"])
        trusted.load_cert_chain(certs["client.pem"], certs["client.key"])
        text = scrape(url, trusted)
        self.assertIn("crun_rendezvous_jobs", text)
        check_with_promtool(self, text)
        # Without a client certificate, or in plain HTTP, nothing is served.
        anonymous = ssl.create_default_context(cafile=certs["ca.pem"])
        with self.assertRaises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            scrape(url, anonymous)
        with self.assertRaises((urllib.error.URLError, ConnectionError,
                                 http.client.HTTPException)):
            scrape(url.replace("https://", "http://"))

        # An agent of that job serves HTTPS with its own certificate, same rule.
        tls = ["--token-file", token, "--tls-cert", certs["client.pem"], "--tls-key",
               certs["client.key"], "--tls-ca", certs["ca.pem"]]
        port = free_port()
        a = self.agent("a", rdzv_port, port, *tls, env={"STORE_PORT": "1"})
        self.assertIn(f"crun: metrics on https://127.0.0.1:{port}/metrics",
                      read_line_with(a, a.stderr, "metrics on"))
        text = scrape(f"https://127.0.0.1:{port}/metrics", trusted)
        self.assertIn('crun_agent_workers{run_id="obs",node="a",role="default",state="running"}',
                      text)
        with self.assertRaises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            scrape(f"https://127.0.0.1:{port}/metrics", anonymous)
        a.send_signal(signal.SIGTERM)
        code, _, err = self.finish(a)
        self.assertEqual(code, 128 + signal.SIGTERM, err)

        # A node with only the CA (no certificate to serve with) keeps its endpoint on
        # loopback: asked for another address, it refuses before starting anything.
        r = subprocess.run([CRUN, "--nnodes", "1", "--rdzv-endpoint", f"127.0.0.1:{rdzv_port}",
                            "--token-file", token, "--tls-ca", certs["ca.pem"],
                            "--metrics-port", "0", "--metrics-host", "0.0.0.0",
                            "--no-python", "/bin/true"],
                           capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--metrics-host 0.0.0.0: this job's rendezvous uses TLS", r.stderr)
        daemon.send_signal(signal.SIGTERM)
        self.assertEqual(self.finish(daemon)[0], 0)

    def test_bad_metrics_flags_are_named_and_nothing_starts(self):
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        try:
            for args, code, needle in [
                    (["--metrics-port", "65536"], 2, "65536"),
                    (["--metrics-port", "x1"], 2, "x1"),
                    (["--metrics-host", "127.0.0.1"], 2, "--metrics-host needs --metrics-port"),
                    (["--metrics-port", "0", "--metrics-host", "localhost"], 2,
                     "--metrics-host 'localhost' is not an IP address"),
                    (["--metrics-port", str(taken)], 1, f"metrics at 127.0.0.1:{taken}")]:
                with self.subTest(args=args):
                    marker = os.path.join(self.dir, "ran")
                    r = subprocess.run([CRUN, "--standalone", "--nproc-per-node", "1", *args,
                                        "--no-python", "/usr/bin/touch", marker],
                                       capture_output=True, text=True, timeout=LIMIT_S)
                    self.assertEqual(r.returncode, code, r.stderr)
                    self.assertIn(needle, r.stderr)
                    self.assertFalse(os.path.exists(marker), "a worker ran")
            # The daemon too: a taken metrics port fails it, naming the port; its gRPC port
            # is free again afterwards.
            r = subprocess.run([CRUN, "rendezvous", "--host", "127.0.0.1", "--port", "0",
                                "--metrics-port", str(taken)],
                               capture_output=True, text=True, timeout=LIMIT_S)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn(f"metrics at 127.0.0.1:{taken}", r.stderr)
            self.assertNotIn("listening on", r.stdout)
        finally:
            holder.close()

    def test_agent_metrics_count_a_standalone_jobs_exits(self):
        """One node, no service: a worker killed by a signal it was not sent by crun is a
        'signal' exit, the restart's workers succeed."""
        script = os.path.join(self.dir, "kill_once.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent("""\
                import os, signal, sys, time
                out = sys.argv[1]
                if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "0":
                    os.kill(os.getpid(), signal.SIGKILL)
                if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
                    signal.pause()
                open(os.path.join(out, "started." + os.environ["RANK"]), "w").close()
                deadline = time.monotonic() + 120
                while not os.path.exists(os.path.join(out, "release")):
                    if time.monotonic() > deadline:
                        sys.exit(9)
                    time.sleep(0.01)
                """))
        port = free_port()
        p = self.start([CRUN, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                        "--metrics-port", str(port), "--no-python", PYTHON, script, self.dir])
        wait_for(lambda: all(os.path.exists(os.path.join(self.dir, f"started.{r}"))
                             for r in (0, 1)), "the restart's workers", LIMIT_S)
        v = page_values(scrape(f"http://127.0.0.1:{port}/metrics"))
        rounds = next(k for k in v if k.startswith("crun_agent_rounds_total{"))
        labels = rounds[len("crun_agent_rounds_total{"):-1]  # run_id="...",node="...",role=...

        def at(name, extra=""):
            return v[name + "{" + labels + ("," + extra if extra else "") + "}"]
        self.assertTrue(labels.endswith(',role="default"'), labels)
        self.assertEqual(at("crun_agent_worker_exits_total", 'cause="signal"'), 1)
        self.assertEqual(at("crun_agent_worker_exits_total", 'cause="stopped"'), 1)
        self.assertEqual(at("crun_agent_worker_exits_total", 'cause="exit_code"'), 0)
        self.assertEqual(at("crun_agent_workers", 'state="running"'), 2)
        self.assertEqual(at("crun_agent_restarts_total"), 1)
        self.assertEqual(at("crun_agent_rounds_total"), 2)
        self.assertEqual(at("crun_agent_recovery_seconds_count"), 1)
        open(os.path.join(self.dir, "release"), "w").close()
        code, _, err = self.finish(p)
        self.assertEqual(code, 0, err)
        # The endpoint went with the job: nothing listens on its port.
        with self.assertRaises((urllib.error.URLError, ConnectionError)):
            scrape(f"http://127.0.0.1:{port}/metrics")

    def test_a_hung_worker_is_a_hang_exit(self):
        """--hang-timeout: the worker that made no progress is counted as a hang, not as the
        signal crun ended it with."""
        script = os.path.join(self.dir, "hang_once.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent("""\
                import os, signal, sys, time
                out = sys.argv[1]
                if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
                    signal.pause()  # no output, no heartbeat: hung
                open(os.path.join(out, "started"), "w").close()
                beat = int(os.environ["CRUN_HEARTBEAT_FD"])
                deadline = time.monotonic() + 120
                while not os.path.exists(os.path.join(out, "release")):
                    if time.monotonic() > deadline:
                        sys.exit(9)
                    os.write(beat, b".")  # progress, for --hang-timeout
                    time.sleep(0.05)
                """))
        port = free_port()
        p = self.start([CRUN, "--standalone", "--nproc-per-node", "1", "--max-restarts", "1",
                        "--hang-timeout", "1", "--metrics-port", str(port), "--no-python",
                        PYTHON, script, self.dir])
        wait_for(lambda: os.path.exists(os.path.join(self.dir, "started")), "the restart",
                 LIMIT_S)
        v = page_values(scrape(f"http://127.0.0.1:{port}/metrics"))
        exits = {k.rsplit('cause="', 1)[1][:-2]: x for k, x in v.items()
                 if k.startswith("crun_agent_worker_exits_total{")}
        self.assertEqual(exits, {"success": 0, "exit_code": 0, "signal": 0, "oom": 0,
                                 "hang": 1, "stopped": 0, "launch": 0})
        open(os.path.join(self.dir, "release"), "w").close()
        code, _, err = self.finish(p)
        self.assertEqual(code, 0, err)

    def test_status_watch_redraws_and_prints_json_lines(self):
        daemon, port, _ = self.daemon()
        endpoint = f"127.0.0.1:{port}"
        # --json with --count: one line per refresh, then exit 0.
        r = subprocess.run([CRUN, "status", "--rdzv-endpoint", endpoint, "--watch", "--json",
                            "--interval", "0.1", "--count", "3"],
                           capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(len(lines), 3, r.stdout)
        for line in lines:
            doc = json.loads(line)
            self.assertEqual(doc["jobs"], [])
            self.assertIn("time", doc)
        # The table, refreshed until Ctrl-C, which ends it with 0.
        w = self.start([CRUN, "status", "--rdzv-endpoint", endpoint, "--watch", "--interval",
                        "0.1"])
        read_line_with(w, w.stdout, f"no jobs at {endpoint}")
        read_line_with(w, w.stdout, f"no jobs at {endpoint}")  # a second refresh
        w.send_signal(signal.SIGINT)
        self.assertEqual(self.finish(w)[0], 0)
        # A service that goes away is shown as not answering, and asked again.
        daemon.send_signal(signal.SIGTERM)
        self.assertEqual(self.finish(daemon)[0], 0)
        r = subprocess.run([CRUN, "status", "--rdzv-endpoint", endpoint, "--watch", "--json",
                            "--interval", "0.1", "--count", "2", "--timeout", "0.5"],
                           capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(r.returncode, 1, r.stderr)
        docs = [json.loads(x) for x in r.stdout.splitlines()]
        self.assertEqual(len(docs), 2)
        self.assertEqual(docs[0]["error"], f"no answer from {endpoint}")
        # The table says it asks again, but not on its last refresh.
        r = subprocess.run([CRUN, "status", "--rdzv-endpoint", endpoint, "--watch",
                            "--interval", "0.1", "--count", "2", "--timeout", "0.5"],
                           capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(r.stdout.count("no answer (asking again)\n"), 1, r.stdout)
        self.assertTrue(r.stdout.rstrip("\n").endswith("\n\nno answer"), r.stdout)
        # Bad flags end it at once.
        r = subprocess.run([CRUN, "status", "--rdzv-endpoint", endpoint, "--watch",
                            "--interval", "0"], capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--interval", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
