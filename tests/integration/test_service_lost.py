"""One rule for a lost service, in every phase (docs/rendezvous.md, docs/reliability.md): a
`crun rendezvous` daemon is SIGKILLed and never started again while its agents are gathering,
running, stopping and rejoining. With join_timeout far above reconnect_timeout, every agent
whose session was open ends within reconnect_timeout (plus what stopping its workers takes),
with exit 1 and a reason that names reconnect_timeout. Each phase's time from the kill to the
agent's exit is printed (the reliability table has them)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from crun_testing import kill_all, processes_mentioning, wait_for  # noqa: E402

CRUN = os.environ["CRUN_BIN"]
RECONNECT_S = 3
CONF = f"join_timeout=600,reconnect_timeout={RECONNECT_S},heartbeat_timeout=3"
LIMIT_S = 60


class LostService(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="crun-lost-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.procs = []
        self.daemon = subprocess.Popen([CRUN, "rendezvous", "--host", "127.0.0.1", "--port", "0"],
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                       text=True)
        self.procs.append(self.daemon)
        line = self.daemon.stdout.readline()
        self.assertIn("crun rendezvous listening on", line)
        self.endpoint = "127.0.0.1:" + line.rsplit(":", 1)[1].strip()
        self.run_id = uuid.uuid4().hex[:12]

    def tearDown(self):
        kill_all(self.procs)

    def agent(self, tag, worker, nnodes=2, extra=()):
        cmd = [CRUN, "--nnodes", str(nnodes), "--nproc-per-node", "1", "--rdzv-endpoint",
               self.endpoint, "--rdzv-id", self.run_id, "--rdzv-conf",
               f"node_id={tag},is_host=0,{CONF}", "--max-restarts", "3", *extra,
               "sh", "-c", worker, tag, self.dir]
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        return p

    def status(self):
        r = subprocess.run([CRUN, "status", "--rdzv-endpoint", self.endpoint, "--rdzv-id",
                            self.run_id, "--json"], capture_output=True, text=True, timeout=30)
        return json.loads(r.stdout)[0] if r.returncode == 0 else None

    def kill_daemon_and_judge(self, phase, agents):
        """SIGKILLs the daemon; every agent must exit 1 naming reconnect_timeout. Returns the
        seconds from the kill to each agent's exit."""
        self.daemon.send_signal(signal.SIGKILL)
        self.daemon.wait(timeout=LIMIT_S)
        killed = time.monotonic()
        took = {}
        for tag, p in agents.items():
            _, err = p.communicate(timeout=LIMIT_S)
            took[tag] = time.monotonic() - killed
            self.assertEqual(p.returncode, 1, f"{phase}, agent {tag}:\n{err[-3000:]}")
            self.assertIn("reconnect_timeout", err, f"{phase}, agent {tag}:\n{err[-3000:]}")
            self.assertNotIn("join_timeout", err.split("reconnect_timeout")[-1])
        print(f"{phase}: " + ", ".join(f"agent {t} exited {s:.2f} s after the kill"
                                       for t, s in took.items()), flush=True)
        self.assertEqual(processes_mentioning(self.dir), [], "processes left running")
        return took

    def test_gathering(self):
        """One agent of two joined; the round never formed."""
        a = self.agent("a", 'touch "$1/never"; exit 0')
        wait_for(lambda: (self.status() or {}).get("nodes"), "agent a joined", limit=LIMIT_S)
        took = self.kill_daemon_and_judge("gathering", {"a": a})
        self.assertLess(took["a"], RECONNECT_S + 10)

    def test_running(self):
        """Both agents' workers run."""
        worker = 'touch "$1/running.$0"; exec sleep 600'
        agents = {t: self.agent(t, worker) for t in ("a", "b")}
        wait_for(lambda: all(os.path.exists(os.path.join(self.dir, f"running.{t}"))
                             for t in agents), "both workers running", limit=LIMIT_S)
        took = self.kill_daemon_and_judge("running", agents)
        for t in agents:
            self.assertLess(took[t], RECONNECT_S + 10)

    def test_stopping_and_rejoining(self):
        """a's worker fails once b's runs: a stops at once and joins the next round (rejoining)
        while b's worker ignores SIGTERM for its 5 s grace (stopping)."""
        fail_a = ('if [ "$0" = a ]; then i=0; while [ ! -e "$1/stopping" ] && [ $i -lt 600 ]; '
                  'do sleep 0.05; i=$((i + 1)); done; exit 3; fi; '
                  'trap "" TERM; touch "$1/stopping"; while :; do sleep 1; done')
        a = self.agent("a", fail_a, extra=("--shutdown-timeout", "5"))
        b = self.agent("b", fail_a, extra=("--shutdown-timeout", "5"))

        def rejoined():
            s = self.status()
            return s is not None and s.get("restarts_used") == 1 and any(
                n["node_id"] == "a" and n["state"] == "joined" for n in s.get("nodes", []))
        wait_for(rejoined, "a rejoined after its failure", limit=LIMIT_S)
        self.assertIsNone(a.poll())
        self.assertIsNone(b.poll())
        took = self.kill_daemon_and_judge("stopping (b) and rejoining (a)", {"a": a, "b": b})
        self.assertLess(took["a"], RECONNECT_S + 10)
        self.assertLess(took["b"], RECONNECT_S + 5 + 10)  # plus its workers' grace


if __name__ == "__main__":
    unittest.main()
