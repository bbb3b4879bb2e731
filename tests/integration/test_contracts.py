"""--contract (docs/frameworks.md) with the real frameworks from PyPI, on the CPU: TensorFlow's
MultiWorkerMirroredStrategy from TF_CONFIG, JAX's jax.distributed from JAX_COORDINATOR_ADDRESS,
DeepSpeed's init_distributed with its --local_rank argument, Horovod's hvd.init() through
crun's HTTP rendezvous (its own C++ client); each standalone, with two
agents on the rendezvous service, (TensorFlow, JAX, Horovod) as two nodes of the static backend
and (TensorFlow, JAX) on two hosts (network namespaces) that meet on a real etcd, and each
restarted after a worker is SIGKILLed. Plus the refusals, and the environment against DeepSpeed's own launcher.

  test_contracts.py FRAMEWORK     tf | jax | deepspeed | horovod | refusals

The interpreters come from TF_PYTHON, JAX_PYTHON, DEEPSPEED_PYTHON and HOROVOD_PYTHON
(scripts/setup-frameworks.sh); a framework whose interpreter is not given is skipped (77)."""
import glob
import json
import os
import subprocess
import sys
import tempfile
import threading
import unittest

CRUN = os.environ["CRUN_BIN"]
HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "..", "workers")
LIMIT_S = 300
SKIPPED = 77
# The restart reason and exit message of rank 1 killed by SIGKILL, as every backend says it
# (rendezvous/report/report.h: Describe).
KILLED_RANK_1 = r"rank 1 \(local rank \d\) on \S+ failed with signal 9 \(SIGKILL\)"

sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from crun_testing import free_port, processes_mentioning, scratch_dir  # noqa: E402
from etcd_cluster import EtcdCluster, missing_programs  # noqa: E402
from fabric import Fabric  # noqa: E402


class Contract(unittest.TestCase):
    python = None
    worker = None

    def setUp(self):
        self.dir = scratch_dir(self, "crun-contract-")

    def outdir(self):
        return tempfile.mkdtemp(dir=self.dir)

    def run_all(self, commands, out):
        """Runs crun processes together to their end; returns their (code, stderr)."""
        env = dict(os.environ, PYTHON_EXEC=self.python)
        procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env, stdin=subprocess.DEVNULL) for c in commands]
        results = []
        try:
            for p in procs:
                stdout, stderr = p.communicate(timeout=LIMIT_S)
                results.append((p.returncode, stdout + stderr))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
        self.assertEqual(processes_mentioning(out), [], "processes left running")
        return results

    def standalone(self, contract, *args, nproc=2, extra=()):
        out = self.outdir()
        cmd = [CRUN, "--contract", contract, "--standalone", "--nproc-per-node", str(nproc),
               *extra, self.worker, *args, out]
        [(code, text)] = self.run_all([cmd], out)
        return code, text, out

    def two_agents(self, contract, *args, extra=()):
        """Two crun agents on this host, one worker each, on the rendezvous service one of
        them hosts."""
        out = self.outdir()
        endpoint = f"127.0.0.1:{free_port()}"
        cmds = [[CRUN, "--contract", contract, "--nnodes", "2", "--nproc-per-node", "1",
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id",
                 os.path.basename(out), *extra, self.worker, *args, out] for _ in range(2)]
        results = self.run_all(cmds, out)
        return results, out

    def two_hosts_on_etcd(self, contract, *args):
        """Two hosts (network namespaces a and b, one worker each) whose agents meet on a real
        etcd in a third (e): each node's workers are reached at its own address."""
        missing = missing_programs()
        self.assertEqual(missing, [], "etcd is installed by scripts/install-deps.sh")
        out = self.outdir()
        with Fabric(["e", "a", "b"]) as fab, \
                EtcdCluster(fab, ["e"], os.path.join(self.dir, "etcd")) as etcd:
            # The namespaces share this machine's host name, which /etc/hosts maps to
            # loopback, and JAX's gloo finds its own address by the host name: each host gets
            # its address as its name (a UTS namespace), as real hosts have names of their own.
            cmds = [fab.command(host, ["unshare", "--uts", "sh", "-c",
                                       'hostname "$0" && exec "$@"', fab.addr(host),
                                       CRUN, "--contract", contract, "--nnodes", "2",
                                       "--nproc-per-node", "1", "--rdzv-backend", "etcd-v3",
                                       "--rdzv-endpoint", etcd.endpoints(), "--rdzv-id",
                                       os.path.basename(out), self.worker, *args, out])
                    for host in ("a", "b")]
            results = self.run_all(cmds, out)
            addresses = {fab.addr("a"), fab.addr("b")}
        return results, out, addresses

    def two_static_nodes(self, contract, *args, extra=()):
        """Two crun processes on this host as the two nodes of torchrun's static backend (node
        0 hosts the store for the whole job), one worker each; node 1 starts first."""
        out = self.outdir()
        port = str(free_port())
        cmds = [[CRUN, "--contract", contract, "--nnodes", "2", "--node-rank", rank,
                 "--master-addr", "127.0.0.1", "--master-port", port, "--nproc-per-node", "1",
                 *extra, self.worker, *args, out] for rank in ("1", "0")]
        results = self.run_all(cmds, out)
        return results, out

    def results(self, out, prefix, world, attempt=0):
        got = []
        for rank in range(world):
            with open(os.path.join(out, f"{prefix}_{rank}_{attempt}.json")) as f:
                got.append(json.load(f))
        return got

    def ok_results(self, out, prefix, world, attempt=0):
        """Every rank's results, each of which says its checks passed."""
        got = self.results(out, prefix, world, attempt)
        for x in got:
            self.assertTrue(x["ok"], x)
        return got


