"""The benchmarks' private network namespace (bench_support.in_private_netns) does not outlive
its run: gone after SIGTERM to the benchmark, and one left by a benchmark killed with SIGKILL
is swept by the next run, while a live run's is kept; the same for the test hosts of
tests/pylib/fabric.py left by a test that ctest's TIMEOUT killed. Needs root and iproute2."""
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
import bench_support  # noqa: E402

LIMIT_S = 30


def namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split(" ", 1)[0] for line in out.splitlines() if line.strip()}


@unittest.skipIf(os.geteuid() != 0 or shutil.which("ip") is None, "needs root and iproute2")
class PrivateNetns(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="crun-netns-test-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def test_sigterm_to_the_benchmark_removes_its_namespace(self):
        # A benchmark that, inside its namespace, says so and then waits to be ended.
        script = os.path.join(self.dir, "bench.py")
        ready = os.path.join(self.dir, "inside")
        with open(script, "w") as f:
            f.write(textwrap.dedent(f"""\
                import os, sys, time
                sys.path.insert(0, {os.path.join(HERE, "..", "pylib")!r})
                from bench_support import in_private_netns
                if "CRUN_BENCH_IN_NETNS" not in os.environ:
                    sys.exit(in_private_netns([os.path.abspath(__file__)]))
                open({ready!r}, "w").write(os.environ["CRUN_BENCH_IN_NETNS"])
                time.sleep({LIMIT_S})
                """))
        p = subprocess.Popen([sys.executable, script])
        ns = f"{bench_support.NETNS_PREFIX}{p.pid}"
        deadline = time.monotonic() + LIMIT_S
        while not os.path.exists(ready) or not open(ready).read():
            self.assertLess(time.monotonic(), deadline, "the benchmark never ran inside")
            self.assertIsNone(p.poll(), "the benchmark ended early")
            time.sleep(0.05)  # polling a file another process writes
        self.assertIn(ns, namespaces())
        p.terminate()
        self.assertNotEqual(p.wait(timeout=LIMIT_S), 0)
        self.assertNotIn(ns, namespaces())

    def test_a_killed_runs_namespace_is_swept_and_a_live_ones_kept(self):
        dead = subprocess.Popen(["true"])
        dead.wait()
        stale = f"{bench_support.NETNS_PREFIX}{dead.pid}"
        live = f"{bench_support.NETNS_PREFIX}{os.getpid()}"
        for ns in (stale, live):
            subprocess.run(["ip", "netns", "add", ns], check=True)
            self.addCleanup(subprocess.run, ["ip", "netns", "del", ns], capture_output=True)
        swept = bench_support.sweep_stale_netns()
        self.assertIn(stale, swept)
        self.assertNotIn(live, swept)
        self.assertNotIn(stale, namespaces())
        self.assertIn(live, namespaces())

    def test_a_killed_tests_fabric_is_swept_when_the_next_one_starts(self):
        """tests/pylib/fabric.py's hosts (crun<pid>-<n>-<host>) left by a test that ctest's TIMEOUT
        killed go when the next Fabric starts; a live test's are kept."""
        import fabric
        dead = subprocess.Popen(["true"])
        dead.wait()
        stale = [f"crun{dead.pid}-0-sw", f"crun{dead.pid}-0-a"]
        live = f"crun{os.getppid()}-0-a"  # a process that is alive: this test's parent
        for ns in (*stale, live):
            subprocess.run(["ip", "netns", "add", ns], check=True)
            self.addCleanup(subprocess.run, ["ip", "netns", "del", ns], capture_output=True)
        with fabric.Fabric(["a"]) as fab:
            self.assertIn(fab.ns("a"), namespaces())
            self.assertEqual([ns for ns in stale if ns in namespaces()], [])
            self.assertIn(live, namespaces())
        self.assertNotIn(fab.ns("a"), namespaces())


if __name__ == "__main__":
    unittest.main(verbosity=2)
