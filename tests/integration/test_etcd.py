"""crun's rendezvous kept in etcd (--rdzv-backend etcd-v3) against a real 3-member etcd cluster
(Debian's etcd-server) across network namespaces (tests/pylib/fabric.py): every host runs one
etcd member and one crun, as a fleet that keeps its own etcd would. The job survives the loss
of any one machine: an etcd member, the host serving the round's store, a partitioned agent.
The tests that leave etcd's members alone share one cluster (setUpClass), each under a run id
of its own; those that kill members, and the one with TLS and users, start their own. The
tests run three at a time (tests/pylib/lanes.py): each mostly waits out leases, outages and
its cluster's start. Needs root, as CI runs it."""
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

CRUN = os.environ["CRUN_BIN"]
HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "..", "workers", "node_probe.py")
PYTHON = os.environ.get("PYTHON_EXEC", sys.executable)
LIMIT_S = 120
# Fast failure detection for the tests: a lease of 2 s (etcd's own minimum is about 1.5 s with
# the 100 ms heartbeat the members run with here).
FAST = "heartbeat_timeout=2,last_call_timeout=0.2"

sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from crun_testing import (alive, commands_mentioning, kill_all, make_certificates,  # noqa: E402
                          probe_events, wait_for)
from etcd_cluster import EtcdCluster, missing_programs  # noqa: E402
from fabric import Fabric  # noqa: E402
import lanes  # noqa: E402