class Tf(Contract):
    python = os.environ.get("TF_PYTHON")
    worker = os.path.join(WORKERS, "tf_mwms.py")

    def tf_config(self, out, rank, attempt):
        with open(os.path.join(out, f"tf_config_{rank}_{attempt}.json")) as f:
            return json.load(f)

    def check_trained(self, out, world, attempt=0):
        r = self.results(out, "tf", world, attempt)
        self.assertEqual({x["weights"] for x in r}, {r[0]["weights"]}, "weights differ")
        self.assertEqual({json.dumps(x["cluster"]) for x in r}, {json.dumps(r[0]["cluster"])})
        self.assertEqual(len(r[0]["cluster"]), world)
        self.assertEqual(len(set(r[0]["cluster"])), world, "two workers share a port")
        return r

    def test_two_agents_on_the_service_get_one_cluster(self):
        results, out = self.two_agents("tf")
        for code, text in results:
            self.assertEqual(code, 0, text)
        self.check_trained(out, 2)

    def test_two_hosts_on_etcd_reach_each_other_s_workers(self):
        results, out, addresses = self.two_hosts_on_etcd("tensorflow")
        for code, text in results:
            self.assertEqual(code, 0, text)
        cluster = self.check_trained(out, 2)[0]["cluster"]
        self.assertEqual({w.rsplit(":", 1)[0] for w in cluster}, addresses, cluster)

    def test_two_static_nodes_share_one_cluster_and_restart_together(self):
        """The static backend exchanges ports over node 0's store: rank 1 (node 1) is killed,
        node 0 restarts with node 1 (it hears node 1 begin round 1, or its worker fails at the
        loss of its peer, whichever comes first), and the second round gets new ports."""
        results, out = self.two_static_nodes("tensorflow", "--die-once",
                                             extra=("--max-restarts", "1"))
        for code, text in results:
            self.assertEqual(code, 0, text)
            self.assertIn("restarting the worker group (restart 1 of at most 1)", text)
        self.assertRegex(results[0][1], KILLED_RANK_1)
        first = self.tf_config(out, 0, 0)["cluster"]["worker"]
        again = self.check_trained(out, 2, attempt=1)[0]["cluster"]
        self.assertNotEqual(first, again, "the restart kept the first round's ports")

    def test_a_port_taken_before_the_worker_binds_fails_it_and_restarts_with_new_ports(self):
        # Also what a standalone job of two workers must do after any failure: restart with
        # new ports and train to identical weights (its second attempt's, from scratch). A
        # SIGKILLed TensorFlow worker: test_two_static_nodes_share_one_cluster_and_restart_together.
        code, text, out = self.standalone("tensorflow", "--take-port-once",
                                          extra=("--max-restarts", "1", "--shutdown-timeout", "5"))
        self.assertEqual(code, 0, text)
        self.assertIn("Could not start gRPC server", text)
        self.assertRegex(text, r"rank 0 \(local rank 0\) on \S+ failed with exit code 1")
        self.assertIn("restarting the worker group (restart 1 of at most 1)", text)
        first = self.tf_config(out, 0, 0)["cluster"]["worker"]
        again = self.check_trained(out, 2, attempt=1)[0]["cluster"]
        self.assertNotEqual(first, again, "the restart kept the first attempt's ports")


