"""Values crun must refuse, every command: exit 2, a short message naming the value, and
nothing created or left running. One table per command; real processes."""
import os
import subprocess
import sys
import tempfile
import time
import unittest

CRUN = os.environ["CRUN_BIN"]
HERE = os.path.dirname(os.path.abspath(__file__))
ENV_DUMP = os.path.join(HERE, "..", "workers", "env_dump.py")
LIMIT_S = 60


class CliRefusals(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="crun-refusals-")
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


if __name__ == "__main__":
    unittest.main(verbosity=2)
