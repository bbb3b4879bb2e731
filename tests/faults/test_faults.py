"""Fault injection over "hosts" that are network namespaces (tests/pylib/fabric.py): two hosts,
a and b, two workers each, a's crun hosting the rendezvous service (or a `crun rendezvous`
daemon on a). Each scenario injects one fault into a running job and checks what the user
sees: every crun's exit code, the failure report, the restart count, and that no process of
the job is left anywhere. Recovery times are measured (fault injected -> the job's new workers
running, or -> the last crun exited) and printed as a table; with CRUN_FAULTS_DOC=FILE the
table replaces the one between the markers in FILE (docs/reliability.md). The scenarios run
four at a time (tests/pylib/lanes.py), each on hosts of its own: they mostly wait out the
faults they inject. The two that start a hundred agents at once run first, alone, so that
their load neither delays the others' heartbeats nor lands in the others' figures. Needs
root."""
import json
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
BEHAVE = os.path.join(HERE, "..", "workers", "behave.py")
DAEMONIZE = os.path.join(HERE, "..", "workers", "daemonize.py")
PORT = 29400
LIMIT_S = 120
# Short, so that the scenarios run quickly; the defaults are 3 s and 1 s.
FAST = "heartbeat_timeout=1.5,heartbeat_interval=0.25,last_call_timeout=0.1"

sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from bench_support import measured_at  # noqa: E402
from crun_testing import (alive, commands_mentioning, kill_all, probe_events,  # noqa: E402
                          proc_state, scratch_dir, wait_for, whole_lines)

MEASURED_AT = measured_at()  # before the run: the tree may change while it runs
from fabric import Fabric  # noqa: E402
import lanes  # noqa: E402

RESULTS = []  # ((where in this file, order), scenario, what the user sees, measured)


def ms(seconds):
    return f"{seconds * 1000:.0f} ms"


