"""Values crun must refuse, every command: exit 2, a short message naming the value, and
nothing created or left running. One table per command; real processes."""
import os
import socket
import subprocess
import sys
import time
import unittest

CRUN = os.environ["CRUN_BIN"]
HERE = os.path.dirname(os.path.abspath(__file__))
ENV_DUMP = os.path.join(HERE, "..", "workers", "env_dump.py")
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from crun_testing import free_port, scratch_dir  # noqa: E402
LIMIT_S = 60


class CliRefusals(unittest.TestCase):
    def setUp(self):
        self.dir = scratch_dir(self, "crun-refusals-")
        self.tmp = os.path.join(self.dir, "tmp")
        os.mkdir(self.tmp)

    def refused(self, args, message):
        t0 = time.monotonic()
        r = subprocess.run([CRUN, *args], capture_output=True, text=True, timeout=LIMIT_S,
                           env=dict(os.environ, TMPDIR=self.tmp), cwd=self.dir)
        took = time.monotonic() - t0
        self.assertEqual(r.returncode, 2, (args, r.stderr))
        self.assertIn(message, r.stderr)
        self.assertLess(len(r.stderr), 600, r.stderr)
        self.assertLess(took, 10, "a refusal must not wait for anything")
        self.assertEqual(os.listdir(self.tmp), [])
        self.assertEqual(sorted(os.listdir(self.dir)), ["tmp"])

    def test_launcher(self):
        for args, message in [
            (["--shutdown-timeout", "nan"], "--shutdown-timeout 'nan'"),
            (["--shutdown-timeout", "inf"], "--shutdown-timeout 'inf'"),
            (["--monitor-interval", "nan"], "--monitor-interval 'nan'"),
            (["--rdzv-endpoint", "::1:29400"], "an IPv6 address needs brackets"),
            (["--rdzv-endpoint", "[zzz]:29400"], "'zzz' is not an IPv6 address"),
            (["--rdzv-endpoint", "no-such-host.invalid:29400"],
             "cannot resolve host 'no-such-host.invalid'"),
            (["--rdzv-endpoint", ""], "--rdzv-endpoint is empty"),
            (["--log-dir", ""], "--log-dir is empty"),
            (["--hang-after-steps", "5"], "--hang-after-steps 5 needs --hang-timeout"),
            (["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-conf", ",,,"],
             "an empty item"),
            (["--rdzv-conf", "join_timeout="], "join_timeout has no value"),
            (["--rdzv-id", "../../escape"], "--rdzv-id '../../escape'"),
            (["--rdzv-id", "x" * 100_000], "(100000 characters): a run id is 1 to 128"),
            (["--master-port", "-1"], "--master-port '-1'"),
            (["--slurm-port", "0"], "'0' is not a whole number from 1 to 65535"),
            (["--signals-to-handle", "99999999999999"],
             "'99999999999999' is not a signal crun can handle"),
        ]:
            with self.subTest(args=[a[:40] for a in args]):
                self.refused([*args, ENV_DUMP, self.dir], message)

    def test_store(self):
        for args, message in [
            (["--max-connections", "-1"], "'-1' is not a whole number from 0 to"),
            (["--max-key-bytes", "0"], "'0' is not a whole number from 1 to"),
            (["--max-value-bytes", "1e999"], "'1e999' is not a whole number"),
            (["--port", "70000"], "'70000' is not a whole number from 0 to 65535"),
        ]:
            with self.subTest(args=args):
                self.refused(["store", *args], message)

    def test_status_and_daemon(self):
        for args, message in [
            (["status", "--rdzv-endpoint", "127.0.0.1:1", "--timeout", "nan"],
             "'nan' is not a number of seconds"),
            (["status", "--rdzv-endpoint", "127.0.0.1:1", "--timeout", "inf"],
             "'inf' is not a number of seconds"),
            (["status", "--rdzv-endpoint", "::1:29400"], "an IPv6 address needs brackets"),
            (["rendezvous", "--port", "-5"], "'-5' is not a whole number from 0 to 65535"),
            (["rendezvous", "--keep-finished-jobs", "-1"], "'-1' is not a whole number"),
        ]:
            with self.subTest(args=args):
                self.refused(args, message)


# Processes that hold a port and are not crun's service: one that listens and never answers,
# one that answers every connection with an HTTP reply, one that closes every connection.
HOLDERS = {
    "silent": "s.listen(); print('ready', flush=True); time.sleep(120)",
    "http": ("s.listen(); print('ready', flush=True)\n"
             "while True:\n c, _ = s.accept(); c.sendall(b'HTTP/1.0 200 OK\\r\\n\\r\\nhi'); c.close()"),
    "closing": ("s.listen(); print('ready', flush=True)\n"
                "while True:\n c, _ = s.accept(); c.close()"),
}


class HeldEndpoint(unittest.TestCase):
    """A rendezvous endpoint on this host whose port a process other than crun's service
    holds: crun must not join it and wait for nothing. It exits 1 within seconds, naming the
    port and the holder, and starts no worker."""

    def test_held_by_another_process(self):
        for name, body in HOLDERS.items():
            with self.subTest(holder=name):
                port = free_port()
                code = (f"import socket, time\ns = socket.socket()\n"
                        f"s.bind(('127.0.0.1', {port}))\n{body}\n")
                holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                          text=True)
                try:
                    self.assertEqual(holder.stdout.readline().strip(), "ready")
                    out = scratch_dir(self, "crun-held-")
                    t0 = time.monotonic()
                    r = subprocess.run(
                        [CRUN, "--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                         f"127.0.0.1:{port}", "--rdzv-conf", "join_timeout=60", ENV_DUMP, out],
                        capture_output=True, text=True, timeout=LIMIT_S)
                    took = time.monotonic() - t0
                    self.assertEqual(r.returncode, 1, r.stderr)
                    self.assertIn(f"port {port} of --rdzv-endpoint 127.0.0.1:{port} is held by",
                                  r.stderr)
                    self.assertIn(f"pid {holder.pid} (", r.stderr)
                    self.assertIn("not a crun rendezvous service", r.stderr)
                    self.assertLess(took, 20, "crun waited on a port nobody of crun's serves")
                    self.assertEqual(os.listdir(out), [], "a worker ran")
                    self.assertIsNone(holder.poll(), "crun must leave the holder alone")
                finally:
                    holder.kill()
                    holder.wait()
                    holder.stdout.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
