"""Checks that the rendezvous load generator works against a `crun rendezvous` daemon: every
simulated agent forms a round, restarts after the failure, and gets the outcome (counts, not
timings: benchmarks never fail a build on speed)."""
import json
import os
import select
import subprocess
import unittest

CRUN, LOADGEN = os.environ["CRUN_BIN"], os.environ["RDZV_LOADGEN_BIN"]


class RdzvLoadgenSmoke(unittest.TestCase):
    def test_200_agents_go_through_every_phase(self):
        daemon = subprocess.Popen([CRUN, "rendezvous", "--host", "127.0.0.1", "--port", "0"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            ready, _, _ = select.select([daemon.stdout], [], [], 30)
            self.assertTrue(ready, "crun rendezvous printed no address")
            port = daemon.stdout.readline().rsplit(":", 1)[1].strip()
            r = subprocess.run([LOADGEN, "--endpoint", f"127.0.0.1:{port}", "--agents", "200",
                                "--channels", "4", "--steady-ms", "200", "--service-pid",
                                str(daemon.pid)], capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            out = json.loads(r.stdout)
            self.assertEqual(out["errors"], 0)
            for phase in ("form", "told", "reformed", "finish"):
                self.assertIn("ms", out[phase])
            self.assertGreater(out["steady"]["heartbeats"], 0)
            self.assertGreater(out["service_rss_connected_mib"], 0)  # /proc was read
        finally:
            daemon.terminate()
            _, err = daemon.communicate(timeout=30)
        self.assertEqual(daemon.returncode, 0, err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