class Jax(Contract):
    python = os.environ.get("JAX_PYTHON")
    worker = os.path.join(WORKERS, "jax_psum.py")

    def check_sums(self, out, world, attempt=0):
        r = self.ok_results(out, "jax", world, attempt)
        self.assertEqual({x["coordinator"] for x in r}, {r[0]["coordinator"]})
        return r

    def test_standalone_psum(self):
        code, text, out = self.standalone("jax")
        self.assertEqual(code, 0, text)
        self.check_sums(out, 2)

    def test_two_agents_on_the_service(self):
        results, out = self.two_agents("jax")
        for code, text in results:
            self.assertEqual(code, 0, text)
        self.check_sums(out, 2)

    def test_two_hosts_on_etcd(self):
        results, out, addresses = self.two_hosts_on_etcd("jax")
        for code, text in results:
            self.assertEqual(code, 0, text)
        coordinator = self.check_sums(out, 2)[0]["coordinator"]
        self.assertIn(coordinator.rsplit(":", 1)[0], addresses)

    def test_two_static_nodes(self):
        results, out = self.two_static_nodes("jax")
        for code, text in results:
            self.assertEqual(code, 0, text)
        self.check_sums(out, 2)

    def test_a_killed_worker_restarts_the_group_at_once(self):
        code, text, out = self.standalone("jax", "--die-once", extra=("--max-restarts", "1"))
        self.assertEqual(code, 0, text)
        self.assertRegex(text, KILLED_RANK_1)
        # JAX's preemption service is off (JAX_ENABLE_PREEMPTION_SERVICE=false): the survivor
        # ends at SIGTERM rather than at the shutdown timeout's SIGKILL.
        self.assertNotIn("after the stop signal: SIGKILL", text)
        self.check_sums(out, 2, attempt=1)


