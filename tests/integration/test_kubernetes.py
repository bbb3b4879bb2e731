"""crun as the command of Kubernetes pods, without a cluster (docs/kubernetes.md): each pod is a
network namespace with its own address and host name, and a resolver for the headless
Service's names (tests/pylib/pods.py). Each pod's environment is exactly what its controller
sets (the table in docs/kubernetes.md, from the controllers' source), and the container's
command is `crun probe.py ...` with no flags. Covered: each controller's variables forming a
job of two pods, two pods that claim one index, an index without a node count, a pod that its
controller replaced (same name, new address) rejoining the running job, a job deleted within
the default grace period, and crun as PID 1 of the pod's PID namespace. Needs root, as CI runs
it. The manifests' jobs (train and DDP on both cores) run first, alone; then the other tests
three at a time (tests/pylib/lanes.py), each on pods of its own: they mostly wait (the deleted
job's 14 s of grace, etcd's leases, refusals)."""
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest
import urllib.parse

import yaml

CRUN = os.environ["CRUN_BIN"]
HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "..", "workers", "node_probe.py")
DDP = os.path.join(HERE, "..", "workers", "ddp_train.py")
DOC = os.path.join(HERE, "..", "..", "docs", "kubernetes.md")
TRAIN = os.environ.get("TRAIN_BIN", "")
TORCH_PYTHONS = [p for p in os.environ.get("TORCH_PYTHONS", sys.executable).split(",") if p]
PORT = 29400
TRAINER_PORT = 29500  # the torch plugin's PET_MASTER_PORT
LIMIT_S = 120
TRAIN_LIMIT_S = 400  # a manifest's train or DDP run, on this machine's two cores
GRACE_S = 30  # a pod's terminationGracePeriodSeconds unless it sets one
# etcd's leases of 2 s, for a lost pod to be noticed fast (test_etcd.py's FAST).
ETCD_FAST = "heartbeat_timeout=2,last_call_timeout=0.2"

sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from crun_testing import (alive, kill_all, probe_events, proc_files, proc_state,  # noqa: E402
                          scratch_dir, wait_for)
from etcd_cluster import EtcdCluster, missing_programs  # noqa: E402
import lanes  # noqa: E402
from pods import Pods  # noqa: E402

# What the kubelet sets in every pod.
KUBELET = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def trainjob(name, i, nnodes, nproc):
    """kubeflow/trainer, the torch plugin: the variables of node i of TrainJob `name` (one
    container a node, pods <name>-node-0-<i> under the Service <name>)."""
    return {"PET_NNODES": str(nnodes), "PET_NPROC_PER_NODE": str(nproc), "PET_NODE_RANK": str(i),
            "JOB_COMPLETION_INDEX": str(i), "PET_MASTER_ADDR": f"{name}-node-0-0.{name}",
            "PET_MASTER_PORT": str(TRAINER_PORT)}


def trainer(pods, i):
    return trainjob("job", i, 2, 2)


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


# ---- docs/kubernetes.md's manifests, as their controllers would run them ---------------------

def doc_manifests():
    """The controllers' objects (a Job, a JobSet, a TrainJob) of the section "The manifests"."""
    with open(DOC) as f:
        text = f.read()
    section = text[text.index("## The manifests"):text.index("## Probes and metrics")]
    objects = [o for block in re.findall(r"```yaml\n(.*?)```", section, re.S)
               for o in yaml.safe_load_all(block) if o]
    return [o for o in objects if o["kind"] != "Service"]


def variables_of(container):
    return {e["name"]: str(e["value"]) for e in container.get("env", [])}


def pods_of(obj):
    """[(pod, Service, environment, container)] that obj's controller makes, with the
    controller's variables (the table of docs/kubernetes.md) and the container's own."""
    kind, name = obj["kind"], obj["metadata"]["name"]
    pods = []
    if kind == "Job":
        spec = obj["spec"]
        assert spec["completionMode"] == "Indexed", obj
        pod = spec["template"]["spec"]
        for i in range(spec["completions"]):
            c = pod["containers"][0]
            pods.append((f"{name}-{i}", pod["subdomain"],
                         {"JOB_COMPLETION_INDEX": str(i), **variables_of(c)}, c))
    elif kind == "JobSet":
        subdomain = obj["spec"].get("network", {}).get("subdomain", name)
        for rj in obj["spec"]["replicatedJobs"]:
            job = rj["template"]["spec"]
            c = job["template"]["spec"]["containers"][0]
            for j in range(rj.get("replicas", 1)):
                for i in range(job["completions"]):
                    pods.append((f"{name}-{rj['name']}-{j}-{i}", subdomain,
                                 {"JOB_COMPLETION_INDEX": str(i), **variables_of(c)}, c))
    elif kind == "TrainJob":
        t = obj["spec"]["trainer"]
        c = {"command": t["command"], "args": t.get("args", []), "env": t.get("env", [])}
        for i in range(t["numNodes"]):
            pods.append((f"{name}-node-0-{i}", name,
                         {**trainjob(name, i, t["numNodes"], t.get("numProcPerNode", "auto")),
                          **variables_of(c)}, c))
    else:
        raise AssertionError(f"no controller for kind {kind}")
    return pods


