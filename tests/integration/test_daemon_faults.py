"""A `crun rendezvous` daemon that is slow, stopped or restarted while agents join: jobs that
should survive must survive. Real daemon, real agents on loopback, real signals."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

CRUN = os.environ["CRUN_BIN"]
HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "..", "workers", "node_probe.py")
LIMIT_S = 120

sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from crun_testing import free_port, kill_all, probe_events, wait_for  # noqa: E402


class DaemonFaults(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="crun-daemon-faults-")
        self.port = free_port()
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGCONT)
                except ProcessLookupError:
                    pass
        kill_all(self.procs)

    def daemon(self):
        d = subprocess.Popen([CRUN, "rendezvous", "--host", "127.0.0.1", "--port", str(self.port)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(d)
        self.assertIn("listening on", d.stdout.readline())
        return d

    def agent(self, run_id, tag, nnodes=2, conf=""):
        cmd = [CRUN, "--nnodes", str(nnodes), "--nproc-per-node", "1", "--rdzv-endpoint",
               f"127.0.0.1:{self.port}", "--rdzv-id", run_id,
               "--rdzv-conf", "is_host=0" + ("," + conf if conf else ""), PROBE, self.dir]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, NODE_TAG=tag))
        self.procs.append(p)
        return p

    def joined(self, run_id, n):
        r = subprocess.run([CRUN, "status", "--rdzv-endpoint", f"127.0.0.1:{self.port}",
                            "--rdzv-id", run_id, "--json", "--timeout", "2"],
                           capture_output=True, text=True, timeout=LIMIT_S)
        return r.returncode == 0 and len(json.loads(r.stdout)[0]["nodes"]) == n

    def finish_all(self, agents):
        for p in agents:
            _, err = p.communicate(timeout=LIMIT_S)
            self.assertEqual(p.returncode, 0, err)

    def test_a_daemon_stopped_while_agents_gather_is_waited_for(self):
        for pause in (1, 5):
            with self.subTest(pause_s=pause):
                d = self.daemon()
                run = f"stop{pause}"
                a = self.agent(run, "a")
                wait_for(lambda: self.joined(run, 1), "a to join")
                d.send_signal(signal.SIGSTOP)
                b = self.agent(run, "b")  # its connection waits in the daemon's backlog
                time.sleep(pause)  # the fault itself: a daemon that does nothing for a while
                d.send_signal(signal.SIGCONT)
                self.finish_all([a, b])
                self.assertEqual(len([e for e in probe_events(self.dir)
                                      if e["TORCHELASTIC_RUN_ID"] == run]), 2)
                d.send_signal(signal.SIGTERM)
                d.communicate(timeout=LIMIT_S)

    def test_a_daemon_killed_and_restarted_while_agents_gather_is_rejoined(self):
        d = self.daemon()
        a = self.agent("job", "a")
        wait_for(lambda: self.joined("job", 1), "a to join")
        d.kill()  # a crash, not a goodbye
        d.communicate()
        b = self.agent("job", "b")
        time.sleep(1)  # the fault itself: the daemon is down for a second
        self.daemon()
        self.finish_all([a, b])
        self.assertEqual(sorted(e["NODE_TAG"] for e in probe_events(self.dir)), ["a", "b"])

    def test_fifty_jobs_at_once_with_the_daemon_stopped_during_the_joins(self):
        d = self.daemon()
        agents = [self.agent(f"j{i}", f"{i}{side}") for i in range(50) for side in "ab"]
        time.sleep(0.3)  # the fault lands while the 100 agents are joining
        d.send_signal(signal.SIGSTOP)
        time.sleep(1)
        d.send_signal(signal.SIGCONT)
        self.finish_all(agents)
        self.assertEqual(len(probe_events(self.dir)), 100)


if __name__ == "__main__":
    unittest.main(verbosity=2)