class Faults(unittest.TestCase):
    def setUp(self):
        self.dir = scratch_dir(self, "crun-faults-")
        self.procs = []

    def tearDown(self):
        kill_all(self.procs)

    def assertNothingLeft(self):
        wait_for(lambda: not commands_mentioning(self.dir), "every process of the job to be gone",
                 limit=30)

    def node(self, fab, host, *crun_args, nnodes="2", conf=FAST, probe=("--until", "go"),
             endpoint_host="a", is_host=None, run_id="job", nproc=2, tag=None):
        conf = ",".join(c for c in (conf, None if is_host is None else f"is_host={int(is_host)}")
                        if c)
        args = [CRUN, "--nnodes", nnodes, "--nproc-per-node", str(nproc), "--rdzv-endpoint",
                f"{fab.addr(endpoint_host)}:{PORT}", "--rdzv-id", run_id,
                *(("--rdzv-conf", conf) if conf else ()), *crun_args, PROBE, self.dir, *probe]
        p = fab.popen(host, args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                      env=dict(os.environ, NODE_TAG=tag or host))
        self.procs.append(p)
        return p

    def finish(self, p):
        _, err = p.communicate(timeout=LIMIT_S)
        return p.returncode, err

    def go_and_succeed(self, *procs):
        """Lets the workers finish; every crun in `procs` must exit 0. Returns their stderr."""
        self.go()
        done = [self.finish(p) for p in procs]
        self.assertEqual([c for c, _ in done], [0] * len(procs), "".join(e for _, e in done))
        return [e for _, e in done]

    def stop_daemon(self, d):
        d.send_signal(signal.SIGTERM)
        d.communicate(timeout=LIMIT_S)

    def events(self, **match):
        return [e for e in probe_events(self.dir)
                if all(str(e.get(k)) == str(v) for k, v in match.items())]

    def running(self, n, **match):
        wait_for(lambda: len(self.events(**match)) >= n, f"{n} workers running {match}")

    def go(self):
        open(os.path.join(self.dir, "go"), "w").close()

    def worker_pid(self, host, restart=0):
        return next(e["pid"] for e in self.events(NODE_TAG=host,
                                                  TORCHELASTIC_RESTART_COUNT=restart))

    def record(self, scenario, outcome, measured):
        # Rows in the order the scenarios are written here (workers, agents and the network,
        # the daemon, descendants), not unittest's alphabetical running order.
        line = getattr(type(self), self._testMethodName).__code__.co_firstlineno
        RESULTS.append(((line, len(RESULTS)), scenario, outcome, measured))
        print(f"\n  {scenario}: {outcome}; {measured}")

    # ---- workers --------------------------------------------------------------------------

    def restart_after_worker_signal(self, sig):
        with Fabric(["a", "b"]) as fab:
            a = self.node(fab, "a", "--max-restarts", "1")
            b = self.node(fab, "b", "--max-restarts", "1")
            self.running(4, TORCHELASTIC_RESTART_COUNT=0)
            victim = self.worker_pid("b")
            t0 = time.time()
            os.kill(victim, sig)
            self.running(4, TORCHELASTIC_RESTART_COUNT=1)
            recovered = min(e["t"] for e in self.events(TORCHELASTIC_RESTART_COUNT=1)) - t0
            self.go()
            (ca, ea), (cb, eb) = self.finish(a), self.finish(b)
            self.assertEqual((ca, cb), (0, 0), ea + eb)
            name = signal.Signals(sig).name
            self.assertRegex(eb, rf"rank [23] \(local rank [01], pid {victim}\) on \S+ failed "
                                 rf"with signal {int(sig)} \({name}\)")
            self.assertIn("restarting the worker group (restart 1 of at most 1)", ea)
            self.assertEqual({e["TORCHELASTIC_RESTART_COUNT"] for e in self.events()},
                             {"0", "1"})
        self.assertNothingLeft()
        return recovered

    def test_worker_sigkill_restarts_every_node(self):
        t = self.restart_after_worker_signal(signal.SIGKILL)
        self.record("worker SIGKILL (`--max-restarts 1`)",
                    "both nodes restart (restart count 1 everywhere), job exits 0; b reports "
                    "the rank, pid and `signal 9 (SIGKILL)`", f"new workers running after {ms(t)}")

    def test_worker_sigsegv_without_restarts_fails_everywhere_with_one_report(self):
        with Fabric(["a", "b"]) as fab:
            a, b = self.node(fab, "a"), self.node(fab, "b")
            self.running(4)
            victim = self.worker_pid("b")
            t0 = time.time()
            os.kill(victim, signal.SIGSEGV)
            (ca, ea), (cb, eb) = self.finish(a), self.finish(b)
            done = time.time() - t0
            self.assertEqual((ca, cb), (139, 139), ea + eb)
            for err in (ea, eb):
                self.assertIn("exit      : signal 11 (SIGSEGV)", err)
                self.assertIn(f"pid       : {victim}", err)
            self.assertIn("the job failed on node", ea)
        self.assertNothingLeft()
        self.record("worker SIGSEGV (no restarts)",
                    "every crun exits 139 with the same root cause (rank, host, pid, "
                    "`signal 11 (SIGSEGV)`)", f"all crun exited {ms(done)} after the fault")

    def test_worker_exit_1_fails_everywhere_with_its_stderr(self):
        with Fabric(["a", "b"]) as fab:
            probe = ("--fail-rank", "3", "--code", "1", "--fail-when-all-started")
            a, b = self.node(fab, "a", probe=probe), self.node(fab, "b", probe=probe)
            (ca, ea), (cb, eb) = self.finish(a), self.finish(b)
            done = time.time()
            self.assertEqual((ca, cb), (1, 1), ea + eb)
            for err in (ea, eb):
                self.assertIn("rank      : 3 (local rank 1", err)
                self.assertIn("node_probe: rank 3 fails on purpose with 1", err)
            started = max(e["t"] for e in self.events())
        self.assertNothingLeft()
        self.record("worker `exit(1)`", "every crun exits 1; the report carries the rank's last "
                    "stderr lines", f"all crun exited {ms(done - started)} after the last worker "
                    "started (the failing one exits at once)")

    def test_worker_sigstop_then_sigterm_is_continued_and_stopped_within_the_grace(self):
        # Without --hang-timeout a stopped worker is a hang crun does not detect (see
        # docs/reliability.md); what it must do is stop it cleanly when told to.
        with Fabric(["a", "b"]) as fab:
            a = self.node(fab, "a", "--shutdown-timeout", "30", nnodes="1:2")
            b = self.node(fab, "b", "--shutdown-timeout", "30", nnodes="1:2")
            self.running(4)
            victim = self.worker_pid("b")
            os.kill(victim, signal.SIGSTOP)
            wait_for(lambda: proc_state(victim) == "T", "the worker to be stopped")
            t0 = time.time()
            b.send_signal(signal.SIGTERM)
            cb, eb = self.finish(b)
            done = time.time() - t0
            self.assertEqual(cb, 128 + signal.SIGTERM, eb)
            self.assertIn(f"(pid {victim}) was stopped (SIGSTOP or a debugger): sending SIGCONT", eb)
            self.assertNotIn("SIGKILL", eb)  # it acted on SIGTERM: no need to wait 30 s
            self.go()  # b left: a goes on alone, and its workers finish
            ca, ea = self.finish(a)
            self.assertEqual(ca, 0, ea)
        self.assertNothingLeft()
        self.record("worker SIGSTOP (hang) without `--hang-timeout`, then SIGTERM to its crun",
                    "not detected as a failure (no timeout given); on SIGTERM crun sees the stopped "
                    "worker, sends SIGCONT so it can act on the signal, exits 143",
                    f"crun exited {ms(done)} after SIGTERM (grace 30 s unused)")

    def test_worker_sigstop_with_hang_timeout_is_a_hang_and_restarts_every_node(self):
        with Fabric(["a", "b"]) as fab:
            args = ("--hang-timeout", "2", "--max-restarts", "1")
            a, b = self.node(fab, "a", *args), self.node(fab, "b", *args)
            self.running(4, TORCHELASTIC_RESTART_COUNT=0)
            victim = self.worker_pid("b")
            t0 = time.time()
            os.kill(victim, signal.SIGSTOP)
            self.running(4, TORCHELASTIC_RESTART_COUNT=1)
            recovered = min(e["t"] for e in self.events(TORCHELASTIC_RESTART_COUNT=1)) - t0
            self.go()
            (ca, ea), (cb, eb) = self.finish(a), self.finish(b)
            self.assertEqual((ca, cb), (0, 0), ea + eb)
            self.assertRegex(eb, rf"rank [23] on \S+ \(local rank [01], pid {victim}\): no "
                                 r"progress for 2\.\d s; it was stopped \(T: SIGSTOP or "
                                 r"SIGTSTP\)\n")
            # b's report holds every rank's stacks, a's two read through the service.
            self.assertIn("stacks of 4 ranks read in", eb)
            self.assertIn("reading this node's stacks for another node", ea)
            self.assertRegex(ea, r"restarting the worker group \(restart 1 of at most 1\): "
                                 r"rank [23] \(local rank [01]\) on \S+ failed with a hang")
        self.assertNothingLeft()
        self.record("worker SIGSTOP with `--hang-timeout 2 --max-restarts 1`",
                    "b declares the rank hung (state T), reads the stacks of all 4 ranks (a's "
                    "through the rendezvous service) before stopping anything, prints the Hang "
                    "report; both nodes restart; exit 0",
                    f"new workers running {ms(recovered)} after the SIGSTOP (timeout 2 s, "
                    "counted from the worker's last heartbeat, before the stop)")

    # ---- agents, the service, the network --------------------------------------------------

    def test_agent_sigkill_survivor_re_forms(self):
        with Fabric(["a", "b"]) as fab:
            probe = ("--exit-when-world", "2")
            a = self.node(fab, "a", nnodes="1:2", probe=probe)
            b = self.node(fab, "b", nnodes="1:2", probe=probe)
            self.running(4, WORLD_SIZE=4)
            b_workers = [e["pid"] for e in self.events(NODE_TAG="b")]
            t0 = time.time()
            b.kill()
            b.communicate()
            self.running(2, WORLD_SIZE=2)
            recovered = min(e["t"] for e in self.events(WORLD_SIZE=2)) - t0
            ca, ea = self.finish(a)
            self.assertEqual(ca, 0, ea)
            self.assertIn("re-forming the job: node", ea)
            self.assertEqual({e["TORCHELASTIC_RESTART_COUNT"] for e in self.events()}, {"0"})
            wait_for(lambda: not any(alive(p) for p in b_workers), "b's workers to be gone")
        self.assertNothingLeft()
        self.record("agent (b's crun) SIGKILL", "its workers die with it (guard process); a "
                    "re-forms alone without spending a restart and exits 0",
                    f"a's new workers running after {ms(recovered)}")

    def test_rendezvous_hosts_crun_sigkill_ends_the_job_everywhere(self):
        with Fabric(["a", "b"]) as fab:
            a, b = self.node(fab, "a"), self.node(fab, "b")
            self.running(4)
            t0 = time.time()
            a.kill()
            a.communicate()
            cb, eb = self.finish(b)
            done = time.time() - t0
            self.assertEqual(cb, 1, eb)
            self.assertIn(f"lost the rendezvous service at {fab.addr('a')}:{PORT}", eb)
        self.assertNothingLeft()
        self.record("the rendezvous host's crun (a) SIGKILL",
                    "a's workers die with it; b sees its session break, stops its workers, "
                    "exits 1 naming the service", f"b exited {ms(done)} after the kill")

    def test_a_short_partition_heals_without_disturbing_the_job(self):
        with Fabric(["a", "b"]) as fab:
            conf = "heartbeat_timeout=3,heartbeat_interval=0.25,last_call_timeout=0.1"
            a, b = self.node(fab, "a", conf=conf), self.node(fab, "b", conf=conf)
            self.running(4)
            fab.link_down("b")
            time.sleep(0.5)  # the fault itself: half a second without a link (not a wait)
            fab.link_up("b")
            self.go()
            (ca, ea), (cb, eb) = self.finish(a), self.finish(b)
            self.assertEqual((ca, cb), (0, 0), ea + eb)
            self.assertEqual(len(self.events()), 4)  # one round: nobody was restarted
        self.assertNothingLeft()
        self.record("partition of b for 0.5 s (heartbeat_timeout 3 s)",
                    "nothing happens: one round, restart count 0, both exit 0", "no recovery "
                    "needed")

    def test_a_long_partition_is_lost_then_the_healed_node_rejoins(self):
        with Fabric(["a", "b"]) as fab:
            a = self.node(fab, "a", nnodes="1:2")
            b = self.node(fab, "b", nnodes="1:2")
            self.running(4, WORLD_SIZE=4)
            t0 = time.time()
            fab.link_down("b")
            self.running(2, WORLD_SIZE=2)
            lost = min(e["t"] for e in self.events(WORLD_SIZE=2)) - t0
            cb, eb = self.finish(b)  # b cannot reach the service either
            self.assertEqual(cb, 1, eb)
            self.assertIn("lost the rendezvous service", eb)
            fab.link_up("b")
            t1 = time.time()
            before = len(self.events(WORLD_SIZE=4))
            b2 = self.node(fab, "b", nnodes="1:2")
            self.running(before + 4, WORLD_SIZE=4)
            rejoined = max(e["t"] for e in self.events(WORLD_SIZE=4)) - t1
            self.go()
            (ca, ea), (cb2, eb2) = self.finish(a), self.finish(b2)
            self.assertEqual((ca, cb2), (0, 0), ea + eb2)
            self.assertRegex(ea, r"node \S+ \(\S+@10\.77\.0\.2#\d+\) was lost: no heartbeat")
            self.assertEqual({e["TORCHELASTIC_RESTART_COUNT"] for e in self.events()}, {"0"})
        self.assertNothingLeft()
        self.record("partition of b (link down), healed, b's crun started again",
                    "a re-forms alone after heartbeat_timeout (1.5 s); b exits 1 (lost the "
                    "service); the new crun on b scales the job back to 4 workers; exit 0",
                    f"a alone after {ms(lost)}; back to 2 nodes {ms(rejoined)} after b's "
                    "new crun started")

    def all_running(self, n, since, *procs):
        """Waits for `n` workers to have started in all; returns how long after `since` the
        last one did. Without them, fails with every process's log."""
        try:
            self.running(n)
        except AssertionError:
            for p in procs:
                p.kill()
            raise AssertionError("not every worker started; logs:\n" + "\n".join(
                f"{' '.join(p.args[-6:])}:\n{p.communicate()[1]}" for p in procs))
        return max(e["t"] for e in self.events()) - since

    def rejoined(self, first, since, *procs):
        """Waits for a second round of all 4 workers; returns them and how long after `since`
        the last one started."""
        took = self.all_running(8, since, *procs)
        return [e for e in self.events() if e["pid"] not in first], took

    def daemon_job(self, fab, conf=FAST):
        """A `crun rendezvous` daemon on a, an agent on a and on b, their 4 workers running;
        returns the three processes and the workers' pids."""
        d = self.daemon(fab)
        a = self.node(fab, "a", is_host=False, conf=conf)
        b = self.node(fab, "b", is_host=False, conf=conf)
        self.running(4)
        return d, a, b, {e["pid"] for e in self.events()}

    def daemon(self, fab):
        p = fab.popen("a", [CRUN, "rendezvous", "--host", fab.addr("a"), "--port", str(PORT),
                            "--insecure", "--log-level", "warn"],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        self.assertIn("listening on", p.stdout.readline())
        return p

    def test_the_daemon_restarted_mid_job_is_rejoined(self):
        with Fabric(["a", "b"]) as fab:
            d, a, b, first = self.daemon_job(fab)
            t0 = time.time()
            d.kill()  # a crash, not a goodbye
            d.communicate()
            # Both agents stop their workers (the round's store died with the daemon) ...
            wait_for(lambda: not any(alive(p) for p in first), "the first round's workers gone")
            d = self.daemon(fab)  # ... and rejoin the new daemon by themselves.
            t1 = time.time()
            second, rejoined = self.rejoined(first, t1, a, b, d)
            for err in self.go_and_succeed(a, b):
                self.assertIn(f"lost the rendezvous service at {fab.addr('a')}:{PORT}", err)
                self.assertIn("it is a daemon, so this node stops its workers and rejoins", err)
            self.assertEqual(sorted(int(e["RANK"]) for e in second), [0, 1, 2, 3])
            self.stop_daemon(d)
        self.assertNothingLeft()
        self.record("`crun rendezvous` daemon SIGKILLed mid-job and started again",
                    "every crun stops its workers, waits for the daemon (`reconnect_timeout`, "
                    "60 s) and rejoins; a new round runs all 4 ranks; exit 0",
                    f"workers stopped, then all running again {ms(rejoined)} after the new "
                    "daemon started (killed to restarted: "
                    f"{ms(t1 - t0)} in this test)")

    def test_a_partition_that_heals_is_rejoined_through_the_daemon(self):
        with Fabric(["a", "b"]) as fab:
            d, a, b, first = self.daemon_job(fab)
            fab.link_down("b")
            t0 = time.time()
            # The fault lasts until both sides have acted on it (heartbeat_timeout 1.5 s): the
            # daemon lost b, so a stopped its workers to re-form, and b lost the daemon, so it
            # stopped its own to rejoin.
            wait_for(lambda: not any(alive(p) for p in first),
                     "a and b to stop their workers while b is cut off", limit=30)
            fab.link_up("b")
            t1 = time.time()
            second, rejoined = self.rejoined(first, t1, a, b, d)
            _, eb = self.go_and_succeed(a, b)
            self.assertNotIn("another agent already joined", eb)
            self.assertEqual(sorted(int(e["RANK"]) for e in second), [0, 1, 2, 3])
            self.stop_daemon(d)
        self.assertNothingLeft()
        self.record("partition of b until both nodes stopped their workers, healed, with a "
                    "`crun rendezvous` daemon",
                    "the daemon loses b after heartbeat_timeout and a waits for it; b stops its "
                    "workers and reconnects when the link is back, taking its node id over "
                    "(same agent incarnation); all 4 ranks run again; exit 0",
                    f"all workers running again {ms(rejoined)} after the link came back (cut "
                    f"for {ms(t1 - t0)})")

    # ---- the daemon in trouble while agents gather -----------------------------------------

    def joined(self, fab, n, run_id="job"):
        """Whether the daemon on a lists at least `n` nodes in `run_id` (asked with `crun
        status`)."""
        r = subprocess.run(fab.command("a", [CRUN, "status", "--rdzv-endpoint",
                                             f"{fab.addr('a')}:{PORT}", "--rdzv-id", run_id,
                                             "--json", "--timeout", "2"]),
                           capture_output=True, text=True, timeout=LIMIT_S)
        return r.returncode == 0 and len(json.loads(r.stdout)[0]["nodes"]) >= n

    def test_a_daemon_stopped_for_5_s_while_agents_gather_is_waited_for(self):
        with Fabric(["a", "b"]) as fab:
            d = self.daemon(fab)
            a = self.node(fab, "a", is_host=False)
            wait_for(lambda: self.joined(fab, 1), "a to join")
            d.send_signal(signal.SIGSTOP)
            b = self.node(fab, "b", is_host=False)  # its connection waits in the backlog
            time.sleep(5)  # the fault itself: a daemon that does nothing for 5 s
            t0 = time.time()
            d.send_signal(signal.SIGCONT)
            started = self.all_running(4, t0, a, b, d)
            self.go_and_succeed(a, b)
            self.assertEqual(sorted(int(e["RANK"]) for e in self.events()), [0, 1, 2, 3])
            self.stop_daemon(d)
        self.assertNothingLeft()
        self.record("`crun rendezvous` daemon SIGSTOPped for 5 s while the agents gather (a "
                    "joined, b joining)", "nothing fails: both agents keep trying (join_timeout "
                    "600 s), the round forms when the daemon runs again; one round; exit 0",
                    f"all 4 workers running {ms(started)} after SIGCONT")

    def backlog(self, d):
        """Connections waiting in the accept queue of daemon `d`'s listening socket: for a
        listening socket, /proc/net/tcp's rx_queue field is that queue's length. gRPC listens
        on an IPv6 socket that takes IPv4 too: tcp6 holds it."""
        rows = [line.split() for table in ("tcp", "tcp6")
                for line in whole_lines(f"/proc/{d.pid}/net/{table}")[1:]]
        return sum(int(r[4].split(":")[1], 16) for r in rows
                   if r[3] == "0A" and int(r[1].split(":")[1], 16) == PORT)

    def daemon_stalled_while_its_hosts_node_connects(self, stall_s):
        """A `crun rendezvous` daemon on a stops answering (SIGSTOP) for `stall_s` while a's own
        crun, which tries to host the endpoint first and finds the port taken, connects to it;
        then it runs again (SIGCONT). Issue 17's case: the daemon is crun's own, only slow for
        a moment, and must be waited for within join_timeout, not called a stranger. Returns
        a's stderr and how long after SIGCONT the last worker started."""
        conf = FAST + ",join_timeout=30"
        with Fabric(["a", "b"]) as fab:
            d = self.daemon(fab)
            d.send_signal(signal.SIGSTOP)
            wait_for(lambda: proc_state(d.pid) == "T", "the daemon stopped")
            a = self.node(fab, "a", conf=conf)  # the endpoint names a: it tries to host first
            # Only a connects before SIGCONT: a connection in the queue is a's.
            wait_for(lambda: self.backlog(d) >= 1, "a's connection in the stopped daemon's queue")
            time.sleep(stall_s)  # the fault itself: the daemon does nothing for stall_s
            t0 = time.time()
            d.send_signal(signal.SIGCONT)
            b = self.node(fab, "b", conf=conf)
            started = self.all_running(4, t0, a, b, d)
            ea, _ = self.go_and_succeed(a, b)
            self.assertNotIn("not a crun rendezvous service", ea)
            self.assertEqual(sorted(int(e["RANK"]) for e in self.events()), [0, 1, 2, 3])
            self.stop_daemon(d)
        self.assertNothingLeft()
        return ea, started

    def test_a_daemon_stalled_0_3_s_while_its_hosts_node_connects_is_waited_for(self):
        self.stalled_row(0.3)

    def test_a_daemon_stalled_1_s_while_its_hosts_node_connects_is_waited_for(self):
        self.stalled_row(1)

    def test_a_daemon_stalled_5_s_while_its_hosts_node_connects_is_waited_for(self):
        self.stalled_row(5)

    def stalled_row(self, stall_s):
        ea, started = self.daemon_stalled_while_its_hosts_node_connects(stall_s)
        # Which way a went: a short stall ends while a's probe still waits for an answer (3 s),
        # and a joins a service that answered; a long one is joined unanswered, with a warning
        # naming the holder, and waited for by the join itself.
        if stall_s > 3:
            self.assertIn("which does not answer yet", ea)
        else:
            self.assertNotIn("which does not answer yet", ea)
        self.record(f"`crun rendezvous` daemon SIGSTOPped for {stall_s} s while the crun on its "
                    "own host connects (it finds the port taken and asks who holds it)",
                    "the daemon is crun's, only silent: a waits for it as for a service not up "
                    "yet (join_timeout 30 s) and joins; one round of all 4 ranks; exit 0",
                    f"all 4 workers running {ms(started)} after SIGCONT")

    def test_crun_status_waits_for_a_daemon_stopped_while_it_connects(self):
        """`crun status` asked of a daemon that is stopped (SIGSTOP) when it connects and runs
        again 0.5 s later: its connection waits in the daemon's accept queue, and the answer
        comes within --timeout. gRPC alone gives up a handshake after 100 ms, which a busy
        daemon also takes; `crun status` said "no answer" then."""
        with Fabric(["a"]) as fab:
            d = self.daemon(fab)
            d.send_signal(signal.SIGSTOP)
            wait_for(lambda: proc_state(d.pid) == "T", "the daemon stopped")
            s = fab.popen("a", [CRUN, "status", "--rdzv-endpoint", f"{fab.addr('a')}:{PORT}",
                                "--json", "--timeout", "20"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self.procs.append(s)
            wait_for(lambda: self.backlog(d) >= 1, "crun status's connection in the queue")
            time.sleep(0.5)  # the fault itself: the daemon does nothing for 0.5 s
            t0 = time.time()
            d.send_signal(signal.SIGCONT)
            out, err = s.communicate(timeout=LIMIT_S)
            answered = time.time() - t0
            self.assertEqual(s.returncode, 0, err)
            self.assertEqual(json.loads(out), [])
            self.stop_daemon(d)
        self.assertNothingLeft()
        self.record("`crun rendezvous` daemon SIGSTOPped for 0.5 s while `crun status` connects",
                    "`crun status` waits for it within --timeout and prints the jobs; exit 0",
                    f"answered {ms(answered)} after SIGCONT")

    def test_a_daemon_stopped_for_good_is_named_when_join_timeout_passes(self):
        """The silent holder waited for above, silent for good: when join_timeout passes, the
        crun on its host names the process that holds the port, not a guess."""
        with Fabric(["a", "b"]) as fab:
            d = self.daemon(fab)
            d.send_signal(signal.SIGSTOP)
            wait_for(lambda: proc_state(d.pid) == "T", "the daemon stopped")
            t0 = time.time()
            a = self.node(fab, "a", conf=FAST + ",join_timeout=4")
            ca, ea = self.finish(a)
            done = time.time() - t0
            self.assertEqual(ca, 1, ea)
            self.assertIn("within 4000 ms (join_timeout): port 29400 on this host is held by "
                          f"pid {d.pid} (crun), which never answered as the service", ea)
            self.assertNotIn("is the port open?", ea)
            d.send_signal(signal.SIGCONT)
            self.stop_daemon(d)
        self.assertNothingLeft()
        self.record("`crun rendezvous` daemon SIGSTOPped for good while the crun on its own host "
                    "joins (`join_timeout=4`)",
                    "a waits for it (3 s probe, then join_timeout) and exits 1 naming the pid "
                    "that holds the port and never answered", f"a exited {ms(done)} after it started")

    def test_a_daemon_killed_and_restarted_while_agents_gather_is_rejoined(self):
        with Fabric(["a", "b"]) as fab:
            d = self.daemon(fab)
            a = self.node(fab, "a", is_host=False)
            wait_for(lambda: self.joined(fab, 1), "a to join")
            t0 = time.time()
            d.kill()  # a crash, not a goodbye
            d.communicate()
            b = self.node(fab, "b", is_host=False)
            time.sleep(1)  # the fault itself: the daemon is down for a second
            d = self.daemon(fab)
            t1 = time.time()
            started = self.all_running(4, t1, a, b, d)
            self.go_and_succeed(a, b)
            self.assertEqual(sorted(e["NODE_TAG"] for e in self.events()), ["a", "a", "b", "b"])
            self.stop_daemon(d)
        self.assertNothingLeft()
        self.record("`crun rendezvous` daemon SIGKILLed while the agents gather, started again "
                    "1 s later", "a reconnects and joins again, b keeps trying until the daemon "
                    "answers; one round of all 4 ranks; exit 0",
                    f"all 4 workers running {ms(started)} after the new daemon started (down "
                    f"for {ms(t1 - t0)})")

    def fifty_jobs(self, stop_s):
        """50 two-agent jobs (one agent on a, one on b, one worker each) started at once against
        one daemon; with `stop_s`, the daemon is SIGSTOPped before they start and stays so
        for `stop_s` after the last has started, while they connect and try to join. Returns (seconds from the first agent's start to
        the last worker's, seconds from SIGCONT to the last worker's start or None, workers
        already started at SIGCONT)."""
        with Fabric(["a", "b"]) as fab:
            d = self.daemon(fab)
            if stop_s:
                # Not after a first join: by then, on a fast day, every agent had joined and
                # the stop disturbed nobody (its row then read "-484 ms after SIGCONT").
                d.send_signal(signal.SIGSTOP)
            t0 = time.time()
            agents = [self.node(fab, host, is_host=False, conf="", run_id=f"j{i}", nproc=1,
                                probe=(), tag=f"{i}{host}") for i in range(50) for host in "ab"]
            resumed, early = None, 0
            if stop_s:
                time.sleep(stop_s)  # the fault itself
                resumed = time.time()
                early = len(self.events())  # workers of rounds formed before the stop
                d.send_signal(signal.SIGCONT)
            last = self.all_running(100, t0, *agents, d)
            failed = [(p.args[-6:], c, e[-2000:]) for p in agents
                      for c, e in [self.finish(p)] if c != 0]
            self.assertEqual(failed, [])
            self.assertEqual(sorted(e["TORCHELASTIC_RUN_ID"] for e in self.events()),
                             sorted(f"j{i}" for i in range(50) for _ in "ab"))
            self.stop_daemon(d)
        self.assertNothingLeft()
        return last, None if resumed is None else last - (resumed - t0), early

    @lanes.alone
    def test_fifty_jobs_started_at_once_against_one_daemon_all_run(self):
        last, _, _ = self.fifty_jobs(0)
        self.record("50 two-agent jobs started at once against one `crun rendezvous` daemon",
                    "every one of the 100 agents joins its job and exits 0",
                    f"all 100 workers ran within {ms(last)} of the first agent's start")

    @lanes.alone
    def test_fifty_jobs_with_the_daemon_stopped_for_1_s_during_the_joins_all_run(self):
        last, after, early = self.fifty_jobs(1)
        self.record("the same 50 jobs with the daemon SIGSTOPped while they start, until 1 s "
                    "after the last",
                    "no agent gives up (each retries until join_timeout); every one exits 0",
                    f"all 100 workers ran within {ms(last)} of the first agent's start, "
                    f"{ms(after)} after SIGCONT ({early} had started before it)")

    def test_a_daemon_that_stays_away_ends_the_job_after_reconnect_timeout(self):
        with Fabric(["a", "b"]) as fab:
            d, a, b, _ = self.daemon_job(fab, conf=FAST + ",reconnect_timeout=1")
            t0 = time.time()
            d.kill()
            d.communicate()
            (ca, ea), (cb, eb) = self.finish(a), self.finish(b)
            done = time.time() - t0
            self.assertEqual((ca, cb), (1, 1), ea + eb)
            for err in (ea, eb):
                self.assertIn("and it was not back within 1000 ms (reconnect_timeout)", err)
        self.assertNothingLeft()
        self.record("`crun rendezvous` daemon gone for good (`reconnect_timeout=1`)",
                    "every crun stops its workers, waits 1 s, exits 1 naming the service and "
                    "the timeout", f"all crun exited {ms(done)} after the daemon died")

    def test_a_full_log_disk_is_reported_and_the_job_goes_on(self):
        disk = os.path.join(self.dir, "disk")
        os.mkdir(disk)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", disk], check=True)
        try:
            out = os.path.join(self.dir, "out")
            os.mkdir(out)
            r = subprocess.run([CRUN, "--nproc-per-node", "2", "--log-dir", disk, "-t", "3",
                                BEHAVE, out, "--mode", "chatty", "--lines", "400"],
                               capture_output=True, text=True, timeout=LIMIT_S)
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            self.assertRegex(r.stderr, r"cannot write rank [01] std(out|err) to \S+/std(out|err)"
                                       r"\.log: No space left on device; from here on it goes "
                                       r"to the console only")
            # The console has every line although the files could not take them.
            self.assertEqual(r.stdout.count("line=399"), 2)
        finally:
            subprocess.run(["umount", disk], check=False)
        self.assertNothingLeft()
        self.record("log directory on a full disk (64 KiB tmpfs, `-t 3`)",
                    "one warning per stream naming the file and `No space left on device`; "
                    "every line still reaches the console; exit 0", "no recovery needed")

    # ---- descendants ----------------------------------------------------------------------

    def daemon_pids(self, out):
        paths = [os.path.join(out, f"daemon_{rank}.pid") for rank in range(2)]
        wait_for(lambda: all(os.path.exists(path) for path in paths), "the daemons' pids")
        pids = []
        for path in paths:
            with open(path) as f:
                pids.append(int(f.read()))
        return pids

    def test_daemonised_grandchildren_end_with_the_job_and_with_a_sigkilled_crun(self):
        # Each worker double-forks a grandchild into a new session (tests/workers/daemonize.py).
        normal = os.path.join(self.dir, "normal")
        os.mkdir(normal)
        r = subprocess.run([CRUN, "--nproc-per-node", "2", "--tee", "3", DAEMONIZE, normal],
                           capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual([p for p in self.daemon_pids(normal) if alive(p)], [],
                         "a daemon outlived crun's exit")
        self.assertIn("had left their worker's process group (setsid or daemonised)",
                      r.stderr)
        self.record("a worker's daemonised grandchild (setsid + double fork), job ends normally",
                    "crun, the subreaper of its orphans, kills it with its group at the attempt's "
                    "end (one warning line); exit 0; nothing outlives crun",
                    "gone before crun exited")

        killed = os.path.join(self.dir, "killed")
        os.mkdir(killed)
        log = os.path.join(self.dir, "crun.log")  # not a pipe: a surviving daemon would hold it
        with open(log, "w") as f:
            p = subprocess.Popen([CRUN, "--log-level", "info", "--nproc-per-node", "2",
                                  DAEMONIZE, killed, "--stay"], stdout=f, stderr=f)
        self.procs.append(p)
        pids = self.daemon_pids(killed)
        t0 = time.time()
        p.kill()
        p.wait(timeout=LIMIT_S)
        with open(log) as f:
            err = f.read()
        if "workers run in cgroup" not in err:
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            self.skipTest("this machine gives crun no cgroup: " + err[-300:])
        wait_for(lambda: not any(alive(pid) for pid in pids), "the daemons to be gone", limit=10)
        gone = time.time() - t0
        self.assertNothingLeft()
        self.record("the same with crun SIGKILLed (cgroup2 writable, as here)",
                    "the workers run in crun's cgroup; crun's guard kills everything in it and "
                    "removes it", f"grandchildren gone {ms(gone)} after the SIGKILL")

    @classmethod
    def tearDownClass(cls):
        if not RESULTS:
            return
        rows = ["| fault | what the user sees | measured |", "|---|---|---|"]
        rows += [f"| {s} | {o} | {m} |" for _, s, o, m in sorted(RESULTS)]
        table = "\n".join(rows)
        print("\n" + table)
        doc = os.environ.get("CRUN_FAULTS_DOC")
        if doc:
            with open(doc) as f:
                text = f.read()
            begin, end = "<!-- faults:begin -->", "<!-- faults:end -->"
            text = re.sub(re.escape(begin) + ".*?" + re.escape(end),
                          f"{begin}\n{MEASURED_AT}\n\n{table}\n{end}", text, flags=re.S)
            with open(doc, "w") as f:
                f.write(text)


if __name__ == "__main__":
    # The figures docs/reliability.md records are each scenario's own: one at a time there.
    lanes.main(1 if os.environ.get("CRUN_FAULTS_DOC") else 4)
