"""crun across "hosts" that are network namespaces, each with its own address on a bridged
10.77.0.0/24 (tests/pylib/fabric.py): MASTER_ADDR is an address the other hosts reach, a host
whose cable is pulled is found out by its missing heartbeats and the others go on without it,
and a stock PyTorch DDP job (gloo) trains across two hosts. Needs root, as CI runs it. The DDP
job (both cores) runs first, alone; then the other tests three at a time (tests/pylib/lanes.py),
each on hosts of its own: they mostly wait out heartbeat timeouts (beats every 0.25 s, a host
lost after 1.5 s without one)."""
import os
import re
import signal
import subprocess
import sys
import time
import unittest

CRUN = os.environ["CRUN_BIN"]
HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "..", "workers", "node_probe.py")
DDP = os.path.join(HERE, "..", "workers", "ddp_train.py")
# Interpreters whose torch runs the DDP job (Debian's 1.13, PyPI's 2.x), comma-separated.
TORCH_PYTHONS = [p for p in os.environ.get("TORCH_PYTHONS", "/usr/bin/python3").split(",") if p]
PORT = 29400
LIMIT_S = 120

sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from crun_testing import (alive, ddp_digests, kill_all, probe_events, scratch_dir, wait_for,  # noqa: E402
                          whole_lines)
from fabric import Fabric  # noqa: E402
import lanes  # noqa: E402


