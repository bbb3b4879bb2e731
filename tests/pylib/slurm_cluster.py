"""A real Slurm cluster on one machine, for tests: munged, slurmctld and one slurmd per node,
each node a network namespace of its own (tests/pylib/fabric.py) with its own address, host
name and /etc/hosts. Debian 12's slurm-wlm (22.05) and munge, configured from scratch in a
temporary directory: nothing of the machine's own /etc/slurm or /etc/munge is read or touched.

    with SlurmCluster(["node1", "node2"]) as c:
        job = c.sbatch(script_text)          # submitted from the controller's host
        c.wait_job(job)                      # until it has ended
        c.job_field(job, "ExitCode")         # as `scontrol show job` reports it

Needs root (namespaces, mounts, slurmd). When the cluster cannot be built, ClusterError says
which step failed and why; callers must fail on it, not skip.
"""
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

from fabric import Fabric

CONTROLLER = "ctl"
PROGRAMS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel",
            "sinfo")


class ClusterError(RuntimeError):
    pass


def _which(prog):
    """The program's path: on PATH, or in /usr/sbin (not on a non-root PATH); None if neither."""
    path = shutil.which(prog) or os.path.join("/usr/sbin", prog)
    return path if os.access(path, os.X_OK) else None


def missing_programs():
    return [p for p in PROGRAMS if _which(p) is None]


class SlurmCluster:
    def __init__(self, nodes, cpus_per_node=4, kill_wait_s=30):
        self.nodes = list(nodes)
        self.cpus = cpus_per_node
        self.kill_wait_s = kill_wait_s
        self.fabric = Fabric([CONTROLLER, *self.nodes])
        self.dir = None
        self.daemons = {}  # name -> Popen

    # --- paths -------------------------------------------------------------------------------
    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    @property
    def conf(self):
        return self.path("slurm.conf")

    def env(self, **extra):
        """The environment for Slurm's client commands: our slurm.conf, no SLURM_* from outside."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
        env["SLURM_CONF"] = self.conf
        env.update(extra)
        return env

    # --- building ----------------------------------------------------------------------------
    def __enter__(self):
        missing = missing_programs()
        if missing:
            raise ClusterError("Slurm/munge programs missing: " + ", ".join(missing) +
                               " (apt-get install slurmctld slurmd slurm-client munge)")
        if os.geteuid() != 0:
            raise ClusterError("a Slurm cluster in network namespaces needs root")
        self.dir = tempfile.mkdtemp(prefix="crun-slurm-")
        os.chmod(self.dir, 0o755)  # job steps read the scripts and write their output here
        try:
            self.fabric.__enter__()
            self._write_files()
            self._start_munge()
            self._start_controller()
            for node in self.nodes:
                self._start_slurmd(node)
            self._wait_nodes_idle()
        except BaseException as e:
            log = self._logs_tail()
            self.close()
            if isinstance(e, ClusterError):
                raise ClusterError(f"{e}\n{log}") from None
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _write_files(self):
        for d in ("munge", "state", "log", "jobs", *(f"spool/{n}" for n in self.nodes)):
            os.makedirs(self.path(d), exist_ok=True)
        os.chmod(self.path("munge"), 0o711)
        os.chmod(self.path("jobs"), 0o777)
        hosts = ["127.0.0.1 localhost"]
        hosts += [f"{self.fabric.addr(h)} {h}" for h in self.fabric.hosts]
        with open(self.path("hosts"), "w") as f:
            f.write("\n".join(hosts) + "\n")
        node_lines = [f"NodeName={n} NodeAddr={self.fabric.addr(n)} NodeHostname={n} "
                      f"CPUs={self.cpus} RealMemory=1000 State=UNKNOWN" for n in self.nodes]
        conf = f"""\
