"""Checks that the rendezvous load generator works against a `crun rendezvous` daemon and
through a 3-member etcd: every simulated agent forms a round, restarts after the failure, and
gets the outcome (counts, not timings: benchmarks never fail a build on speed)."""
import argparse
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from etcd_cluster import EtcdCluster, Loopback, missing_programs  # noqa: E402
from crun_testing import free_port  # noqa: E402

CRUN, LOADGEN = os.environ["CRUN_BIN"], os.environ["RDZV_LOADGEN_BIN"]
BARE = os.environ["BARE_SERVER_BIN"]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rdzv_bench  # noqa: E402


class RdzvLoadgenSmoke(unittest.TestCase):
    def test_200_agents_go_through_every_phase(self):
        # Heartbeats as datagrams (every agent's acked), and on the streams when told.
        for extra, heard in (((), 200), (("--stream-beats",), 0)):
            with self.subTest(extra=extra):
                self.run_200(extra, heard)

    def run_200(self, extra, heard):
        daemon = subprocess.Popen([CRUN, "rendezvous", "--host", "127.0.0.1", "--port", "0"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            ready, _, _ = select.select([daemon.stdout], [], [], 30)
            self.assertTrue(ready, "crun rendezvous printed no address")
            port = daemon.stdout.readline().rsplit(":", 1)[1].strip()
            r = subprocess.run([LOADGEN, "--endpoint", f"127.0.0.1:{port}", "--agents", "200",
                                "--channels", "4", "--steady-ms", "200", "--service-pid",
                                str(daemon.pid), *extra], capture_output=True, text=True,
                               timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            out = json.loads(r.stdout)
            self.assertEqual(out["errors"], 0)
            for phase in ("form", "told", "reformed", "finish"):
                self.assertIn("ms", out[phase])
            self.assertGreater(out["steady"]["heartbeats"], 0)
            self.assertEqual(out["steady"]["heard_over_udp"], heard)
            # Acked in time: no datagram beat had to go on its stream too.
            self.assertEqual(out["steady"]["streamed_too"], 0)
            self.assertGreater(out["service_rss_connected_mib"], 0)  # /proc was read
        finally:
            daemon.terminate()
            try:
                _, err = daemon.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()  # not left running; the assertion below then fails
                _, err = daemon.communicate(timeout=30)
        self.assertEqual(daemon.returncode, 0, err)

    def test_the_memory_baseline_holds_every_session_open(self):
        # rdzv_bench's baseline: a bare gRPC server with 3,000 of the load generator's sessions
        # open (each opened by the server before the memory is read), then all closed cleanly.
        args = argparse.Namespace(bare_server=BARE, loadgen=LOADGEN)
        small, _ = rdzv_bench.bare_baseline(args, 1, steady_ms=200)
        large, per_message = rdzv_bench.bare_baseline(args, 3000, steady_ms=500)
        self.assertGreater(small, 0)  # /proc was read
        self.assertGreater(large, small)  # the sessions' memory is there to be measured
        self.assertGreater(per_message, 0)  # its beats were read, at a cost

    @unittest.skipIf(missing_programs(), f"{missing_programs()} not installed")
    def test_100_agents_through_etcd_in_three_shards_go_through_every_phase(self):
        root = tempfile.mkdtemp(prefix="crun-rdzv-smoke-etcd-")
        ports = {h: (free_port(), free_port()) for h in ("e1", "e2", "e3")}
        try:
            with EtcdCluster(Loopback(), ["e1", "e2", "e3"], root, ports=ports) as etcd:
                pids = [a for p in etcd.procs.values() for a in ("--service-pid", str(p.pid))]
                r = subprocess.run([LOADGEN, "--etcd", etcd.endpoints(), "--agents", "100",
                                    "--procs", "3", "--steady-ms", "200", *pids],
                                   capture_output=True, text=True, timeout=120)
                self.assertEqual(r.returncode, 0, r.stderr)
                out = json.loads(r.stdout)
                self.assertEqual(out["errors"], 0)
                for phase in ("form", "told", "reformed", "finish"):
                    self.assertIn("ms", out[phase])
                self.assertEqual(out["procs"], 3)
                self.assertGreater(out["form"]["agents_cpu_s"], 0)  # the shards' /proc read
                self.assertGreater(out["service_idle_rss_mib"], 0)  # every member's /proc read
                # a/job changed for the round, the stop, the next round and the outcome; not
                # for each of the 100 joins.
                self.assertGreaterEqual(out["job_writes"], 4)
                self.assertLess(out["job_writes"], 20)
                # Every agent left: its lease revoked, its key gone.
                keys = etcd.etcdctl("get", "--prefix", "--keys-only", "/crun/rdzv/bench/nodes/")
                self.assertEqual(keys.stdout.strip(), "", keys.stdout)
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
