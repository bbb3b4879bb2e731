"""Checks that the benchmark's load generator works against `crun store` (counts, not
timings: benchmarks never fail a build on speed)."""
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from crun_testing import start_store, stop_store  # noqa: E402

CRUN, LOADGEN = os.environ["CRUN_BIN"], os.environ["LOADGEN_BIN"]


class LoadgenSmoke(unittest.TestCase):
    def setUp(self):
        self.store, port = start_store(CRUN, "--log-level", "error")
        self.port = str(port)

    def tearDown(self):
        rc, err = stop_store(self.store)
        self.assertEqual(rc, 0, err)

    def run_gen(self, *args, stdin=None):
        r = subprocess.run([LOADGEN, "--port", self.port, *args], capture_output=True, text=True,
                           timeout=120, input=stdin)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout.splitlines()[0])

    def test_every_op_in_both_dialects_completes_operations(self):
        for dialect in ("modern", "legacy"):
            for op in ("set", "get", "add", "wait"):
                with self.subTest(dialect=dialect, op=op):
                    r = self.run_gen("--dialect", dialect, "--op", op, "--clients", "4",
                                     "--warmup-ms", "20", "--duration-ms", "200")
                    self.assertGreater(r["ops"], 0)
                    self.assertGreaterEqual(r["total_ops"], r["ops"])

    def test_storm_connections_are_all_served(self):
        r = self.run_gen("--storm", "200", "--source", "127.0.0.2", stdin="")
        self.assertEqual((r["held"], r["refused"], r["pending"]), (200, 0, 0))


if __name__ == "__main__":
    unittest.main(verbosity=2)
