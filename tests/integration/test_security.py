"""Who may talk to crun, with real processes, sockets and certificates: the daemon's refusal to
serve a network without a token, job tokens (missing, wrong, right) on sessions and on
`crun status`, TLS and mutual TLS, a round's worker store refusing an address outside the job,
stores that listen where they were told, and the token kept from the workers."""
import json
import os
import signal
import socket
import subprocess
import sys
import unittest

CRUN = os.environ["CRUN_BIN"]
WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "workers")
PROBE = os.path.join(WORKERS, "node_probe.py")
BEHAVE = os.path.join(WORKERS, "behave.py")
LIMIT_S = 60
# gRPC's own log line format (E1123 12:00:00.000 ... file.cc:N] ...): never on a terminal.
GRPC_LOG_LINE = r"(?m)^[EWID]\d{4} "

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from crun_testing import (VALIDATE, free_port, kill_all, make_certificates,  # noqa: E402
                          probe_events, raw_add, scratch_dir, wait_for)


def listening_addresses(port):
    """The local addresses with a TCP socket listening on `port` (from /proc/net/tcp{,6})."""
    found = set()
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                addr, hexport = fields[1].split(":")
                if fields[3] != "0A" or int(hexport, 16) != port:
                    continue
                raw = bytes.fromhex(addr)
                if v6:  # four little-endian 32-bit words
                    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                    found.add(socket.inet_ntop(socket.AF_INET6, raw))
                else:
                    found.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
    return found