def probe_port(container):
    """The livenessProbe's httpGet (path, port number), the port resolved by its name."""
    get = container["livenessProbe"]["httpGet"]
    port = get["port"]
    if isinstance(port, str):
        port = next(p["containerPort"] for p in container["ports"] if p.get("name") == port)
    return get["path"], port


def http_get(pods, host, url):
    """(status, body) of a GET of `url` from `host`'s namespace, or None when nothing answers
    (as the kubelet's probe, which runs on the node, reaches the pod's address)."""
    code = ("import sys, urllib.request\n"
            "try:\n"
            "    with urllib.request.urlopen(sys.argv[1], timeout=5) as r:\n"
            "        sys.stdout.write(str(r.status) + '\\n' + r.read().decode())\n"
            "except OSError:\n"
            "    sys.exit(3)\n")
    r = subprocess.run(pods.command(host, [sys.executable, "-c", code, url]),
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return None
    status, _, body = r.stdout.partition("\n")
    return int(status), body


class PrometheusClient:
    def __init__(self, pods, host, url):
        self.pods, self.host, self.url = pods, host, url

    def ready(self):
        got = http_get(self.pods, self.host, self.url + "/-/ready")
        return got is not None and got[0] == 200

    def targets(self):
        got = http_get(self.pods, self.host, self.url + "/api/v1/targets")
        return got[1] if got else "(Prometheus did not answer)"

    def active_targets(self):
        got = http_get(self.pods, self.host, self.url + "/api/v1/targets?state=active")
        return json.loads(got[1])["data"]["activeTargets"] if got and got[0] == 200 else []

    def query(self, q):
        got = http_get(self.pods, self.host,
                       self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": q}))
        assert got is not None and got[0] == 200, got
        body = json.loads(got[1])
        assert body["status"] == "success", body
        return body["data"]["result"]


class Kubernetes(unittest.TestCase):
    def setUp(self):
        self.dir = scratch_dir(self, "crun-kubernetes-")
        self.procs = []
        self.pid1s = []  # crun as PID 1 of a PID namespace: its end ends all in it

    def tearDown(self):
        for pid in self.pid1s:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # After those: killing unshare leaves its namespace running, whose workers would hold
        # the pipes that kill_all reads to their end.
        kill_all(self.procs)

    def pod(self, pods, name, variables, args, new_session=False):
        """The pod's container: `crun <args>` with the kubelet's and the controller's
        variables and none of this test's PET_*. new_session: in a process group of its own,
        which the test may kill at once as a machine's death does."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
        env.update(KUBELET, PYTHON_EXEC=sys.executable, NODE_TAG=name, **variables)
        p = pods.popen(name, [CRUN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, env=env, start_new_session=new_session)
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
        backend, on crun's service and on etcd: the pod that claims node rank 0 second is
        refused, naming both pods, and runs no worker, instead of running a second node 0."""
        names = ["js-workers-0-0", "js-workers-1-0"]
        services = {names[0]: "js", names[1]: "js", "etcd-0": "etcd"}
        for backend in ("static", "service", "etcd"):
            with self.subTest(backend=backend), Pods([*names, "etcd-0"], services) as pods, \
                    self.etcd(pods, ["etcd-0"] if backend == "etcd" else []):
                out = tempfile.mkdtemp(dir=self.dir)
                variables = {"JOB_COMPLETION_INDEX": "0", "PET_NNODES": "2",
                             "PET_NPROC_PER_NODE": "1", "PET_RDZV_CONF": "join_timeout=60"}
                if backend == "static":
                    variables.update(PET_MASTER_ADDR=pods.fqdn(names[0]),
                                     PET_MASTER_PORT=str(PORT))
                elif backend == "service":
                    variables["PET_RDZV_ENDPOINT"] = f"{pods.fqdn(names[0])}:{PORT}"
                else:
                    variables.update(PET_RDZV_BACKEND="etcd-v3", PET_RDZV_ID="job",
                                     PET_RDZV_ENDPOINT=f"{pods.fqdn('etcd-0')}:2379")
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

    @contextlib.contextmanager
    def etcd(self, pods, members):
        """An etcd cluster of `members` (pods of their own), or nothing when there are none."""
        if not members:
            yield None
            return
        missing = missing_programs()
        if missing:
            self.fail(f"{', '.join(missing)} not found: install etcd-server and etcd-client "
                      "(scripts/install-deps.sh)")
        with EtcdCluster(pods, members, tempfile.mkdtemp(dir=self.dir)) as cluster:
            yield cluster

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
            self.pid1s.remove(pid1)  # gone with its namespace: the pid may be another's now
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
            # unshare's child that is crun (the pod's `sh` runs `hostname` first, whose
            # process is another child of the same pid for a moment)
            for pid, stat in proc_files("stat"):
                comm, fields = stat.rsplit(b")", 1)
                if int(fields.split()[1]) == p.pid and comm.endswith(b"(crun"):
                    return pid
            return None
        wait_for(lambda: child() is not None, "crun started by unshare")
        pid1 = child()
        self.pid1s.append(pid1)
        return p, pid1

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


    def test_pod_0_lost_on_etcd_the_job_goes_on_and_its_replacement_rejoins(self):
        """An Indexed Job on etcd (a StatefulSet of 3 members under the Service "etcd"), with
        PET_NNODES=1:2: pod 0's machine dies (its cable pulled, its crun and workers killed at
        once, no word to anyone). Its etcd lease ends; pod 1 goes on alone in a round of one
        node, and the controller's new pod 0 (same name, new address) rejoins it: the last
        round runs on both again. No restart is spent: each change is of membership."""
        names = ["train-0", "train-1"]
        members = ["etcd-0", "etcd-1", "etcd-2"]
        services = {**{n: "train" for n in names}, **{m: "etcd" for m in members}}
        with Pods([*names, *members], services) as pods, self.etcd(pods, members):
            endpoints = ",".join(f"{pods.fqdn(m)}:2379" for m in members)

            def variables(i):
                return {"JOB_COMPLETION_INDEX": str(i), "PET_NNODES": "1:2",
                        "PET_NPROC_PER_NODE": "2", "PET_MAX_RESTARTS": "3",
                        "PET_RDZV_BACKEND": "etcd-v3", "PET_RDZV_ENDPOINT": endpoints,
                        "PET_RDZV_ID": "job", "PET_RDZV_CONF": ETCD_FAST}
            probe = [PROBE, self.dir, "--connect-master", "--until", "done"]
            nodes = [self.pod(pods, name, variables(i), probe, new_session=True)
                     for i, name in enumerate(names)]

            def rounds(world):
                return [e for e in probe_events(self.dir) if e["WORLD_SIZE"] == str(world)]
            wait_for(lambda: len(rounds(4)) == 4, "the first round's 4 workers", limit=LIMIT_S)
            old_addr = pods.addr(names[0])
            pods.link_down(names[0])
            workers = [e["pid"] for e in rounds(4) if e["host"] == names[0]]
            os.killpg(nodes[0].pid, signal.SIGKILL)
            for pid in workers:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            nodes[0].communicate(timeout=LIMIT_S)
            wait_for(lambda: len(rounds(2)) == 2, "pod 1 going on alone", limit=LIMIT_S)
            self.assertEqual({e["host"] for e in rounds(2)}, {names[1]})
            wait_for(lambda: not any(alive(pid) for pid in workers), "pod 0's workers gone")
            pods.replace(names[0])
            self.assertNotEqual(pods.addr(names[0]), old_addr)
            replacement = self.pod(pods, names[0], variables(0), probe, new_session=True)
            wait_for(lambda: len(rounds(4)) == 8, "the last round's 4 workers", limit=LIMIT_S)
            open(os.path.join(self.dir, "done"), "w").close()
            errs = {}
            for name, p in ((names[0], replacement), (names[1], nodes[1])):
                code, errs[name] = self.finish(p)
                self.assertEqual(code, 0, errs[name])
            self.assertRegex(errs[names[1]], r"its etcd lease ended")
            last = rounds(4)[4:]
            self.assertEqual(sorted(int(e["RANK"]) for e in last), [0, 1, 2, 3], last)
            for e in last:
                self.assertEqual(e["connected_from"], pods.addr(e["host"]), e)
                self.assertEqual(int(e["GROUP_RANK"]), names.index(e["host"]), e)
            self.assertNotIn(old_addr, {e["connected_from"] for e in last})
            self.assertEqual({e["TORCHELASTIC_RESTART_COUNT"] for e in probe_events(self.dir)},
                             {"0"})

    # ---- docs/kubernetes.md's manifests -----------------------------------------------------

    @lanes.alone  # train and DDP take both cores: beside them, etcd's 2 s leases could lapse
    def test_the_manifests_of_docs_kubernetes_md_run_as_written(self):
        """Each manifest's pods, as its controller makes them, run the container's command:
        train to the end with identical parameters on every rank, the stock DDP script with
        each PyTorch here. For the manifest with probes and scrape annotations, the kubelet's
        liveness probe is answered and a real Prometheus, with the docs' relabelling on the
        labels Kubernetes' service discovery would give each pod, scrapes every pod's crun."""
        self.assertTrue(TRAIN, "TRAIN_BIN is not set (train is not built)")
        objects = doc_manifests()
        self.assertEqual(sorted(o["kind"] for o in objects), ["Job", "JobSet", "TrainJob"])
        for obj in objects:
            # What the API server would refuse: exit codes listed out of order or twice, or 0
            # with In (batch/v1 PodFailurePolicyOnExitCodesRequirement).
            for rule in obj["spec"].get("podFailurePolicy", {}).get("rules", []):
                if "onExitCodes" in rule:
                    values = rule["onExitCodes"]["values"]
                    self.assertEqual(values, sorted(set(values)), rule)
                    self.assertNotIn(0, values, rule)
        probed = 0
        for obj in objects:
            command = pods_of(obj)[0][3]["command"]
            script = "train.py" in command
            for python in (TORCH_PYTHONS if script else TORCH_PYTHONS[:1]):
                with self.subTest(kind=obj["kind"], python=python):
                    outputs, seen = self.run_manifest(obj, python)
                    text = "".join(outputs.values())
                    if script:
                        # Two workers' lines may interleave (each print is two writes).
                        done = re.findall(r"rank (\d)/4 \(torch [^)]+\) done, params\[:3\] = "
                                          r"(\[[^]]*\])", text)
                        self.assertEqual(sorted(r for r, _ in done), ["0", "1", "2", "3"], text)
                        self.assertEqual(len({p for _, p in done}), 1, done)
                        losses = [float(x) for x in re.findall(r"epoch \d: loss ([0-9.]+)", text)]
                        self.assertEqual(len(losses), 5, text)
                        self.assertLess(losses[-1], losses[0] / 2, text)  # it learned
                    else:
                        self.assertRegex(text, r"\(4 worker\(s\)\).*parameters identical on all "
                                               r"ranks: yes")
                    probed += seen
        self.assertGreater(probed, 0, "no manifest has a liveness probe")

    def run_manifest(self, obj, python):
        """obj's pods run to their end: {pod: its output}, each pod having exited 0; and how many
        pods answered the kubelet's probe and Prometheus's scrape (those with probes)."""
        specs = pods_of(obj)
        names = [name for name, _, _, _ in specs]
        services = {name: service for name, service, _, _ in specs}
        services["monitor"] = "monitoring"  # the kubelet's and Prometheus's vantage point
        image = self.image(python)
        root = tempfile.mkdtemp(dir=self.dir, prefix=f"{obj['kind']}-")
        annotations = ((obj["spec"].get("template") or {}).get("metadata") or {}).get(
            "annotations", {})
        with Pods([*names, "monitor"], services) as pods:
            prometheus = self.prometheus(pods, names, specs, annotations, root) \
                if annotations else None
            procs, logs = {}, {}
            for name, _, variables, c in specs:
                work = os.path.join(root, name)
                os.makedirs(work)
                shutil.copy(DDP, os.path.join(work, "train.py"))
                env = {"PATH": f"{image}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
                       "HOME": work, "TMPDIR": work, "HOSTNAME": name, **KUBELET, **variables}
                logs[name] = os.path.join(work, "output.log")
                with open(logs[name], "w") as log:
                    p = pods.popen(name, [*c["command"], *c.get("args", [])], stdout=log,
                                   stderr=subprocess.STDOUT, env=env, cwd=work)
                self.procs.append(p)
                procs[name] = p
            seen = 0
            if "livenessProbe" in specs[0][3]:
                path, port = probe_port(specs[0][3])
                self.assertEqual(str(port), annotations["prometheus.io/port"])
                self.assertEqual(path, annotations["prometheus.io/path"])
                for name in names:
                    url = f"http://{pods.addr(name)}:{port}{path}"

                    def answered():
                        if procs[name].poll() is not None:
                            raise AssertionError(f"{name} ended before its probe was answered")
                        got = http_get(pods, "monitor", url)
                        return got is not None and got[0] == 200 and "# TYPE crun_" in got[1]
                    wait_for(answered, f"{name}'s liveness probe at {url}", limit=LIMIT_S)
                    seen += 1
            outputs = {}
            for name, p in procs.items():
                p.wait(timeout=TRAIN_LIMIT_S)
                with open(logs[name]) as f:
                    outputs[name] = f.read()
                self.assertEqual(p.returncode, 0, f"{name}: {outputs[name][-4000:]}")
            if prometheus is not None:
                # Every pod's crun scraped while it ran, through the docs' relabelling.
                up = prometheus.query('max_over_time(up{job="kubernetes-pods"}[10m])')
                self.assertEqual(sorted((r["metric"]["pod"], r["value"][1]) for r in up),
                                 [(n, "1") for n in sorted(names)], prometheus.targets())
                rounds = prometheus.query("max_over_time(crun_agent_rounds_total[10m])")
                self.assertEqual(sorted(r["metric"]["pod"] for r in rounds), sorted(names))
        return outputs, seen

    def image(self, python):
        """The container image's PATH: crun, train, and python3 as `python` (with torch)."""
        d = tempfile.mkdtemp(dir=self.dir, prefix="image-")
        os.symlink(CRUN, os.path.join(d, "crun"))
        os.symlink(TRAIN, os.path.join(d, "train"))
        with open(os.path.join(d, "python3"), "w") as f:
            f.write(f'#!/bin/sh\nexec {python} "$@"\n')  # a venv's python must keep its path
        os.chmod(os.path.join(d, "python3"), 0o755)
        return d

    def prometheus(self, pods, names, specs, annotations, root):
        """Debian's Prometheus in the monitor pod with docs/kubernetes.md's scrape config. Its
        build has no Kubernetes service discovery, so each pod's target group is written out
        with the labels that discovery gives it: one target a container port, the pod's
        annotations as __meta_kubernetes_pod_annotation_<name>, its name and address."""
        if shutil.which("prometheus") is None:
            self.fail("prometheus not found: install Debian's prometheus "
                      "(scripts/install-deps.sh)")
        with open(DOC) as f:
            text = f.read()
        section = text[text.index("## Probes and metrics"):]
        config = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
        job = config["scrape_configs"][0]
        self.assertEqual(job.pop("kubernetes_sd_configs"), [{"role": "pod"}])
        meta = {"__meta_kubernetes_pod_annotation_" + re.sub(r"[^A-Za-z0-9_]", "_", k): str(v)
                for k, v in annotations.items()}
        job["static_configs"] = [
            {"targets": [f"{pods.addr(name)}:{port['containerPort']}"],
             "labels": {**meta, "__meta_kubernetes_pod_name": name,
                        "__meta_kubernetes_pod_ip": pods.addr(name)}}
            for name, _, _, c in specs for port in c["ports"]]
        job["relabel_configs"].append({"source_labels": ["__meta_kubernetes_pod_name"],
                                       "target_label": "pod"})
        config["global"] = {"scrape_interval": "1s", "scrape_timeout": "1s"}
        path = os.path.join(root, "prometheus.yml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        listen = f"{pods.addr('monitor')}:9090"
        log = open(os.path.join(root, "prometheus.log"), "w")
        self.addCleanup(log.close)
        p = pods.popen("monitor", ["prometheus", f"--config.file={path}",
                                   f"--storage.tsdb.path={os.path.join(root, 'tsdb')}",
                                   f"--web.listen-address={listen}"],
                       stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        prometheus = PrometheusClient(pods, "monitor", f"http://{listen}")
        wait_for(lambda: p.poll() is None and prometheus.ready(), "Prometheus ready",
                 limit=LIMIT_S)
        # Its discovery hands the targets over some seconds after the start: one a pod once
        # the relabelling has made each pod's container ports one address.
        wait_for(lambda: len(prometheus.active_targets()) == len(names),
                 f"Prometheus's {len(names)} targets", limit=LIMIT_S)
        return prometheus


if __name__ == "__main__":
    lanes.main(3)