ClusterName=crun-test
SlurmctldHost={CONTROLLER}({self.fabric.addr(CONTROLLER)})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.path("munge", "munge.socket")}
StateSaveLocation={self.path("state")}
SlurmdSpoolDir={self.path("spool", "%n")}
SlurmctldPidFile={self.path("slurmctld.pid")}
SlurmdPidFile={self.path("slurmd-%n.pid")}
SlurmctldLogFile={self.path("log", "slurmctld.log")}
SlurmdLogFile={self.path("log", "slurmd-%n.log")}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SlurmdParameters=config_overrides
ReturnToService=2
KillWait={self.kill_wait_s}
MinJobAge=600
MessageTimeout=10
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
{chr(10).join(node_lines)}
PartitionName=test Nodes={",".join(self.nodes)} Default=YES MaxTime=INFINITE State=UP
"""
        with open(self.conf, "w") as f:
            f.write(conf)

    def _in_host(self, host, cmd):
        """`cmd` in `host`'s network namespace, with the host's own name (UTS) and /etc/hosts
        (a private mount namespace)."""
        script = ('mount --make-rprivate / && mount --bind "$0" /etc/hosts && hostname "$1" '
                  '&& shift && exec "$@"')
        # nsenter rather than `ip netns exec`, which would mount a fresh /sys without the
        # cgroup file systems slurmd insists on finding.
        return ["nsenter", f"--net=/run/netns/{self.fabric.ns(host)}", "unshare", "--uts",
                "--mount", "--propagation", "private", "sh", "-c", script, self.path("hosts"),
                host, *cmd]

    def _daemon(self, name, cmd):
        log = open(self.path("log", f"{name}.out"), "w")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env(),
                             start_new_session=True)
        log.close()
        self.daemons[name] = p
        return p

    def _run(self, cmd, what, host=CONTROLLER, timeout=60, env=None):
        r = subprocess.run(self.fabric.command(host, cmd), capture_output=True, text=True,
                           env=env or self.env(), timeout=timeout)
        if r.returncode != 0:
            raise ClusterError(f"{what}: {' '.join(cmd)} exited {r.returncode}: "
                               f"{(r.stderr or r.stdout).strip()}")
        return r.stdout

    def _start_munge(self):
        key = self.path("munge", "munge.key")
        r = subprocess.run([_which("mungekey"), "--create", "--keyfile", key], capture_output=True,
                           text=True)
        if r.returncode != 0:
            raise ClusterError(f"mungekey: {r.stderr.strip()}")
        os.chmod(key, 0o400)
        p = self._daemon("munged", [
            _which("munged"), "--foreground", "--force",
            "--socket", self.path("munge", "munge.socket"), "--key-file", key,
            "--pid-file", self.path("munge", "munged.pid"),
            "--seed-file", self.path("munge", "munged.seed"),
            "--log-file", self.path("log", "munged.log")])
        self._wait(lambda: os.path.exists(self.path("munge", "munge.socket")), p, "munged's socket")

    def _start_controller(self):
        p = self._daemon("slurmctld", self._in_host(CONTROLLER, [
            _which("slurmctld"), "-D", "-i", "-f", self.conf]))
        self._wait(lambda: self._quiet_ok(["scontrol", "ping"], "UP"), p, "slurmctld to answer")

    def _start_slurmd(self, node):
        self._daemon(f"slurmd-{node}", self._in_host(node, [
            _which("slurmd"), "-D", "-N", node, "-f", self.conf]))

    def _quiet_ok(self, cmd, needle):
        try:
            return needle in self._run(cmd, "")
        except ClusterError:
            return False

    def _wait(self, ready, proc, what, limit=60):
        deadline = time.monotonic() + limit
        while not ready():
            if proc is not None and proc.poll() is not None:
                raise ClusterError(f"waiting for {what}: the daemon exited {proc.returncode}")
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out after {limit} s waiting for {what}")
            time.sleep(0.05)

    def node_states(self):
        out = self._run(["sinfo", "--noheader", "-N", "-o", "%N %T"], "sinfo")
        return dict(line.split() for line in out.splitlines() if line.strip())

    def _wait_nodes_idle(self):
        def idle():
            for name, p in self.daemons.items():
                if p.poll() is not None:
                    raise ClusterError(f"{name} exited {p.returncode}")
            states = self.node_states()
            return all(states.get(n, "").startswith("idle") for n in self.nodes)
        self._wait(idle, None, f"nodes {','.join(self.nodes)} to be idle")

    def _logs_tail(self):
        if not self.dir or not os.path.isdir(self.path("log")):
            return ""
        parts = []
        for name in sorted(os.listdir(self.path("log"))):
            with open(self.path("log", name), errors="replace") as f:
                tail = f.read()[-1500:]
            if tail.strip():
                parts.append(f"--- {name} ---\n{tail}")
        return "\n".join(parts)

    # --- jobs --------------------------------------------------------------------------------
    def sbatch(self, script, *args, env=None):
        """Submits `script` (its text) from the controller's host, with the environment of this
        process plus `env` (sbatch passes it on to the job); returns the job id."""
        path = self.path("jobs", f"job{len(os.listdir(self.path('jobs')))}.sh")
        with open(path, "w") as f:
            f.write(script)
        out = self._run(["sbatch", "--parsable", "--chdir", self.path("jobs"), *args, path],
                        "sbatch", env=self.env(**(env or {})))
        return out.strip().split(";")[0]

    def job_fields(self, job):
        out = self._run(["scontrol", "show", "job", "-o", job], f"scontrol show job {job}")
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def job_field(self, job, field):
        return self.job_fields(job)[field]

    def wait_job(self, job, limit=300, states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                               "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")):
        """Polls `scontrol show job` until the job is in one of `states`; returns its fields."""
        deadline = time.monotonic() + limit
        while True:
            fields = self.job_fields(job)
            if fields.get("JobState") in states:
                return fields
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job} still {fields.get('JobState')} after {limit} s:"
                                     f"\n{self._logs_tail()}")
            time.sleep(0.1)

    def scancel(self, job, *args):
        self._run(["scancel", *args, job], f"scancel {job}")

    def end_job_at(self, job, when):
        """Moves running job `job`'s end to `when` (a Slurm time: "now+5"), to the second, as
        an operator shortens a job (`scontrol update JobId=J EndTime=...`; 22.05 takes it for
        a running job, src/slurmctld/job_mgr.c's _update_job). slurmctld then ends it as at its
        time limit (TIMEOUT) at its first time-limit check after `when`."""
        self._run(["scontrol", "update", f"JobId={job}", f"EndTime={when}"],
                  f"scontrol update JobId={job} EndTime={when}")

    def host_pids(self, host):
        """The processes living in `host`'s network namespace."""
        r = subprocess.run(["ip", "netns", "pids", self.fabric.ns(host)], capture_output=True,
                           text=True)
        return [int(x) for x in r.stdout.split()]

    # --- teardown ----------------------------------------------------------------------------
    def close(self):
        # SIGKILL: nothing of the cluster is read again (its directory goes below), and
        # slurmctld's orderly exit (its state saved, up to 3 s for its agents) took a second or
        # two of every suite's end.
        for p in self.daemons.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.daemons.values():
            p.wait(timeout=15)
        # Anything still living in the hosts' namespaces (job steps the daemons left) goes too.
        if self.fabric.created:
            for host in self.fabric.hosts:
                for pid in self.host_pids(host):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        self.daemons = {}
        self.fabric.close()
        if self.dir and os.environ.get("CRUN_KEEP_SLURM_DIR") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)
