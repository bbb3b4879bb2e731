"""crun as the command of Kubernetes pods, without a cluster (docs/kubernetes.md): each pod is a
network namespace with its own address and host name, and a resolver for the headless
Service's names (tests/pylib/pods.py). Each pod's environment is exactly what its controller
sets (the table in docs/kubernetes.md, from the controllers' source), and the container's
command is `crun probe.py ...` with no flags. Covered: each controller's variables forming a
job of two pods, two pods that claim one index, an index without a node count, a pod that its
controller replaced (same name, new address) rejoining the running job, a job deleted within
the default grace period, and crun as PID 1 of the pod's PID namespace. Needs root, as CI runs
it."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

CRUN = os.environ["CRUN_BIN"]
HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "..", "workers", "node_probe.py")
PORT = 29400
LIMIT_S = 120
GRACE_S = 30  # a pod's terminationGracePeriodSeconds unless it sets one

sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from crun_testing import kill_all, probe_events, proc_files, proc_state, wait_for  # noqa: E402
from pods import Pods  # noqa: E402

# What the kubelet sets in every pod.
KUBELET = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def trainer(pods, i):
    """kubeflow/trainer, the torch plugin (TrainJob "job", one container per node)."""
    return {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": str(i),
            "JOB_COMPLETION_INDEX": str(i), "PET_MASTER_ADDR": pods.fqdn(pods.hosts[0]),
            "PET_MASTER_PORT": str(PORT)}


def pytorchjob(pods, i, node_rank=True):
    """training-operator, PyTorchJob "job" with a Master and a Worker replica, not elastic:
    MASTER_ADDR is the master pod's own Service; RANK is 0 for the master, 1 + index for
    workers. Older versions set no PET_NODE_RANK (node_rank=False)."""
    env = {"PYTHONUNBUFFERED": "0", "MASTER_ADDR": pods.hosts[0], "MASTER_PORT": str(PORT),
           "WORLD_SIZE": "2", "RANK": str(i), "PET_NPROC_PER_NODE": "2", "PET_NNODES": "2"}
    if node_rank:
        env["PET_NODE_RANK"] = str(i)
    return env


def pytorchjob_elastic(pods, i):
    """PyTorchJob with an elasticPolicy: torchrun's dynamic rendezvous at worker 0's Service
    (crun's service, hosted by the crun of the pod whose address it is)."""
    return {"PYTHONUNBUFFERED": "0", "PET_RDZV_BACKEND": "c10d",
            "PET_RDZV_ENDPOINT": f"{pods.hosts[0]}:{PORT}", "PET_RDZV_ID": "job",
            "PET_NNODES": "2:2", "PET_MAX_RESTARTS": "3", "PET_NPROC_PER_NODE": "2"}


def indexed_job(pods, i):
    """A plain Indexed Job with a headless Service: the index from the controller, the rest
    from the manifest (docs/kubernetes.md's example)."""
    return {"JOB_COMPLETION_INDEX": str(i), "PET_NNODES": "2", "PET_NPROC_PER_NODE": "2",
            "PET_MASTER_ADDR": pods.fqdn(pods.hosts[0]), "PET_MASTER_PORT": str(PORT)}


# controller: (its pods' names, the headless Service, the variables of pod i)
CONTROLLERS = {
    "trainer": (["job-node-0-0", "job-node-0-1"], "job", trainer),
    "pytorchjob": (["job-master-0", "job-worker-0"], "job", pytorchjob),
    "pytorchjob_rank_only": (["job-master-0", "job-worker-0"], "job",
                             lambda pods, i: pytorchjob(pods, i, node_rank=False)),
    "pytorchjob_elastic": (["job-worker-0", "job-worker-1"], "job", pytorchjob_elastic),
    "indexed_job": (["train-0", "train-1"], "train", indexed_job),
    "jobset": (["js-workers-0-0", "js-workers-0-1"], "js", indexed_job),
}


class Kubernetes(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="crun-kubernetes-")
        self.procs = []

    def tearDown(self):
        kill_all(self.procs)
        shutil.rmtree(self.dir, ignore_errors=True)

    def pod(self, pods, name, variables, args):
        """The pod's container: `crun <args>` with the kubelet's and the controller's
        variables and none of this test's PET_*."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
        env.update(KUBELET, PYTHON_EXEC=sys.executable, NODE_TAG=name, **variables)
        p = pods.popen(name, [CRUN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, env=env)
        self.procs.append(p)
        return p

    def finish(self, p):
        out, err = p.communicate(timeout=LIMIT_S)
        return p.returncode, err

    def test_each_controllers_variables_form_a_job_of_two_pods(self):
        for controller, (names, service, variables) in CONTROLLERS.items():
            with self.subTest(controller=controller), Pods(names, service) as pods:
                out = tempfile.mkdtemp(dir=self.dir)
                procs = [self.pod(pods, name, variables(pods, i),
                                  [PROBE, out, "--connect-master"])
                         for i, name in enumerate(names)]
                errs = []
                for p in procs:
                    code, err = self.finish(p)
                    errs.append(err)
                    self.assertEqual(code, 0, err)
                ev = probe_events(out)
                self.assertEqual(sorted(int(e["RANK"]) for e in ev), [0, 1, 2, 3], ev)
                for e in ev:
                    i = names.index(e["host"])
                    # The pod's index is its node rank; its workers reached node 0's store
                    # from the pod's own address, through the Service's name.
                    self.assertEqual(int(e["GROUP_RANK"]), i, e)
                    self.assertEqual(e["connected_from"], pods.addr(e["host"]), e)
                if controller == "pytorchjob_rank_only":
                    self.assertIn("crun: from the pod's environment: node rank 1 from RANK=1, "
                                  "node 0's store at MASTER_ADDR=job-master-0, MASTER_PORT="
                                  f"{PORT}", errs[1])

    def test_two_pods_with_one_index_are_refused_naming_both(self):
        """A JobSet whose pods all read index 0 (each child Job's own index), on the static
        backend and on crun's service: the pod that claims node rank 0 second is refused,
        naming both pods, and runs no worker, instead of running a second node 0."""
        names = ["js-workers-0-0", "js-workers-1-0"]
        for backend in ("static", "service"):
            with self.subTest(backend=backend), Pods(names, "js") as pods:
                out = tempfile.mkdtemp(dir=self.dir)
                variables = {"JOB_COMPLETION_INDEX": "0", "PET_NNODES": "2",
                             "PET_NPROC_PER_NODE": "1", "PET_RDZV_CONF": "join_timeout=60"}
                if backend == "static":
                    variables.update(PET_MASTER_ADDR=pods.fqdn(names[0]),
                                     PET_MASTER_PORT=str(PORT))
                else:
                    variables["PET_RDZV_ENDPOINT"] = f"{pods.fqdn(names[0])}:{PORT}"
                procs = {name: self.pod(pods, name, variables, [PROBE, out, "--until", "done"])
                         for name in names}
                wait_for(lambda: any(p.poll() is not None for p in procs.values()),
                         "one of the two pods refused", limit=LIMIT_S)
                refused = next(n for n, p in procs.items() if p.poll() is not None)
                other = next(n for n in names if n != refused)
                code, err = self.finish(procs[refused])
                self.assertEqual(code, 1, err)
                self.assertIn(f"node rank 0 is claimed twice: by host {other} (in the job) and "
                              f"by host {refused}; give each node its own", err)
                self.assertNotIn(refused, {e["host"] for e in probe_events(out)})
                procs[other].send_signal(signal.SIGTERM)
                self.finish(procs[other])

    def test_a_deleted_job_stops_within_the_default_grace_period(self):
        """Every pod of a static job deleted at once, with workers that ignore SIGTERM: the
        kubelet sends SIGTERM and SIGKILLs what still runs GRACE_S later. Each crun must stop its
        workers (SIGKILL after its grace in a pod, 14 s), say why, and exit 143 before then, pod
        0's included, which keeps the job's store up until the other node is done."""
        names = ["train-0", "train-1"]
        worker = os.path.join(self.dir, "ignore_term.sh")
        with open(worker, "w") as f:
            f.write('#!/bin/sh\ntrap "" TERM\ntouch "$1/ready_$RANK"\nexec sleep 600\n')
        os.chmod(worker, 0o755)
        with Pods(names, "train") as pods:
            procs = [self.pod(pods, name, indexed_job(pods, i),
                              ["--no-python", worker, self.dir])
                     for i, name in enumerate(names)]
            wait_for(lambda: all(os.path.exists(os.path.join(self.dir, f"ready_{r}"))
                                 for r in range(4)), "the 4 workers")
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for name, p in zip(names, procs):
                try:
                    out, err = p.communicate(timeout=GRACE_S)
                except subprocess.TimeoutExpired:
                    p.kill()
                    out, err = p.communicate()
                    self.fail(f"{name}: crun still ran when the kubelet's SIGKILL came: {err}")
                self.assertEqual(p.returncode, 143, err)
                self.assertIn("still running 14000 ms after the stop signal: SIGKILL", err)
                self.assertIn("the workers stopped after SIGTERM", err)

    def test_crun_as_pid_1_reaps_orphans_and_exits_143_on_sigterm(self):
        """The container's command as PID 1 of the pod's PID namespace (a pod without a shared
        process namespace): every orphan of the workers is re-parented to crun and must be
        reaped by it, and the runtime's SIGTERM to it stops the workers and makes it exit 143.
        When PID 1 ends, the kernel kills whatever is left in the namespace."""
        name = "train-0"
        worker = os.path.join(self.dir, "orphaning.sh")
        with open(worker, "w") as f:
            # An orphan (its parent subshell exits at once) that exits when the test says:
            # unreaped, a zombie for as long as PID 1 lives.
            f.write('#!/bin/sh\n'
                    'cat /proc/1/comm > "$1/pid1_$RANK"\n'
                    '( exec sh -c \'echo $$ > "$1/orphan_$2.pid"\n'
                    '  while [ ! -e "$1/release" ]; do sleep 0.01; done\' sh "$1" "$RANK" & )\n'
                    'exec sleep 600\n')
        os.chmod(worker, 0o755)
        with Pods([name], "train") as pods:
            unshare, pid1 = self.pod_pid1(pods, name,
                                          ["--standalone", "--no-python", worker, self.dir])
            def read(name):
                path = os.path.join(self.dir, name)
                if not os.path.exists(path):
                    return ""
                with open(path) as f:
                    return f.read()
            orphans = [f"orphan_{r}.pid" for r in (0, 1)]
            wait_for(lambda: all(read(o).endswith("\n") for o in orphans), "both orphans' pids")
            for r in (0, 1):
                self.assertEqual(read(f"pid1_{r}").strip(), "crun")
            ns = os.readlink(f"/proc/{pid1}/ns/pid")
            hosts = [self.host_pid(ns, int(read(o))) for o in orphans]
            self.assertNotIn(None, hosts)
            open(os.path.join(self.dir, "release"), "w").close()
            # Gone entirely, not a zombie: crun reaped them.
            wait_for(lambda: all(proc_state(h) is None for h in hosts),
                     "the orphans reaped by PID 1")
            os.kill(pid1, signal.SIGTERM)
            out, err = unshare.communicate(timeout=LIMIT_S)
            self.assertEqual(unshare.returncode, 143, err)
            self.assertIn("received SIGTERM: forwarding it to 2 workers", err)

    def pod_pid1(self, pods, name, args):
        """`crun <args>` as PID 1 of a new PID namespace in pod `name`: (the unshare process,
        crun's pid as this test sees it)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
        env.update(KUBELET, PYTHON_EXEC=sys.executable, PET_NPROC_PER_NODE="2")
        p = pods.popen(name, ["unshare", "--pid", "--fork", "--mount-proc", CRUN, *args],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.procs.append(p)

        def child():
            for pid, stat in proc_files("stat"):
                fields = stat.rsplit(b")", 1)[1].split()
                if int(fields[1]) == p.pid:
                    return pid
            return None
        wait_for(lambda: child() is not None, "crun started by unshare")
        return p, child()

    @staticmethod
    def host_pid(ns, ns_pid):
        """The pid this test sees of the process that is `ns_pid` in PID namespace `ns`, or None
        once it is gone."""
        for pid, status in proc_files("status"):
            for line in status.decode(errors="replace").splitlines():
                if line.startswith("NSpid:") and line.split()[-1] == str(ns_pid):
                    try:
                        if os.readlink(f"/proc/{pid}/ns/pid") == ns:
                            return pid
                    except OSError:
                        pass
        return None

    def test_an_index_without_a_node_count_exits_2_naming_the_variable(self):
        """An Indexed Job whose manifest forgot PET_NNODES: refused before anything starts."""
        names = ["train-0", "train-1"]
        with Pods(names, "train") as pods:
            variables = indexed_job(pods, 1)
            del variables["PET_NNODES"]
            code, err = self.finish(self.pod(pods, names[1], variables, [PROBE, self.dir]))
            self.assertEqual(code, 2, err)
            self.assertIn("JOB_COMPLETION_INDEX=1 gives this pod's node rank but not the job's "
                          "node count: set PET_NNODES in the pod's environment", err)
            self.assertEqual(probe_events(self.dir), [])

    def test_a_replaced_pod_rejoins_the_running_job(self):
        """Pod 1 deleted (SIGTERM, as the kubelet sends) and its controller's new pod, same name
        and a new address, rejoins the job that pod 0's crun hosts: the next round runs on it."""
        names = ["train-0", "train-1"]
        with Pods(names, "train") as pods:
            def variables(i):
                return {"JOB_COMPLETION_INDEX": str(i), "PET_NNODES": "2",
                        "PET_NPROC_PER_NODE": "2", "PET_MAX_RESTARTS": "3",
                        "PET_RDZV_ENDPOINT": f"{pods.fqdn(names[0])}:{PORT}"}
            probe = [PROBE, self.dir, "--connect-master", "--until", "done"]
            first = self.pod(pods, names[0], variables(0), probe)
            old = self.pod(pods, names[1], variables(1), probe)
            wait_for(lambda: len(probe_events(self.dir)) == 4, "the first round's 4 workers")
            old_addr = pods.addr(names[1])
            old.send_signal(signal.SIGTERM)
            code, err = self.finish(old)
            self.assertEqual(code, 143, err)
            pods.replace(names[1])
            self.assertNotEqual(pods.addr(names[1]), old_addr)
            new = self.pod(pods, names[1], variables(1), probe)
            wait_for(lambda: len(probe_events(self.dir)) == 8, "the next round's 4 workers")
            open(os.path.join(self.dir, "done"), "w").close()
            for p in (first, new):
                code, err = self.finish(p)
                self.assertEqual(code, 0, err)
            ev = probe_events(self.dir)
            first_round, later = ev[:4], ev[4:]
            # A new round on both pods (new workers), a membership change that spends no
            # restart (torchrun's rule too).
            self.assertFalse({e["pid"] for e in first_round} & {e["pid"] for e in later}, ev)
            self.assertEqual({e["TORCHELASTIC_RESTART_COUNT"] for e in later}, {"0"}, later)
            self.assertEqual(sorted(int(e["RANK"]) for e in later), [0, 1, 2, 3], later)
            self.assertNotIn(old_addr, {e["connected_from"] for e in later})
            for e in later:
                self.assertEqual(e["connected_from"], pods.addr(e["host"]), e)
                self.assertEqual(int(e["GROUP_RANK"]), names.index(e["host"]), e)


if __name__ == "__main__":
    unittest.main(verbosity=2)