class DeepSpeed(Contract):
    python = os.environ.get("DEEPSPEED_PYTHON")
    worker = os.path.join(WORKERS, "deepspeed_worker.py")

    def setUp(self):
        super().setUp()
        # DeepSpeed's CPU all-reduce leaves a 66 MiB /dev/shm file per rank and run
        # (deepspeed_allreduce_buffer_*), under its own launcher as under crun: the test removes
        # those its runs made, so that the suite leaves the machine's memory as it found it.
        before = set(glob.glob("/dev/shm/deepspeed_allreduce_buffer_*"))
        self.addCleanup(lambda: [os.unlink(f) for f in
                                 set(glob.glob("/dev/shm/deepspeed_allreduce_buffer_*")) - before])

    def test_a_restarted_group_gets_what_its_own_launcher_gives(self):
        """A worker SIGKILLed restarts the group; the restarted workers' init_distributed with
        --local_rank, and every variable DeepSpeed's launcher gives a worker, crun gives with the
        same value, but for the differences docs/environment.md lists."""
        code, text, ours = self.standalone("deepspeed", "--local_rank=${local_rank}",
                                           "--die-once", extra=("--max-restarts", "1"))
        self.assertEqual(code, 0, text)
        self.assertRegex(text, KILLED_RANK_1)
        for x in self.ok_results(ours, "ds", 2, attempt=1):
            self.assertEqual(x["env"]["LOCAL_SIZE"], "2")
            self.assertEqual(x["env"]["CROSS_RANK"], "0")
            self.assertEqual(x["env"]["CROSS_SIZE"], "1")
        theirs = self.outdir()
        launcher = os.path.join(os.path.dirname(self.python), "deepspeed")
        env = dict(os.environ, PATH=os.path.dirname(self.python) + ":" + os.environ["PATH"])
        r = subprocess.run([launcher, "--num_gpus", "2", self.worker, theirs],
                           capture_output=True, text=True, timeout=LIMIT_S, env=env)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        # CUDA_VISIBLE_DEVICES: its launcher lists its devices even on the CPU; MASTER_PORT:
        # its default 29500 against the port of crun's store; PATH, PWD: the test's.
        explained = {"CUDA_VISIBLE_DEVICES", "MASTER_PORT", "PATH", "PWD"}
        for a, b in zip(self.results(ours, "ds", 2, attempt=1), self.results(theirs, "ds", 2)):
            added = {k: v for k, v in b["env"].items()
                     if os.environ.get(k) != v and k not in explained}
            self.assertTrue({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE", "CROSS_RANK",
                             "CROSS_SIZE", "MASTER_ADDR"} <= set(added), added)
            for k, v in added.items():
                self.assertEqual(a["env"].get(k), v, k)
            self.assertEqual(a["local_rank_arg"], b["local_rank_arg"])


