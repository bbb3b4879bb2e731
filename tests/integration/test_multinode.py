"""Several crun processes on loopback forming one job through the rendezvous service: formation
at MAX and at MIN, scale-up, a failure restarting every node with one restart count, the budget
running out with the same report everywhere, a SIGKILLed agent, the daemon with two jobs,
`crun status`, the static backend, and bad input. Real processes, sockets and signals."""
import json
import os
import re
import signal
import subprocess
import sys
import unittest

CRUN = os.environ["CRUN_BIN"]
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "workers", "node_probe.py")
LIMIT_S = 60

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from crun_testing import (alive, free_port, kill_all, probe_events, scratch_dir,  # noqa: E402
                          wait_for)


def root_cause(stderr):
    m = re.search(r"Root cause \(first failure\):\n(.*?)-{72}", stderr, re.S)
    return m.group(1) if m else None


class MultiNode(unittest.TestCase):
    def setUp(self):
        self.dir = scratch_dir(self, "crun-multinode-")
        self.port = free_port()
        self.procs = []

    def tearDown(self):
        kill_all(self.procs)

    def node(self, tag, *args, nproc=2, nnodes="2", endpoint=None, conf="", worker_args=()):
        """Starts one node's crun; `tag` is its node id. Node "a" hosts the service in its
        crun; the others join it (is_host says so: on loopback every node would qualify)."""
        endpoint = endpoint or f"127.0.0.1:{self.port}"
        rdzv_conf = f"node_id={tag},is_host={int(tag == 'a')}" + ("," + conf if conf else "")
        cmd = [CRUN, "--nnodes", nnodes, "--nproc-per-node", str(nproc), "--rdzv-endpoint",
               endpoint, "--rdzv-id", "job", "--rdzv-conf", rdzv_conf, *args, WORKER, self.dir,
               *worker_args]
        env = dict(os.environ, NODE_TAG=tag)
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
        self.procs.append(p)
        return p

    def finish(self, p):
        out, err = p.communicate(timeout=LIMIT_S)
        return p.returncode, err

    def events(self):
        return probe_events(self.dir)

    def test_forms_at_max_with_contiguous_ranks_and_one_store(self):
        a = self.node("a", nproc=2)
        b = self.node("b", nproc=3)  # heterogeneous --nproc-per-node
        for p in (a, b):
            code, err = self.finish(p)
            self.assertEqual(code, 0, err)
        ev = self.events()
        self.assertEqual(sorted(int(e["RANK"]) for e in ev), [0, 1, 2, 3, 4])
        for e in ev:
            self.assertEqual(e["WORLD_SIZE"], "5")
            self.assertEqual(e["GROUP_WORLD_SIZE"], "2")
            self.assertEqual(e["MASTER_ADDR"], "127.0.0.1")
            # Node order: host name, then node id: a is group 0 with ranks 0-1.
            self.assertEqual(e["GROUP_RANK"], "0" if e["NODE_TAG"] == "a" else "1")
        self.assertEqual(len({e["MASTER_PORT"] for e in ev}), 1)
        self.assertEqual({e["TORCHELASTIC_RUN_ID"] for e in ev}, {"job"})

    def test_forms_at_min_after_the_last_call(self):
        a = self.node("a", nnodes="2:3", conf="last_call_timeout=0.2")
        b = self.node("b", nnodes="2:3", conf="last_call_timeout=0.2")
        for p in (a, b):
            code, err = self.finish(p)
            self.assertEqual(code, 0, err)
        self.assertEqual({e["WORLD_SIZE"] for e in self.events()}, {"4"})

    def test_a_late_node_scales_the_job_up(self):
        a = self.node("a", nnodes="1:2", conf="last_call_timeout=0.1",
                      worker_args=["--exit-when-world", "4"])
        wait_for(lambda: len(self.events()) == 2, "node a's two workers (world 2)")
        self.assertEqual({e["WORLD_SIZE"] for e in self.events()}, {"2"})
        b = self.node("b", nnodes="1:2", conf="last_call_timeout=0.1",
                      worker_args=["--exit-when-world", "4"])
        for p in (a, b):
            code, err = self.finish(p)
            self.assertEqual(code, 0, err)
        later = self.events()[2:]
        self.assertEqual(len(later), 4)
        self.assertEqual({e["WORLD_SIZE"] for e in later}, {"4"})
        # A membership change does not spend the restart budget.
        self.assertEqual({e["TORCHELASTIC_RESTART_COUNT"] for e in later}, {"0"})

    def test_a_failure_restarts_every_node_with_one_restart_count(self):
        args = ("--max-restarts", "1")
        wa = ["--fail-rank", "3", "--fail-restart", "0", "--code", "3"]
        a = self.node("a", *args, worker_args=wa)
        b = self.node("b", *args, worker_args=wa)
        for p in (a, b):
            code, err = self.finish(p)
            self.assertEqual(code, 0, err)
        by_restart = {}
        for e in self.events():
            by_restart.setdefault(e["TORCHELASTIC_RESTART_COUNT"], []).append(e)
        self.assertEqual(sorted(by_restart), ["0", "1"])
        # Round 0: rank 3 failed (the others may have been stopped before they recorded a
        # start); round 1: every rank on both nodes, with restart count 1.
        self.assertIn(3, [int(e["RANK"]) for e in by_restart["0"]])
        self.assertEqual(sorted(int(e["RANK"]) for e in by_restart["1"]), [0, 1, 2, 3])
        for group in by_restart.values():
            self.assertEqual(len({e["MASTER_PORT"] for e in group}), 1)
        # Each round has its own store: a restarted worker never sees a key of the last one.
        self.assertNotEqual(by_restart["0"][0]["MASTER_PORT"], by_restart["1"][0]["MASTER_PORT"])

    def test_an_exhausted_budget_fails_every_node_with_the_same_report(self):
        wa = ["--fail-rank", "2", "--code", "7"]
        a = self.node("a", worker_args=wa)
        b = self.node("b", worker_args=wa)
        (ca, ea), (cb, eb) = self.finish(a), self.finish(b)
        self.assertEqual((ca, cb), (7, 7), ea + eb)
        ra, rb = root_cause(ea), root_cause(eb)
        self.assertIsNotNone(ra, ea)
        self.assertEqual(ra, rb)
        self.assertIn("rank      : 2 (local rank 0", ra)
        self.assertIn("exit      : exit code 7", ra)
        self.assertIn("node_probe: rank 2 fails on purpose with 7", ra)  # its stderr tail
        self.assertIn("the job failed on node 'b'", ea)

    def test_a_killed_agent_is_lost_at_once_and_the_survivor_re_forms(self):
        wa = ["--exit-when-world", "2"]
        conf = "last_call_timeout=0.1"
        a = self.node("a", nnodes="1:2", conf=conf, worker_args=wa)
        b = self.node("b", nnodes="1:2", conf=conf, worker_args=wa)
        wait_for(lambda: sum(e["WORLD_SIZE"] == "4" for e in self.events()) == 4,
                 "a round of both nodes")
        b_workers = [e["pid"] for e in self.events() if e["NODE_TAG"] == "b"]
        b.kill()  # SIGKILL: no goodbye; the service sees its session break
        b.communicate()
        code, err = self.finish(a)
        self.assertEqual(code, 0, err)
        self.assertIn("re-forming the job: node", err)
        self.assertEqual(self.events()[-1]["WORLD_SIZE"], "2")
        self.assertEqual(self.events()[-1]["TORCHELASTIC_RESTART_COUNT"], "0")
        wait_for(lambda: not any(alive(p) for p in b_workers), "b's workers to be gone")

    def joined(self, run_id, nodes):
        """Whether `crun status` shows `nodes` agents in the job."""
        r = subprocess.run([CRUN, "status", "--rdzv-endpoint", f"127.0.0.1:{self.port}",
                            "--rdzv-id", run_id, "--json"], capture_output=True, text=True)
        return r.returncode == 0 and len(json.loads(r.stdout)[0]["nodes"]) == nodes

    def test_conflicting_settings_and_a_duplicate_node_are_refused(self):
        a = self.node("a", nnodes="2:4", worker_args=["--until", "go"])
        wait_for(lambda: self.joined("job", 1), "node a to join")
        b = self.node("b", nnodes="2:3")
        code, err = self.finish(b)
        self.assertEqual(code, 1)
        self.assertIn("--nnodes differs: this job uses 2:4, the joining agent 2:3", err)
        self.assertIn(f"127.0.0.1:{self.port}", err)
        c = self.node("a", nnodes="2:4", conf="is_host=0")
        code, err = self.finish(c)
        self.assertEqual(code, 1)
        self.assertIn("another agent already joined run 'job' as node 'a'", err)
        # The agent already waiting is told at once, not at its join timeout (600 s).
        code, err = self.finish(a)
        self.assertEqual(code, 1, err)
        self.assertIn("asked to join as node 'a', which another agent holds", err)

    def plain_node(self, *args, nnodes="2", nproc=1, worker_args=()):
        """A crun as a user would start it on a laptop: no node_id, no is_host."""
        cmd = [CRUN, "--nnodes", nnodes, "--nproc-per-node", str(nproc), "--rdzv-endpoint",
               f"127.0.0.1:{self.port}", "--rdzv-id", "job", *args, WORKER, self.dir,
               *worker_args]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, NODE_TAG="plain"))
        self.procs.append(p)
        return p

    def test_two_agents_on_one_host_form_one_job(self):
        # torchrun's c10d backend gives each agent its own identity; so does crun: the first
        # hosts the service on the endpoint's port, the second finds it taken and joins.
        a = self.plain_node(nproc=2)
        b = self.plain_node(nproc=2)
        for p in (a, b):
            code, err = self.finish(p)
            self.assertEqual(code, 0, err)
        ev = self.events()
        self.assertEqual(sorted(int(e["RANK"]) for e in ev), [0, 1, 2, 3])
        self.assertEqual({e["GROUP_WORLD_SIZE"] for e in ev}, {"2"})
        self.assertEqual(sorted(e["GROUP_RANK"] for e in ev), ["0", "0", "1", "1"])
        self.assertEqual(len({e["MASTER_PORT"] for e in ev}), 1)

    def test_two_agents_on_one_host_join_a_daemon(self):
        daemon = subprocess.Popen([CRUN, "rendezvous", "--host", "127.0.0.1", "--port",
                                   str(self.port)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        self.procs.append(daemon)
        self.assertIn("listening on", daemon.stdout.readline())
        a, b = self.plain_node(nproc=1), self.plain_node(nproc=1)
        for p in (a, b):
            code, err = self.finish(p)
            self.assertEqual(code, 0, err)
        self.assertEqual(sorted(int(e["RANK"]) for e in self.events()), [0, 1])

    def test_four_agents_on_one_host_with_an_elastic_range(self):
        procs = [self.plain_node("--rdzv-conf", "last_call_timeout=0.5", nnodes="2:4")
                 for _ in range(4)]
        for p in procs:
            code, err = self.finish(p)
            self.assertEqual(code, 0, err)
        # Every agent ran in some round; the last round had all four once they had joined.
        ev = self.events()
        worlds = [int(e["WORLD_SIZE"]) for e in ev]
        self.assertEqual(max(worlds), 4)
        last = [e for e in ev if e["WORLD_SIZE"] == "4"]
        self.assertEqual(sorted(int(e["RANK"]) for e in last)[:4], [0, 1, 2, 3])

    def test_an_unreachable_endpoint_fails_naming_it(self):
        p = self.node("x", conf="join_timeout=0.5")
        code, err = self.finish(p)
        self.assertEqual(code, 1, err)
        self.assertIn(f"cannot reach the rendezvous service at 127.0.0.1:{self.port}", err)

    def test_bad_rendezvous_flags_are_usage_errors(self):
        for args, message in [
            (["--rdzv-conf", "store_type=file"], "only store_type=tcp is accepted"),
            (["--rdzv-conf", "join_timeout=soon"], "join_timeout='soon' is not a number"),
            (["--rdzv-endpoint", "127.0.0.1:99999"], "port '99999' is not in 1..65535"),
            (["--rdzv-backend", "etcd-v2"], "crun does not speak it; --rdzv-backend etcd-v3"),
            (["--rdzv-backend", "zk"], "--rdzv-backend 'zk': expected crun (or c10d), etcd-v3 (or etcd) or static"),
            (["--nnodes", "3:2"], "--nnodes '3:2': expected N or MIN:MAX"),
        ]:
            base = [] if "--rdzv-endpoint" in args else ["--rdzv-endpoint", f"127.0.0.1:{self.port}"]
            nnodes = [] if "--nnodes" in args else ["--nnodes", "2"]
            cmd = [CRUN, *nnodes, *base, *args, WORKER, self.dir]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT_S)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(message, r.stderr)
        # An unknown key is named and ignored, as torchrun ignores it: the job goes on (and
        # here, alone, runs out of join time).
        r = subprocess.run([CRUN, "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{self.port}",
                            "--rdzv-conf", "bogus=1,join_timeout=0.3", WORKER, self.dir],
                           capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("--rdzv-conf: ignoring unknown key 'bogus'", r.stderr)
        self.assertIn("joined within", r.stderr)

    def test_daemon_serves_two_jobs_and_status_shows_them(self):
        daemon = subprocess.Popen([CRUN, "rendezvous", "--host", "127.0.0.1", "--port", "0"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(daemon)
        line = daemon.stdout.readline()
        self.assertIn("crun rendezvous listening on", line)
        port = int(line.rsplit(":", 1)[1])
        endpoint = f"127.0.0.1:{port}"
        jobs = []
        for job, tag_nodes in (("j1", ("a", "b")), ("j2", ("a",))):
            for tag in tag_nodes:
                cmd = [CRUN, "--nnodes", str(len(tag_nodes)), "--nproc-per-node", "1",
                       "--rdzv-endpoint", endpoint, "--rdzv-id", job, "--rdzv-conf",
                       f"node_id={tag},is_host=0", WORKER, self.dir, "--until", "go"]
                p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=dict(os.environ, NODE_TAG=f"{job}-{tag}"))
                self.procs.append(p)
                jobs.append(p)
        wait_for(lambda: len(self.events()) == 3, "three workers of two jobs")
        r = subprocess.run([CRUN, "status", "--rdzv-endpoint", endpoint, "--json"],
                           capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(r.returncode, 0, r.stderr)
        status = {j["run_id"]: j for j in json.loads(r.stdout)}
        self.assertEqual(sorted(status), ["j1", "j2"])
        self.assertEqual(status["j1"]["phase"], "running")
        self.assertEqual(status["j1"]["world_size"], 2)
        self.assertEqual(sorted(n["node_id"] for n in status["j1"]["nodes"]), ["a", "b"])
        self.assertEqual({n["state"] for n in status["j1"]["nodes"]}, {"member"})
        text = subprocess.run([CRUN, "status", "--rdzv-endpoint", endpoint, "--rdzv-id", "j2"],
                              capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertIn("job j2: running, round 0", text.stdout)
        self.assertNotIn("job j1", text.stdout)
        open(os.path.join(self.dir, "go"), "w").close()
        for p in jobs:
            code, err = self.finish(p)
            self.assertEqual(code, 0, err)
        r = subprocess.run([CRUN, "status", "--rdzv-endpoint", endpoint, "--rdzv-id", "j1",
                            "--json"], capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(json.loads(r.stdout)[0]["phase"], "succeeded")
        unknown = subprocess.run([CRUN, "status", "--rdzv-endpoint", endpoint, "--rdzv-id", "zz"],
                                 capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(unknown.returncode, 1)
        self.assertIn("knows no job with run id 'zz'", unknown.stderr)
        daemon.send_signal(signal.SIGTERM)
        daemon.communicate(timeout=LIMIT_S)
        self.assertEqual(daemon.returncode, 0)

    def test_status_of_an_unreachable_endpoint_names_it(self):
        r = subprocess.run([CRUN, "status", "--rdzv-endpoint", f"127.0.0.1:{self.port}",
                            "--timeout", "0.5"], capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"no answer from the rendezvous service at 127.0.0.1:{self.port}", r.stderr)

    def test_static_backend(self):
        procs = []
        for rank in (1, 0):  # node 1 first: its workers wait for node 0's store
            cmd = [CRUN, "--rdzv-backend", "static", "--nnodes", "2", "--nproc-per-node", "2",
                   "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port",
                   str(self.port), WORKER, self.dir]
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=dict(os.environ, NODE_TAG=str(rank)))
            self.procs.append(p)
            procs.append(p)
        for p in procs:
            code, err = self.finish(p)
            self.assertEqual(code, 0, err)
        ev = self.events()
        self.assertEqual(sorted(int(e["RANK"]) for e in ev), [0, 1, 2, 3])
        for e in ev:
            self.assertEqual(e["GROUP_RANK"], e["NODE_TAG"])
            self.assertEqual(int(e["RANK"]) // 2, int(e["NODE_TAG"]))
            self.assertEqual(e["MASTER_PORT"], str(self.port))
            self.assertEqual(e["WORLD_SIZE"], "4")


if __name__ == "__main__":
    unittest.main(verbosity=2)