class EtcdRendezvous(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        missing = missing_programs()
        if missing:
            raise AssertionError(f"{', '.join(missing)} not found: install etcd-server and "
                                 "etcd-client (scripts/install-deps.sh)")
        # The shared cluster: members on a, b and c; d is the host a test partitions, e one
        # where nobody listens. Its data goes with the class.
        root = tempfile.mkdtemp(prefix="crun-etcd-shared-")
        cls.addClassCleanup(shutil.rmtree, root, ignore_errors=True)
        cls.fab = Fabric(["a", "b", "c", "d", "e"]).__enter__()
        cls.addClassCleanup(cls.fab.close)
        cls.etcd = EtcdCluster(cls.fab, ["a", "b", "c"], root + "/etcd").__enter__()
        cls.addClassCleanup(cls.etcd.close)

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="crun-etcd-")
        self.procs = []
        # The run's keys are /crun/rdzv/<run id>/: each test's own on the shared cluster.
        self.run_id = self._testMethodName[len("test_"):]
        self.prefix = f"/crun/rdzv/{self.run_id}/"

    def tearDown(self):
        kill_all(self.procs)
        # Every crun, worker and etcd member of the test is accounted for: all their command
        # lines name the test's directory.
        wait_for(lambda: not self.leftovers(), "the test's processes to be gone", limit=30)
        # Its members' data (a WAL of 64 MiB each, about 370 MiB a test): left behind, nine
        # tests a run filled this machine's disk.
        shutil.rmtree(self.dir, ignore_errors=True)

    def leftovers(self):
        return [f"{pid}: {cmdline[:200]}" for pid, cmdline in commands_mentioning(self.dir)]

    @contextlib.contextmanager
    def shared_cluster(self):
        """The class's fabric and etcd, for a test that leaves the members, and the hosts that
        other tests use, as it found them."""
        yield self.fab, self.etcd

    def crun(self, fab, host, nnodes, cmd, endpoints, conf=FAST, extra=(), run_id=None,
             nproc=2):
        args = [CRUN, "--nnodes", nnodes, "--nproc-per-node", str(nproc), "--rdzv-backend",
                "etcd-v3", "--rdzv-endpoint", endpoints, "--rdzv-id", run_id or self.run_id,
                *extra]
        if conf:
            args += ["--rdzv-conf", conf]
        env = dict(os.environ, NODE_TAG=host)
        p = fab.popen(host, [*args, PYTHON, *cmd], stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
        self.procs.append(p)
        return p

    def finish(self, p, limit=LIMIT_S):
        out, err = p.communicate(timeout=limit)
        return p.returncode, out, err

    def events(self):
        return probe_events(self.dir)

    def status(self, fab, etcd, host="a"):
        r = subprocess.run(fab.command(host, [CRUN, "status", "--rdzv-backend", "etcd-v3",
                                              "--rdzv-endpoint", etcd.endpoints(), "--rdzv-id",
                                              self.run_id, "--json"]),
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)[0]

    def lose_machine(self, nodes, host):
        """`host`'s crun and its workers SIGKILLed at once, as when the machine dies."""
        workers = [e["pid"] for e in self.events() if e["NODE_TAG"] == host]
        os.killpg(nodes[host].pid, signal.SIGKILL)
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def no_crun_left(self, fab):
        """Every crun and worker of the test is gone (etcd members are the cluster's)."""
        wait_for(lambda: not [p for p in self.procs if p.poll() is None], "every crun to exit")
        pids = [e["pid"] for e in self.events()]
        wait_for(lambda: not any(alive(p) for p in pids), "every worker to be gone")

    def test_two_hosts_form_fail_restart_and_finish_with_the_count_in_etcd(self):
        with self.shared_cluster() as (fab, etcd):
            probe = [PROBE, self.dir, "--connect-master", "--fail-rank", "1", "--fail-restart",
                     "0", "--code", "3", "--fail-when-all-started"]
            nodes = [self.crun(fab, h, "2", probe, etcd.endpoints(), extra=["--max-restarts",
                                                                             "2"])
                     for h in ("a", "b")]
            for p in nodes:
                code, _, err = self.finish(p)
                self.assertEqual(code, 0, err)
                # The job's goodput as the decider combined it (rendezvous/etcd/goodput.h):
                # the probe reports no progress, so the line says what it cannot know.
                self.assertIn("crun: goodput unknown: the workers report no progress", err)
                self.assertIn("(the job, 2 nodes)", err)
            ev = self.events()
            self.assertEqual(sorted(e["TORCHELASTIC_RESTART_COUNT"] for e in ev),
                             ["0"] * 4 + ["1"] * 4)
            # The store of each round is served by group rank 0's crun, at its own address,
            # and reached from both hosts.
            for restart in ("0", "1"):
                round_ev = [e for e in ev if e["TORCHELASTIC_RESTART_COUNT"] == restart]
                self.assertEqual(len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in round_ev}), 1)
                host0 = [e["NODE_TAG"] for e in round_ev if e["GROUP_RANK"] == "0"][0]
                self.assertEqual(round_ev[0]["MASTER_ADDR"], fab.addr(host0))
                self.assertEqual({e["connected_from"] for e in round_ev},
                                 {fab.addr("a"), fab.addr("b")})
            job = self.status(fab, etcd)
            self.assertEqual(job["phase"], "succeeded")
            self.assertEqual(job["restarts_used"], 1)
            self.assertIn("exit code 3", job["last_failure"])
            # Each node's ledger, and the job's combined from them: the failure one incident.
            self.assertEqual(job["goodput"]["incidents"], 1, job["goodput"])
            self.assertFalse(job["goodput"]["known"])
            # The job's keys, as an operator reads them with etcdctl.
            r = etcd.etcdctl("get", "--prefix", "--keys-only", self.prefix)
            keys = set(r.stdout.split())
            for key in ("state", "a/job", "layout", "rounds/00000001", "last_failure",
                        "a/goodput"):
                self.assertIn(self.prefix + key, keys)
            self.assertEqual(len([k for k in keys if k.startswith(self.prefix + "ledger/")]), 2,
                             keys)
            # Leases revoked: every agent's key, and the decider's, went with them.
            self.assertFalse([k for k in keys if "/nodes/" in k or k.endswith("/decider")], keys)
            self.no_crun_left(fab)

    def test_keys_stay_bounded_across_restarts_and_go_after_retention(self):
        restarts = 3 * 10 + 2  # three times the rounds kept (rendezvous/etcd/job.h)
        worker = ["-c", "import os, sys; sys.exit(0 if os.environ['TORCHELASTIC_RESTART_COUNT'] "
                        f"== '{restarts}' else 3)"]
        with self.shared_cluster() as (fab, etcd):
            p = self.crun(fab, "a", "1", worker, etcd.endpoints(), nproc=1,
                          conf=FAST + ",etcd_retention=3",
                          extra=["--max-restarts", str(restarts),
                                 "--max-restarts-without-progress", "0"])
            code, _, err = self.finish(p)
            self.assertEqual(code, 0, err)
            job = self.status(fab, etcd)
            self.assertEqual((job["phase"], job["restarts_used"]), ("succeeded", restarts))
            keys = etcd.etcdctl("get", "--prefix", "--keys-only", self.prefix).stdout.split()
            rounds = sorted(k for k in keys if "/rounds/" in k)
            self.assertEqual(rounds, [f"{self.prefix}rounds/{n:08d}"
                                      for n in range(restarts - 9, restarts + 1)])
            self.assertEqual([k for k in keys if "/a/stores/" in k], [])  # its host left
            self.assertLess(len(keys), 20, keys)
            # Every key of the run is bound to the retention lease: etcd deletes them with it.
            wait_for(lambda: etcd.etcdctl("get", "--prefix", "--keys-only",
                                          self.prefix).stdout.split() == [],
                     "the job's keys to go after etcd_retention", limit=30, every=0.2)
            self.no_crun_left(fab)

    def test_scale_up_from_two_to_three_hosts_of_at_most_four(self):
        with self.shared_cluster() as (fab, etcd):
            probe = [PROBE, self.dir, "--exit-when-world", "6"]
            a = self.crun(fab, "a", "2:4", probe, etcd.endpoints())
            b = self.crun(fab, "b", "2:4", probe, etcd.endpoints())
            wait_for(lambda: sum(e["WORLD_SIZE"] == "4" for e in self.events()) == 4,
                     "a round of two hosts")
            c = self.crun(fab, "c", "2:4", probe, etcd.endpoints())
            for p in (a, b, c):
                code, _, err = self.finish(p)
                self.assertEqual(code, 0, err)
            six = [e for e in self.events() if e["WORLD_SIZE"] == "6"]
            self.assertEqual(sorted(int(e["RANK"]) for e in six), list(range(6)))
            # A membership change spends no restart.
            self.assertEqual({e["TORCHELASTIC_RESTART_COUNT"] for e in self.events()}, {"0"})
            self.no_crun_left(fab)

    def test_etcd_members_lost_one_has_no_effect_two_make_agents_wait(self):
        with Fabric(["a", "b", "c"]) as fab, \
                EtcdCluster(fab, ["a", "b", "c"], self.dir + "/etcd") as etcd:
            probe = [PROBE, self.dir, "--until", "go"]
            conf = FAST + ",reconnect_timeout=60"
            nodes = [self.crun(fab, h, "2", probe, etcd.endpoints(), conf=conf)
                     for h in ("a", "b")]
            wait_for(lambda: len(self.events()) == 4, "the first round's workers")
            first = {e["pid"] for e in self.events()}
            etcd.kill("c")  # one of three: quorum stays
            etcd.kill("b")  # two of three: no quorum; leases cannot expire, nothing decides
            lost_at = time.monotonic()
            # Longer than the lease's TTL: without quorum nobody is declared lost.
            wait_for(lambda: time.monotonic() - lost_at > 4, "the outage to last 4 s", limit=10)
            self.assertTrue(all(p.poll() is None for p in nodes))
            etcd.start("b")
            etcd.start("c")
            etcd.wait_healthy(["a", "b", "c"])
            open(os.path.join(self.dir, "go"), "w").close()
            for p in nodes:
                code, _, err = self.finish(p)
                self.assertEqual(code, 0, err)
            # The same workers ran to the end: no restart, no new round.
            self.assertEqual({e["pid"] for e in self.events()}, first)
            self.assertEqual(self.status(fab, etcd)["round"], 0)
            self.no_crun_left(fab)

    def test_quorum_lost_longer_than_reconnect_timeout_ends_the_job_naming_etcd(self):
        with Fabric(["a", "b", "c"]) as fab, \
                EtcdCluster(fab, ["a", "b", "c"], self.dir + "/etcd") as etcd:
            probe = [PROBE, self.dir, "--until", "never"]
            conf = FAST + ",reconnect_timeout=3"
            nodes = [self.crun(fab, h, "2", probe, etcd.endpoints(), conf=conf)
                     for h in ("a", "b")]
            wait_for(lambda: len(self.events()) == 4, "the first round's workers")
            etcd.kill("b")
            etcd.kill("c")
            for p in nodes:
                code, _, err = self.finish(p)
                self.assertNotEqual(code, 0)
                self.assertRegex(err, r"lost (the watch on )?etcd at .*no member answered for "
                                      r"3000 ms")
            self.no_crun_left(fab)

    def test_the_store_hosts_machine_lost_the_others_re_form_with_a_new_store_host(self):
        with Fabric(["a", "b", "c"]) as fab, \
                EtcdCluster(fab, ["a", "b", "c"], self.dir + "/etcd") as etcd:
            probe = [PROBE, self.dir, "--connect-master", "--exit-when-world", "4"]
            nodes = {h: self.crun(fab, h, "2:3", probe, etcd.endpoints(),
                                  extra=["--max-restarts", "1"])
                     for h in ("a", "b", "c")}
            wait_for(lambda: sum(e["WORLD_SIZE"] == "6" for e in self.events()) == 6,
                     "a round of three hosts")
            host0 = [e["NODE_TAG"] for e in self.events() if e["GROUP_RANK"] == "0"][0]
            first_store = self.events()[0]["MASTER_ADDR"]
            self.assertEqual(first_store, fab.addr(host0))
            # The machine is gone: its crun, its workers and its etcd member.
            self.lose_machine(nodes, host0)
            etcd.kill(host0)
            survivors = [h for h in ("a", "b", "c") if h != host0]
            for h in survivors:
                code, _, err = self.finish(nodes[h])
                self.assertEqual(code, 0, err)
                self.assertRegex(err, r"its etcd lease ended")
            four = [e for e in self.events() if e["WORLD_SIZE"] == "4"]
            self.assertEqual(len(four), 4)
            new_store = {e["MASTER_ADDR"] for e in four}
            self.assertEqual(len(new_store), 1)
            self.assertNotEqual(new_store.pop(), fab.addr(host0))
            self.assertEqual({e["connected_from"] for e in four},
                             {fab.addr(h) for h in survivors})
            # A machine's loss is a membership change: the restart count goes on unspent.
            self.assertEqual({e["TORCHELASTIC_RESTART_COUNT"] for e in self.events()}, {"0"})
            job = self.status(fab, etcd, host=survivors[0])
            self.assertEqual(job["phase"], "succeeded")
            self.assertEqual(job["round"], 1)
            self.no_crun_left(fab)

    def test_the_deciders_machine_lost_another_agent_decides(self):
        with self.shared_cluster() as (fab, etcd):
            probe = [PROBE, self.dir, "--until", "go"]
            nodes = {h: self.crun(fab, h, "2:3", probe, etcd.endpoints(),
                                  conf=FAST + f",node_id={h}", extra=["--max-restarts", "1"])
                     for h in ("a", "b", "c")}
            wait_for(lambda: sum(e["WORLD_SIZE"] == "6" for e in self.events()) == 6,
                     "a round of three hosts")

            def decider():
                r = etcd.etcdctl("get", "--print-value-only", self.prefix + "a/decider")
                return r.stdout.strip()
            first = decider()
            self.assertIn(first, nodes)
            self.lose_machine(nodes, first)
            # Its lease runs out, a/decider goes with it, a survivor takes its place and
            # re-forms the job without it.
            wait_for(lambda: sum(e["WORLD_SIZE"] == "4" for e in self.events()) == 4,
                     "the survivors to re-form", limit=30)
            survivors = [h for h in nodes if h != first]
            wait_for(lambda: decider() in survivors, "a survivor to decide", every=0.2)
            open(os.path.join(self.dir, "go"), "w").close()
            for h in survivors:
                code, _, err = self.finish(nodes[h])
                self.assertEqual(code, 0, f"{h}: {err}")
                self.assertRegex(err, rf"node \S+ \({first}\) was lost: its etcd lease ended")
            self.assertEqual({e["TORCHELASTIC_RESTART_COUNT"] for e in self.events()}, {"0"})
            job = self.status(fab, etcd, host=survivors[0])
            self.assertEqual(job["phase"], "succeeded")
            self.assertEqual(job["round"], 1)
            self.no_crun_left(fab)

    def test_a_partitioned_agent_is_replaced_and_rejoins_as_a_new_member(self):
        with self.shared_cluster() as (fab, etcd):
            probe = [PROBE, self.dir, "--until", "go"]
            conf = FAST + ",reconnect_timeout=60"
            nodes = {h: self.crun(fab, h, "2:3", probe, etcd.endpoints(), conf=conf)
                     for h in ("a", "b", "d")}
            wait_for(lambda: sum(e["WORLD_SIZE"] == "6" for e in self.events()) == 6,
                     "a round of three hosts")
            d_first = [e["pid"] for e in self.events() if e["NODE_TAG"] == "d"]
            fab.link_down("d")  # d (no etcd member) is cut off: its lease runs out
            wait_for(lambda: sum(e["WORLD_SIZE"] == "4" for e in self.events()) == 4,
                     "the others to re-form without d", limit=30)
            fab.link_up("d")
            # d finds its lease gone, stops its workers and joins again: a scale-up round.
            wait_for(lambda: sum(e["WORLD_SIZE"] == "6" for e in self.events()) == 12,
                     "d back in a round of three", limit=60)
            wait_for(lambda: not any(alive(p) for p in d_first), "d's first workers to stop")
            open(os.path.join(self.dir, "go"), "w").close()
            for h, p in nodes.items():
                code, _, err = self.finish(p)
                self.assertEqual(code, 0, f"{h}: {err}")
            self.assertEqual({e["TORCHELASTIC_RESTART_COUNT"] for e in self.events()}, {"0"})
            self.no_crun_left(fab)

    def test_tls_and_etcd_users(self):
        with Fabric(["a", "b", "c"]) as fab:
            san = ",".join(f"IP:{fab.addr(h)}" for h in ("a", "b", "c"))
            certs = make_certificates(os.path.join(self.dir, "pki"), san=san)
            tls = {"ca": certs["ca.pem"], "cert": certs["service.pem"],
                   "key": certs["service.key"], "client_cert": certs["client.pem"],
                   "client_key": certs["client.key"]}
            with EtcdCluster(fab, ["a", "b", "c"], self.dir + "/etcd", tls=tls) as etcd:
                for cmd in (["user", "add", "root:s3cret"], ["auth", "enable"]):
                    r = etcd.etcdctl(*cmd)
                    self.assertEqual(r.returncode, 0, r.stderr)
                good = os.path.join(self.dir, "password")
                bad = os.path.join(self.dir, "wrong")
                for path, text in ((good, "s3cret\n"), (bad, "guess\n")):
                    with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                        f.write(text)
                client = ["--tls-ca", certs["ca.pem"], "--tls-cert", certs["client.pem"],
                          "--tls-key", certs["client.key"]]
                auth = f",etcd_user=root,etcd_password_file={good}"
                probe = [PROBE, self.dir, "--connect-master"]
                nodes = [self.crun(fab, h, "2", probe, etcd.endpoints(), conf=FAST + auth,
                                   extra=client) for h in ("a", "b")]
                for p in nodes:
                    code, _, err = self.finish(p)
                    self.assertEqual(code, 0, err)
                self.assertEqual(len(self.events()), 4)
                # Status through TLS and auth: the same JSON as against the daemon.
                r = subprocess.run(fab.command("c", [
                    CRUN, "status", "--rdzv-backend", "etcd-v3", "--rdzv-endpoint",
                    etcd.endpoints(), "--rdzv-id", self.run_id, "--etcd-user", "root",
                    "--etcd-password-file", good, *client]), capture_output=True, text=True,
                    timeout=60)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertRegex(r.stdout, rf"job {self.run_id}: succeeded, round 0, nodes 2:2, "
                                           r"world size 4, restarts 0 of 0")
                # A wrong password, no password, and plaintext against TLS: refused, named,
                # nothing started.
                cases = [
                    (client, FAST + f",etcd_user=root,etcd_password_file={bad}",
                     "refused a transaction on /crun/rdzv/refused/"),
                    (client, FAST, "no etcd user given"),
                    ([], FAST + auth, "if etcd uses TLS, give --tls-ca"),
                ]
                for extra, conf, needle in cases:
                    p = self.crun(fab, "a", "1", probe, etcd.endpoints(), conf=conf +
                                  ",connect_timeout=3", extra=extra, run_id="refused")
                    code, _, err = self.finish(p)
                    self.assertNotEqual(code, 0)
                    self.assertIn(needle, err)
                    self.assertIn("nothing was started", err)
                self.assertEqual(len(self.events()), 4)
            self.no_crun_left(fab)

    def test_bad_endpoints_and_layouts_are_refused_with_nothing_started(self):
        with self.shared_cluster() as (fab, etcd):
            probe = [PROBE, self.dir]
            # Nobody there.
            dead = f"{fab.addr('e')}:2379"
            p = self.crun(fab, "a", "1", probe, dead, conf="connect_timeout=2")
            code, _, err = self.finish(p)
            self.assertNotEqual(code, 0)
            self.assertIn(f"cannot use etcd at {dead}", err)
            self.assertIn("nothing was started", err)
            # Keys of another layout under the run's prefix.
            etcd.etcdctl("put", self.prefix + "layout", "crun-etcd-rendezvous/0")
            p = self.crun(fab, "a", "1", probe, etcd.endpoints())
            code, _, err = self.finish(p)
            self.assertNotEqual(code, 0)
            self.assertIn("'crun-etcd-rendezvous/0', this crun reads 'crun-etcd-rendezvous/3'",
                          err)
            # etcd's v2 backend is named and refused before anything starts.
            r = subprocess.run([CRUN, "--rdzv-backend", "etcd-v2", "--rdzv-endpoint",
                                etcd.endpoints(), "--nnodes", "1", PYTHON, PROBE, self.dir],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 2)
            self.assertIn("etcd-v3", r.stderr)
            self.assertEqual(self.events(), [])
            self.no_crun_left(fab)


if __name__ == "__main__":
    lanes.main(3)