class Security(unittest.TestCase):
    def setUp(self):
        self.dir = scratch_dir(self, "crun-security-")
        self.token_file = os.path.join(self.dir, "token")
        with open(os.open(self.token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write("correct-horse-battery-staple\n")
        self.procs = []

    def tearDown(self):
        kill_all(self.procs)

    def daemon(self, *args):
        """`crun rendezvous` on a free loopback port; returns (process, "127.0.0.1:port")."""
        p = subprocess.Popen([CRUN, "rendezvous", "--host", "127.0.0.1", "--port", "0", *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        line = p.stdout.readline()
        if "listening on" not in line:
            p.kill()
            self.fail(f"crun rendezvous did not start: {line!r} {p.communicate()[1]}")
        return p, "127.0.0.1:" + line.rsplit(":", 1)[1].strip()

    def stop(self, p):
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=LIMIT_S)
        self.assertEqual(p.returncode, 0, err)
        return err

    def node(self, tag, endpoint, *args, nnodes=2, env=None):
        """One node's crun against `endpoint`; its worker waits for OUT/go."""
        cmd = [CRUN, "--nnodes", str(nnodes), "--nproc-per-node", "1", "--rdzv-endpoint",
               endpoint, "--rdzv-id", "job", "--rdzv-conf", f"node_id={tag},is_host=0", *args,
               PROBE, self.dir, "--until", "go"]
        e = {k: v for k, v in os.environ.items() if not k.startswith("CRUN_")}
        e.update(NODE_TAG=tag, **(env or {}))
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
        self.procs.append(p)
        return p

    def finish(self, p):
        _, err = p.communicate(timeout=LIMIT_S)
        return p.returncode, err

    def go(self):
        open(os.path.join(self.dir, "go"), "w").close()

    def test_the_daemon_refuses_a_network_address_without_a_token(self):
        r = subprocess.run([CRUN, "rendezvous", "--host", "0.0.0.0", "--port", "0"],
                           capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("refusing to serve 0.0.0.0 without a job token", r.stderr)
        self.assertIn("--insecure", r.stderr)
        for extra in (["--insecure"], ["--token-file", self.token_file]):
            p = subprocess.Popen([CRUN, "rendezvous", "--host", "0.0.0.0", "--port", "0", *extra],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self.procs.append(p)
            self.assertIn("listening on 0.0.0.0:", p.stdout.readline())
            err = self.stop(p)
            self.assertEqual("without a job token" in err, extra == ["--insecure"], err)
        bad = subprocess.run([CRUN, "rendezvous", "--port", "0", "--token-file",
                              self.token_file + ".absent"],
                             capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(bad.returncode, 2)
        self.assertIn(f"--token-file {self.token_file}.absent: No such file", bad.stderr)

    def test_missing_or_wrong_tokens_are_refused_and_the_job_goes_on(self):
        daemon, endpoint = self.daemon("--token-file", self.token_file)
        a = self.node("a", endpoint, env={"CRUN_TOKEN_FILE": self.token_file})
        b = self.node("b", endpoint, "--token-file", self.token_file)
        wait_for(lambda: len(probe_events(self.dir)) == 2, "the job's two workers")
        wrong = self.node("x", endpoint, env={"CRUN_TOKEN": "guess"})
        none = self.node("y", endpoint)
        code, err = self.finish(wrong)
        self.assertEqual(code, 1, err)
        self.assertIn(f"the rendezvous service at {endpoint} refused this node (run 'job', "
                      "node 'x'): the job token does not match", err)
        self.assertIn("this node's token is from CRUN_TOKEN", err)
        code, err = self.finish(none)
        self.assertEqual(code, 1, err)
        self.assertIn("requires a job token", err)
        # Status: refused without the token, served with it; the job never saw the strangers.
        r = subprocess.run([CRUN, "status", "--rdzv-endpoint", endpoint], capture_output=True,
                           text=True, timeout=LIMIT_S)
        self.assertEqual(r.returncode, 1)
        self.assertIn("refused the request", r.stderr)
        r = subprocess.run([CRUN, "status", "--rdzv-endpoint", endpoint, "--json",
                            "--token-file", self.token_file],
                           capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(r.returncode, 0, r.stderr)
        job = json.loads(r.stdout)[0]
        self.assertEqual((job["phase"], sorted(n["node_id"] for n in job["nodes"])),
                         ("running", ["a", "b"]))
        self.go()
        for p in (a, b):
            code, err = self.finish(p)
            self.assertEqual(code, 0, err)
        self.assertEqual(sorted(e["NODE_TAG"] for e in probe_events(self.dir)), ["a", "b"])
        err = self.stop(daemon)
        # The two strangers race: either may be refused first.
        self.assertRegex(err, r"refused Session call #[12] from 127\.0\.0\.1: a wrong job token")
        self.assertRegex(err, r"refused Session call #[12] from 127\.0\.0\.1: no job token")

    def test_a_rounds_store_refuses_an_address_outside_the_job(self):
        daemon, endpoint = self.daemon("--token-file", self.token_file)
        env = {"CRUN_TOKEN_FILE": self.token_file}
        nodes = [self.node(t, endpoint, env=env) for t in ("a", "b")]
        wait_for(lambda: len(probe_events(self.dir)) == 2, "the job's two workers")
        ev = probe_events(self.dir)[0]
        port = int(ev["MASTER_PORT"])
        self.assertEqual(ev["MASTER_ADDR"], "127.0.0.1")
        stranger = socket.socket()
        stranger.bind(("127.0.0.2", 0))  # another "host" on loopback
        stranger.connect(("127.0.0.1", port))
        stranger.settimeout(LIMIT_S)
        stranger.sendall(VALIDATE)
        try:
            self.assertEqual(stranger.recv(1), b"", "the store answered a stranger")
        except ConnectionResetError:
            pass  # closed with data unread: a reset says the same
        stranger.close()
        member = socket.create_connection(("127.0.0.1", port), timeout=LIMIT_S)
        member.sendall(VALIDATE)
        self.assertEqual(raw_add(member, "probe", 5), 5)
        member.close()
        self.go()
        for p in nodes:
            code, err = self.finish(p)
            self.assertEqual(code, 0, err)
        err = self.stop(daemon)
        self.assertIn("from 127.0.0.2: not an address of this job's nodes", err)

    def test_tls_sessions_work_and_plaintext_against_tls_fails_clearly(self):
        certs = make_certificates(self.dir)
        daemon, endpoint = self.daemon("--tls-cert", certs["service.pem"], "--tls-key",
                                       certs["service.key"], "--token-file", self.token_file)
        env = {"CRUN_TOKEN_FILE": self.token_file}
        tls = ["--tls-ca", certs["ca.pem"]]
        nodes = [self.node(t, endpoint, *tls, env=env) for t in ("a", "b")]
        wait_for(lambda: len(probe_events(self.dir)) == 2, "the job's two workers over TLS")
        plain = self.node("p", endpoint, env=env)
        code, err = self.finish(plain)
        self.assertEqual(code, 1, err)
        self.assertIn(f"cannot open a session with the rendezvous service at {endpoint}", err)
        self.assertIn("if the service uses TLS, give --tls-ca", err)
        self.assertNotRegex(err, GRPC_LOG_LINE)
        r = subprocess.run([CRUN, "status", "--rdzv-endpoint", endpoint, *tls, "--token-file",
                            self.token_file], capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("job job: running", r.stdout)
        self.go()
        for p in nodes:
            code, err = self.finish(p)
            self.assertEqual(code, 0, err)
        self.stop(daemon)
        # The other way round: TLS against a plaintext service.
        daemon, endpoint = self.daemon()
        lone = self.node("t", endpoint, *tls, nnodes=1)
        code, err = self.finish(lone)
        self.assertEqual(code, 1, err)
        self.assertIn("this node uses TLS: does the service?", err)
        self.assertNotRegex(err, GRPC_LOG_LINE)
        self.assertNotRegex(self.stop(daemon), GRPC_LOG_LINE)

    def test_a_tls_client_on_the_daemons_host_joins_it(self):
        # The endpoint names this host, but with no certificate of its own this crun cannot
        # host the service: it joins the daemon that serves it (no is_host given).
        certs = make_certificates(self.dir)
        daemon, endpoint = self.daemon("--tls-cert", certs["service.pem"], "--tls-key",
                                       certs["service.key"], "--token-file", self.token_file)
        e = {k: v for k, v in os.environ.items() if not k.startswith("CRUN_")}
        e.update(CRUN_TOKEN_FILE=self.token_file, NODE_TAG="local")
        r = subprocess.run([CRUN, "--nnodes", "1", "--nproc-per-node", "1", "--rdzv-endpoint",
                            endpoint, "--rdzv-id", "job", "--tls-ca", certs["ca.pem"], PROBE,
                            self.dir], capture_output=True, text=True, timeout=LIMIT_S, env=e)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual([ev["NODE_TAG"] for ev in probe_events(self.dir)], ["local"])
        self.stop(daemon)

    def test_mutual_tls_requires_a_client_certificate_signed_by_the_ca(self):
        certs = make_certificates(self.dir)
        daemon, endpoint = self.daemon("--tls-cert", certs["service.pem"], "--tls-key",
                                       certs["service.key"], "--tls-ca", certs["ca.pem"])
        anonymous = self.node("n", endpoint, "--tls-ca", certs["ca.pem"], nnodes=1)
        code, err = self.finish(anonymous)
        self.assertEqual(code, 1, err)
        self.assertIn(f"cannot open a session with the rendezvous service at {endpoint}", err)
        # Both sides are named: here it is this node's missing certificate.
        self.assertIn("also needs --tls-cert and --tls-key on this node", err)
        # gRPC's own log lines stay off the terminal.
        self.assertNotRegex(err, GRPC_LOG_LINE)
        self.go()
        member = self.node("m", endpoint, "--tls-ca", certs["ca.pem"], "--tls-cert",
                           certs["client.pem"], "--tls-key", certs["client.key"], nnodes=1)
        code, err = self.finish(member)
        self.assertEqual(code, 0, err)
        self.assertEqual([e["NODE_TAG"] for e in probe_events(self.dir)], ["m"])
        self.assertNotRegex(self.stop(daemon), GRPC_LOG_LINE)  # nor the daemon's

    def test_stores_listen_where_they_were_told_and_workers_never_see_the_token(self):
        # --standalone: loopback only.
        p = subprocess.Popen([CRUN, "--standalone", "--nproc-per-node", "1", BEHAVE, self.dir,
                              "--mode", "wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=dict(os.environ, CRUN_TOKEN="keep-me-secret"))
        self.procs.append(p)
        wait_for(lambda: os.path.exists(os.path.join(self.dir, "ready_0_0.json")), "worker")
        with open(os.path.join(self.dir, "env_0_0.json")) as f:
            env = json.load(f)
        self.assertNotIn("CRUN_TOKEN", env)
        self.assertEqual(listening_addresses(int(env["MASTER_PORT"])), {"127.0.0.1"})
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=LIMIT_S)
        # The static backend: the --master-addr given, not every interface.
        port = free_port()
        nodes = []
        for rank in (0, 1):
            out = os.path.join(self.dir, f"static{rank}")
            os.mkdir(out)
            nodes.append(subprocess.Popen(
                [CRUN, "--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "1",
                 "--master-addr", "127.0.0.1", "--master-port", str(port), BEHAVE, out,
                 "--mode", "wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        self.procs.extend(nodes)
        wait_for(lambda: os.path.exists(os.path.join(self.dir, "static1", "ready_1_0.json")),
                 "the static job's workers")
        self.assertEqual(listening_addresses(port), {"127.0.0.1"})
        for n in nodes:
            n.send_signal(signal.SIGTERM)
        for n in nodes:
            n.communicate(timeout=LIMIT_S)
            self.assertEqual(n.returncode, 128 + signal.SIGTERM)

    def test_security_flags_outside_the_service_modes_are_refused(self):
        r = subprocess.run([CRUN, "--standalone", "--token-file", self.token_file, BEHAVE,
                            self.dir], capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--token-file secures crun's rendezvous service", r.stderr)
        r = subprocess.run([CRUN, "--nnodes", "1", "--rdzv-endpoint", "127.0.0.1:1",
                            "--tls-cert", self.token_file, BEHAVE, self.dir],
                           capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(r.returncode, 2)
        self.assertIn(f"--tls-cert {self.token_file} without its key", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