class Horovod(Contract):
    python = os.environ.get("HOROVOD_PYTHON")
    worker = os.path.join(WORKERS, "horovod_worker.py")

    def check_ran(self, out, world, attempt=0):
        return self.ok_results(out, "hvd", world, attempt)

    def check_two_nodes(self, results, out):
        """Two nodes of one worker each: a local scope each, one rendezvous for both."""
        for code, text in results:
            self.assertEqual(code, 0, text)
        r = self.check_ran(out, 2)
        self.assertEqual([(x["local_rank"], x["local_size"], x["cross_rank"], x["cross_size"])
                          for x in r], [(0, 1, 0, 2), (0, 1, 1, 2)])
        self.assertEqual(len({x["env"]["HOROVOD_HOSTNAME"] for x in r}), 2)
        self.assertEqual(len({x["env"]["HOROVOD_GLOO_RENDEZVOUS_PORT"] for x in r}), 1)

    def test_two_agents_on_the_service_each_a_local_scope_of_its_own(self):
        self.check_two_nodes(*self.two_agents("horovod"))

    def test_two_static_nodes_meet_on_node_0_s_rendezvous(self):
        self.check_two_nodes(*self.two_static_nodes("horovod"))

    def test_a_restarted_group_gets_a_fresh_rendezvous_and_what_horovodrun_gives(self):
        """A worker SIGKILLed restarts the group on a fresh rendezvous; the restarted workers'
        standalone all-reduce and broadcast, and every HOROVOD_ variable horovodrun --gloo
        gives a worker on this host, crun gives them with the same value, but for the
        differences docs/environment.md lists."""
        code, text, ours = self.standalone("horovod", "--die-once", extra=("--max-restarts", "1"))
        self.assertEqual(code, 0, text)
        self.assertRegex(text, KILLED_RANK_1)
        first = open(os.path.join(ours, "hvd_port_0_0")).read()
        again = self.check_ran(ours, 2, attempt=1)[0]["env"]["HOROVOD_GLOO_RENDEZVOUS_PORT"]
        self.assertNotEqual(first, again, "the restart reused the first round's rendezvous")
        for x in self.check_ran(ours, 2, attempt=1):
            self.assertEqual((x["local_size"], x["cross_rank"], x["cross_size"]), (2, 0, 1))
        theirs = self.outdir()
        bin_dir = os.path.dirname(self.python)
        r = subprocess.run([os.path.join(bin_dir, "horovodrun"), "--gloo", "-np", "2", "-H",
                            "localhost:2", self.python, self.worker, theirs],
                           capture_output=True, text=True, timeout=LIMIT_S,
                           env=dict(os.environ, PATH=bin_dir + ":" + os.environ["PATH"]))
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        # HOROVOD_GLOO_IFACE: horovodrun's pick of a common interface (crun leaves gloo to
        # the host name); the rendezvous port; HOROVOD_HOSTNAME: -H's name against the host's.
        explained = {"HOROVOD_GLOO_IFACE", "HOROVOD_GLOO_RENDEZVOUS_PORT", "HOROVOD_HOSTNAME"}
        for a, b in zip(self.check_ran(ours, 2, attempt=1), self.check_ran(theirs, 2)):
            self.assertEqual({k: v for k, v in a["env"].items() if k not in explained},
                             {k: v for k, v in b["env"].items() if k not in explained})
            self.assertEqual(set(b["env"]) - set(a["env"]), {"HOROVOD_GLOO_IFACE"})
            self.assertEqual(a["torchrun"]["RANK"], str(a["rank"]))

    def test_horovodrun_s_spelling_on_one_host(self):
        out = self.outdir()
        cmd = [CRUN, "-np", "2", "-H", "localhost:2", self.python, self.worker, out]
        [(code, text)] = self.run_all([cmd], out)
        self.assertEqual(code, 0, text)
        self.assertIn("horovodrun's spelling, as crun's: --contract horovod --nproc-per-node 2",
                      text)
        self.check_ran(out, 2)

    def test_bad_requests_to_the_rendezvous_are_named(self):
        out = self.outdir()
        cmd = [CRUN, "--contract", "horovod", "--standalone", "--nproc-per-node", "2",
               os.path.join(WORKERS, "horovod_kv_probe.py"), out]
        [(code, text)] = self.run_all([cmd], out)
        self.assertEqual(code, 0, text)
        for rank in (0, 1):
            a = json.load(open(os.path.join(out, f"kv_{rank}.json")))
            self.assertEqual(a["malformed path"][0], 400, a)
            self.assertIn("is not /<scope>/<key>", a["malformed path"][1])
            self.assertEqual(a["too deep"][0], 400, a)
            self.assertEqual(a["wrong method"][0], 405, a)
            self.assertEqual(a["key too long"][0], 413, a)
            self.assertIn("request body over 1048576 bytes", a["body too large"][1])
            self.assertEqual(a["body too large"][0], 413, a)
            self.assertEqual(a["put"][0], 200, a)
            self.assertEqual(a["get"], [200, "value"], a)
            self.assertEqual(a["absent"][0], 404, a)


