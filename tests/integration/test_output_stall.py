"""Output back-pressure never reaches the control plane (docs/reliability.md, "A stalled
reader"): one agent's stdout and stderr go into a pipe that nobody reads for STALL_S seconds (a
paused pager, a `tee` on a slow file system, a stuck log shipper) while its worker writes
300 KB to stderr. The other agent must not declare it lost, and both exit 0 once the reader
comes back: on crun's rendezvous service, and on a real etcd. The workers run through the
whole stall (they end once the test says so), so that the agents' heartbeats must go on while
a's output waits. Standalone, a reader that stalls then drains gets every worker line, in
order.

  STALL_S   how long the reader stalls (default 10, three of the agents' heartbeat timeouts of
            3 s; docs/reliability.md records a 60 s run)"""
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
import lanes  # noqa: E402
from crun_testing import free_port, kill_all, processes_mentioning  # noqa: E402
from etcd_cluster import EtcdCluster, Loopback, missing_programs  # noqa: E402

CRUN = os.environ["CRUN_BIN"]
CHATTER = os.path.join(HERE, "..", "workers", "chatter.sh")
STALL_S = float(os.environ.get("STALL_S", "10"))
LIMIT_S = STALL_S + 120
LINES = 3000  # of about 100 bytes: 300 KB


def drain(proc, into):
    """Reads `proc`'s merged output to its end, into the list `into` (a reader thread)."""
    into.append(proc.stdout.read())


class StalledReader(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="crun-stall-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def two_agents(self, rdzv):
        """Agent a's output is read only after STALL_S; b's all along. Returns (a's output,
        b's output) once both ended, each having exited 0."""
        common = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-id", uuid.uuid4().hex[:12],
                  *rdzv, "--rdzv-conf", "heartbeat_timeout=3", "--no-python", CHATTER,
                  str(LINES), os.path.join(self.dir, "go")]
        a = subprocess.Popen([CRUN, *common], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
        b = subprocess.Popen([CRUN, *common], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
        b_out, a_out = [], []
        b_reader = threading.Thread(target=drain, args=(b, b_out))
        b_reader.start()
        try:
            # The stall: nobody reads a's pipe while both workers run. b must neither end nor
            # give a up meanwhile.
            stalled_at = time.monotonic()
            with self.assertRaises(subprocess.TimeoutExpired, msg="b ended during the stall"):
                b.wait(timeout=STALL_S)
            print(f"a's reader stalled for {time.monotonic() - stalled_at:.1f} s", flush=True)
            open(os.path.join(self.dir, "go"), "w").close()  # the workers may end
            a_reader = threading.Thread(target=drain, args=(a, a_out))
            a_reader.start()
            a.wait(timeout=LIMIT_S)
            b.wait(timeout=LIMIT_S)
            a_reader.join(timeout=LIMIT_S)
            b_reader.join(timeout=LIMIT_S)
        finally:
            kill_all([a, b])
        a_text = b"".join(a_out).decode(errors="replace")
        b_text = b"".join(b_out).decode(errors="replace")
        self.assertEqual(a.returncode, 0, a_text[-3000:])
        self.assertEqual(b.returncode, 0, b_text[-3000:])
        for text in (a_text, b_text):
            self.assertNotIn("lost", text)
            self.assertNotIn("re-forming", text)
        # a's worker's 300 KB came through whole once the reader was back.
        self.assertEqual(a_text.count(" line "), LINES, a_text[-2000:])
        self.assertEqual(processes_mentioning(self.dir), [], "processes left running")
        return a_text, b_text

    def test_service(self):
        self.two_agents(["--rdzv-backend", "c10d", "--rdzv-endpoint",
                         f"127.0.0.1:{free_port()}"])

    def test_etcd(self):
        self.assertEqual(missing_programs(), [], "scripts/install-deps.sh installs etcd")
        ports = {"e": (free_port(), free_port())}
        etcd_dir = tempfile.mkdtemp(prefix="crun-stall-etcd-")  # not the job's: it stays up
        self.addCleanup(shutil.rmtree, etcd_dir, ignore_errors=True)
        with EtcdCluster(Loopback(), ["e"], etcd_dir, ports=ports) as etcd:
            self.two_agents(["--rdzv-backend", "etcd-v3", "--rdzv-endpoint", etcd.endpoints()])

    def test_standalone_loses_no_line(self):
        """A reader that stalls for a while and then drains gets every line, in order: 50,000
        lines of each of two workers (10 MB, far more than the pipes and crun's queue hold)."""
        lines = 50000
        p = subprocess.Popen([CRUN, "--standalone", "--nproc-per-node", "2", "--tee", "3",
                              "--no-python", CHATTER, str(lines), self.dir], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out = []
        try:
            with self.assertRaises(subprocess.TimeoutExpired, msg="done without a reader"):
                p.wait(timeout=min(STALL_S, 5))
            reader = threading.Thread(target=drain, args=(p, out))
            reader.start()
            p.wait(timeout=LIMIT_S)
            reader.join(timeout=LIMIT_S)
        finally:
            kill_all([p])
        text = b"".join(out).decode(errors="replace")
        self.assertEqual(p.returncode, 0, text[-3000:])
        for rank in (0, 1):
            got = [line.split(" line ", 1)[1][:6] for line in text.splitlines()
                   if f"rank {rank} line " in line]
            self.assertEqual(got, [f"{i:06d}" for i in range(lines)], f"rank {rank}'s lines")
        self.assertNotIn("dropped", text)


if __name__ == "__main__":
    # The three cases at once (tests/pylib/lanes.py): each mostly waits out its stall, and
    # what runs beside is the loaded machine a stall must survive anyway.
    lanes.main(3)
