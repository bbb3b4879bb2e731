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

    def test_a_barrier_storm_registers_every_client_and_wakes_each(self):
        # store_scale_bench's run: two generators on one shared key, the first sets it.
        gens = []
        try:
            for source in ("127.0.0.2", "127.0.0.3"):
                gens.append(subprocess.Popen(
                    [LOADGEN, "--port", self.port, "--dialect", "modern", "--storm", "150",
                     "--barrier", "/smoke/go", "--source", source],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    text=True))
            storms = [json.loads(g.stdout.readline()) for g in gens]
            self.assertEqual([(s["held"], s["refused"]) for s in storms], [(150, 0)] * 2)
            for g in gens:
                self.assertEqual(g.stdout.readline().strip(), "READY")
            # Nobody is woken before the key is set: the second generator goes first.
            gens[1].stdin.write("go\n")
            gens[1].stdin.flush()
            gens[0].stdin.write("go set\n")
            gens[0].stdin.flush()
            goes = [json.loads(g.stdout.readline()) for g in gens]
            self.assertEqual([(x["woken"], x["held"]) for x in goes], [(150, 150)] * 2)
        finally:
            for g in gens:  # each ended, even when one before it would not end
                try:
                    g.communicate(timeout=60)  # closes its stdin: it lets its clients go
                except subprocess.TimeoutExpired:
                    g.kill()
                    g.communicate(timeout=60)


if __name__ == "__main__":
    unittest.main(verbosity=2)