class Refusals(unittest.TestCase):
    """Bad input: a clear error naming the value, exit 2, nothing created or left running."""

    def refused(self, *args, says):
        d = scratch_dir(self, "crun-contract-")
        r = subprocess.run([CRUN, *args, "--log-dir", os.path.join(d, "logs"), "--no-python",
                            "true"], capture_output=True, text=True, timeout=60, cwd=d)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(says, r.stderr)
        self.assertEqual(os.listdir(d), [], "a refused launch created files")

    def test_unknown_contract_names_the_closest(self):
        self.refused("--contract", "tensorflw", "--standalone",
                     says="unknown contract 'tensorflw' (did you mean tensorflow?)")
        self.refused("--contract", "jax,mxnet", "--standalone", says="unknown contract 'mxnet'")

    def test_the_pet_variable_is_read(self):
        d = scratch_dir(self, "crun-contract-")
        r = subprocess.run([CRUN, "--standalone", "--no-python", "true"], capture_output=True,
                           text=True, timeout=60, cwd=d, env=dict(os.environ, PET_CONTRACT="jx"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("unknown contract 'jx' (did you mean jax?)", r.stderr)

    def test_a_static_node_whose_peer_never_comes_gives_up_naming_it(self):
        """Node 0 of two, alone: its round waits join_timeout for node 1's ports, then ends
        naming node 1, with nothing left running."""
        d = scratch_dir(self, "crun-contract-")
        r = subprocess.run([CRUN, "--contract", "tensorflow", "--nnodes", "2", "--node-rank", "0",
                            "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                            "--rdzv-conf", "join_timeout=2", "--log-dir",
                            os.path.join(d, "logs"), "--no-python", "sleep", "600"],
                           capture_output=True, text=True, timeout=60, cwd=d)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("--contract: round 0: no ports from node 1 within 2.0 s", r.stderr)
        self.assertEqual(processes_mentioning(d), [], "processes left running")

    def test_a_sigterm_while_waiting_for_the_other_nodes_ends_crun(self):
        """Node 1 of two, its store (node 0's) never up: a SIGTERM ends its wait for the
        other nodes' ports, rather than the join timeout (600 s)."""
        d = scratch_dir(self, "crun-contract-")
        p = subprocess.Popen([CRUN, "--contract", "jax", "--nnodes", "2", "--node-rank", "1",
                              "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                              "--log-level", "info", "--log-dir", os.path.join(d, "logs"),
                              "--no-python", "sleep", "600"],
                             stderr=subprocess.PIPE, text=True, cwd=d)
        watchdog = threading.Timer(60, p.kill)  # the deadline on reading its lines
        watchdog.start()
        try:
            for line in p.stderr:  # crun's own lines: at info, it says when it starts to wait
                if "waiting for the ports of the other 1 nodes" in line:
                    break
            p.terminate()
            _, err = p.communicate(timeout=30)
        finally:
            watchdog.cancel()
            if p.poll() is None:
                p.kill()
                p.communicate()
        self.assertEqual(p.returncode, 128 + 15, err)
        self.assertEqual(processes_mentioning(d), [], "processes left running")

    def test_horovodrun_s_spelling_beyond_this_host(self):
        self.refused("-np", "8", "-H", "node1:4,node2:4", "python",
                     says="-H 'node1:4,node2:4' names node1, which is not this host: crun does "
                          "not start processes on other hosts (it does not ssh)")
        self.refused("-np", "8", "-H", "localhost:4", "python",
                     says="-np 8 is more than the 4 slots of -H localhost:4")

    def test_mpi_and_deepspeed_variables_reach_a_plain_program(self):
        r = subprocess.run([CRUN, "--contract", "mpi,deepspeed", "--standalone",
                            "--nproc-per-node", "3", "--no-python", "sh", "-c",
                            "echo $OMPI_COMM_WORLD_RANK/$OMPI_COMM_WORLD_SIZE "
                            "$OMPI_COMM_WORLD_LOCAL_RANK/$OMPI_COMM_WORLD_LOCAL_SIZE "
                            "$OMPI_COMM_WORLD_NODE_RANK $LOCAL_SIZE $CROSS_RANK $CROSS_SIZE"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = sorted(line.split("]:", 1)[-1].strip() for line in r.stdout.splitlines())
        self.assertEqual(lines, ["0/3 0/3 0 3 0 1", "1/3 1/3 0 3 0 1", "2/3 2/3 0 3 0 1"])


def main():
    which = sys.argv.pop(1) if len(sys.argv) > 1 else ""
    suites = {"tf": Tf, "jax": Jax, "deepspeed": DeepSpeed, "horovod": Horovod,
              "refusals": Refusals}
    if which not in suites:
        raise SystemExit(f"usage: test_contracts.py {' | '.join(suites)}")
    suite = suites[which]
    if suite is not Refusals and not suite.python:
        print(f"SKIPPED: no interpreter for {which} (scripts/setup-frameworks.sh)")
        return SKIPPED
    result = unittest.TextTestRunner(verbosity=2).run(
        unittest.defaultTestLoader.loadTestsFromTestCase(suite))
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