class AcrossNamespaces(unittest.TestCase):
    def setUp(self):
        self.dir = scratch_dir(self, "crun-netns-")
        self.procs = []

    def tearDown(self):
        kill_all(self.procs)

    def node(self, fab, host, nnodes, cmd, conf="", nproc=2, env=None, opts=()):
        """crun on `host`, joining the service that host "a" runs (its address is the
        endpoint, so a's crun hosts it). Node ids are left to crun's default."""
        endpoint = f"{fab.addr('a')}:{PORT}"
        args = [CRUN, "--nnodes", nnodes, "--nproc-per-node", str(nproc), "--rdzv-endpoint",
                endpoint, "--rdzv-id", "job", *opts]
        if conf:
            args += ["--rdzv-conf", conf]
        env = dict(os.environ, NODE_TAG=host, **(env or {}))
        p = fab.popen(host, [*args, *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                      text=True, env=env)
        self.procs.append(p)
        return p

    def finish(self, p):
        out, err = p.communicate(timeout=LIMIT_S)
        return p.returncode, out, err

    def events(self):
        return probe_events(self.dir)

    def test_master_addr_is_the_hosts_address_and_reachable_from_the_others(self):
        with Fabric(["a", "b"]) as fab:
            probe = [PROBE, self.dir, "--connect-master"]
            a = self.node(fab, "a", "2", probe)
            b = self.node(fab, "b", "2", probe)
            for p in (a, b):
                code, _, err = self.finish(p)
                self.assertEqual(code, 0, err)
            ev = self.events()
            self.assertEqual(sorted(int(e["RANK"]) for e in ev), [0, 1, 2, 3])
            for e in ev:
                self.assertEqual(e["MASTER_ADDR"], fab.addr("a"), e)
                # Each worker opened a TCP connection to MASTER_ADDR:MASTER_PORT from its own
                # host's address: b's workers crossed the bridge.
                self.assertEqual(e["connected_from"], fab.addr(e["NODE_TAG"]), e)

    def test_a_host_outside_the_job_is_refused_by_the_rounds_store(self):
        with Fabric(["a", "b", "x"]) as fab:
            probe = [PROBE, self.dir, "--connect-master", "--until", "go"]
            a = self.node(fab, "a", "2", probe)
            b = self.node(fab, "b", "2", probe)
            wait_for(lambda: len(self.events()) == 4, "the job's four workers connected")
            e = self.events()[0]
            # Host x is on the same network but not in the job: the store closes it unanswered.
            knock = ("import socket, struct, sys\n"
                     "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)\n"
                     "s.sendall(b'\\x00' + struct.pack('<I', 0x3C85F7CE))\n"
                     "try:\n"
                     "    print('answered' if s.recv(1) else 'closed')\n"
                     "except ConnectionResetError:\n"
                     "    print('closed')\n")
            r = subprocess.run(fab.command("x", [sys.executable, "-c", knock, e["MASTER_ADDR"],
                                                 e["MASTER_PORT"]]),
                               capture_output=True, text=True, timeout=LIMIT_S)
            self.assertEqual(r.stdout.strip(), "closed", r.stderr)
            open(os.path.join(self.dir, "go"), "w").close()
            errs = {}
            for host, p in (("a", a), ("b", b)):
                code, _, errs[host] = self.finish(p)
                self.assertEqual(code, 0, errs[host])
            # a's crun hosts the service and its stores: it logs the refusal.
            self.assertIn(f"refused connection #1 from {fab.addr('x')}: not an address of this "
                          "job's nodes", errs["a"])
            # The job's own workers reached it from both hosts.
            self.assertEqual({ev["connected_from"] for ev in self.events()},
                             {fab.addr("a"), fab.addr("b")})

    HEARTBEAT_TIMEOUT_S = 1.5

    def lose_c(self, fab, lose, what):
        """Hosts a, b and c in one round (heartbeats every 0.25 s, lost after 1.5 s); then
        `lose(nodes)` silences c. a and b must find c lost by its missing heartbeats, which
        were datagrams, and re-form without it. Returns the nodes."""
        conf = (f"heartbeat_timeout={self.HEARTBEAT_TIMEOUT_S},heartbeat_interval=0.25,"
                "last_call_timeout=0.1")
        probe = [PROBE, self.dir, "--exit-when-world", "4"]
        nodes = {h: self.node(fab, h, "2:3", probe, conf=conf, opts=("--log-level", "info"))
                 for h in ("a", "b", "c")}
        wait_for(lambda: sum(e["WORLD_SIZE"] == "6" for e in self.events()) == 6,
                 "a round of three hosts")
        t0 = time.time()
        lose(nodes)
        for h in ("a", "b"):
            code, _, err = self.finish(nodes[h])
            self.assertEqual(code, 0, err)
            self.assertRegex(err, r"re-forming the job: node \S+ \(\S+@10\.77\.0\.3#\d+\) was "
                                  r"lost: no heartbeat for \d+ ms \(heartbeat_timeout 1500")
            self.assertIn(f"heartbeats over udp {fab.addr('a')}:{PORT}", err)
        detected = min(e["t"] for e in self.events() if e["WORLD_SIZE"] == "4") - t0
        print(f"{what} -> survivors' new workers running: {detected * 1000:.0f} ms "
              f"(heartbeat_timeout {self.HEARTBEAT_TIMEOUT_S * 1000:.0f} ms)")
        # Silence is all the service sees (no reset, no FIN), so only the heartbeat deadline
        # can find it; TCP alone would take minutes. Bounded loosely: CI is shared.
        self.assertLess(detected, self.HEARTBEAT_TIMEOUT_S + 3.0)
        self.assertEqual({e["TORCHELASTIC_RESTART_COUNT"] for e in self.events()}, {"0"})
        return nodes

    def test_a_host_whose_link_goes_down_is_lost_by_heartbeat_and_the_rest_re_form(self):
        with Fabric(["a", "b", "c"]) as fab:
            nodes = self.lose_c(fab, lambda nodes: fab.link_down("c"), "link down")
            c_workers = [e["pid"] for e in self.events() if e["NODE_TAG"] == "c"]
            # c cannot reach the service either: it stops its workers and says so.
            code, _, err = self.finish(nodes["c"])
            self.assertNotEqual(code, 0)
            self.assertIn(f"lost the rendezvous service at {fab.addr('a')}:{PORT}", err)
            wait_for(lambda: not any(alive(p) for p in c_workers), "c's workers to be gone")

    def test_a_host_whose_agent_is_stopped_is_lost_by_heartbeat(self):
        """SIGSTOP: c's crun and workers stop, their sockets stay open (the kernel still
        answers TCP), so no transport sees anything: only the missing heartbeat datagrams."""
        stopped = []

        def stop(nodes):
            stopped.extend([nodes["c"].pid] + [e["pid"] for e in self.events()
                                               if e["NODE_TAG"] == "c"])
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)

        with Fabric(["a", "b", "c"]) as fab:
            try:
                nodes = self.lose_c(fab, stop, "agent stopped")
            finally:
                for pid in stopped:
                    os.kill(pid, signal.SIGKILL)
                    os.kill(pid, signal.SIGCONT)
            nodes["c"].communicate(timeout=LIMIT_S)
            wait_for(lambda: not any(alive(p) for p in stopped[1:]), "c's workers to be gone")

    def test_a_path_that_drops_udp_sends_the_beats_to_the_stream_and_back(self):
        """a's host starts dropping UDP from the wire (a firewall, silently: no ICMP): b's beats
        go unacked, so b beats on its stream too and stays in the job for four
        heartbeat_timeouts; once UDP passes again, the acks come back and b's stream falls
        silent. The round never re-forms."""
        conf = (f"heartbeat_timeout={self.HEARTBEAT_TIMEOUT_S},heartbeat_interval=0.25,"
                "last_call_timeout=0.1")
        probe = [PROBE, self.dir, "--until", "done"]
        logs = {h: os.path.join(self.dir, f"{h}.log") for h in ("a", "b")}

        def log_has(host, text):
            return any(text in line for line in whole_lines(logs[host]))

        def log_text(host):
            with open(logs[host]) as f:
                return f.read()

        with Fabric(["a", "b"]) as fab:
            endpoint = f"{fab.addr('a')}:{PORT}"
            nodes = {}
            for h in ("a", "b"):
                with open(logs[h], "w") as log:
                    nodes[h] = fab.popen(h, [CRUN, "--nnodes", "2", "--nproc-per-node", "2",
                                             "--rdzv-endpoint", endpoint, "--rdzv-id", "job",
                                             "--rdzv-conf", conf, "--log-level", "info",
                                             *probe],
                                         stdout=subprocess.DEVNULL, stderr=log,
                                         env=dict(os.environ, NODE_TAG=h))
                self.procs.append(nodes[h])
            wait_for(lambda: len(self.events()) == 4, "a round of two hosts")
            wait_for(lambda: log_has("b", "the service hears them"), "b's first ack")
            drop = ["nft", "-f", "-"]
            rules = ("table inet crun_test {\n chain in {\n"
                     "  type filter hook input priority 0;\n"
                     '  iifname "eth0" meta l4proto udp drop\n }\n}\n')
            subprocess.run(fab.command("a", drop), input=rules, text=True, check=True)
            wait_for(lambda: log_has("b", "has not answered lately"), "b's beats to the stream")
            # The duration checked, not synchronisation: without its stream beats, b would be
            # lost after one heartbeat_timeout.
            time.sleep(4 * self.HEARTBEAT_TIMEOUT_S)
            self.assertEqual(len(self.events()), 4)
            subprocess.run(fab.command("a", ["nft", "delete", "table", "inet", "crun_test"]),
                           check=True)
            wait_for(lambda: log_has("b", "the service answers again"), "b's acks again")
            open(os.path.join(self.dir, "done"), "w").close()
            for h in ("a", "b"):
                self.assertEqual(nodes[h].wait(timeout=LIMIT_S), 0, log_text(h))
        self.assertEqual(len(self.events()), 4)
        self.assertEqual({e["TORCHELASTIC_RESTART_COUNT"] for e in self.events()}, {"0"})
        self.assertNotIn("was lost", log_text("a"))

    @lanes.alone  # four workers import torch at once: beside them, beats could be late
    def test_stock_pytorch_ddp_across_two_hosts(self):
        for python in TORCH_PYTHONS:
            with self.subTest(python=python), Fabric(["a", "b"]) as fab:
                out = scratch_dir(self, "crun-netns-ddp-")
                # gloo binds to the interface named here, as users set it on real clusters.
                env = {"PYTHON_EXEC": python, "GLOO_SOCKET_IFNAME": "eth0"}
                a = self.node(fab, "a", "2", [DDP, out], env=env)
                b = self.node(fab, "b", "2", [DDP, out], env=env)
                results = [self.finish(p) for p in (a, b)]
                for code, stdout, err in results:
                    self.assertEqual(code, 0, stdout + err)
                self.assertIn("epoch 4", results[0][1])
                # Every rank ends with the same parameters (their digests, printed by each).
                digests = ddp_digests("".join(o for _, o, _ in results), 4)
                self.assertEqual(len(set(digests.values())), 1, digests)
                losses = [float(x)
                          for x in re.findall(r"epoch \d: loss ([0-9.]+)", results[0][1])]
                self.assertLess(losses[-1], losses[0] / 2, results[0][1])  # it learned


if __name__ == "__main__":
    lanes.main(3)
