"""A real etcd cluster (Debian's etcd-server) for tests: one member per fabric host
(tests/pylib/fabric.py), each in that host's network namespace on its address, clients on port
2379 and peers on 2380. Members can be SIGKILLed and started again on their data.

    with Fabric(["a", "b", "c"]) as fab, EtcdCluster(fab, ["a", "b", "c"], tmp) as etcd:
        etcd.endpoints()        # "10.77.0.1:2379,10.77.0.2:2379,10.77.0.3:2379"
        etcd.kill("b"); etcd.start("b")
        etcd.etcdctl("get", "--prefix", "/crun/")
"""
import os
import shutil
import signal
import subprocess
import time

CLIENT_PORT = 2379
PEER_PORT = 2380


class Loopback:
    """Stands in for a Fabric when every member runs here, on loopback (give EtcdCluster
    distinct ports)."""
    def addr(self, host):
        return "127.0.0.1"

    def command(self, host, cmd):
        return list(cmd)

    def popen(self, host, cmd, **kwargs):
        return subprocess.Popen(cmd, **kwargs)


def missing_programs():
    return [p for p in ("etcd", "etcdctl") if shutil.which(p) is None]


class EtcdCluster:
    def __init__(self, fab, hosts, root, tls=None, ports=None):
        """tls: None, or a dict of PEM paths for the client port: ca, cert and key (the
        members', naming every member's address), client_cert and client_key (etcdctl's: with
        a CA, etcd requires client certificates)."""
        self.fab = fab
        self.hosts = list(hosts)
        # host -> (client port, peer port): distinct when members share an address (Loopback)
        self.ports = ports or {h: (CLIENT_PORT, PEER_PORT) for h in self.hosts}
        self.root = root
        self.tls = tls
        self.procs = {}
        self.logs = {}

    def scheme(self):
        return "https" if self.tls else "http"

    def endpoint(self, host):
        return f"{self.fab.addr(host)}:{self.ports[host][0]}"

    def endpoints(self, hosts=None):
        return ",".join(self.endpoint(h) for h in (hosts or self.hosts))

    def __enter__(self):
        os.makedirs(self.root, exist_ok=True)
        try:
            for h in self.hosts:
                self.start(h, initial=True)
            self.wait_healthy(self.hosts)
        except Exception:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def start(self, host, initial=False):
        addr = self.fab.addr(host)
        cluster = ",".join(f"{h}=http://{self.fab.addr(h)}:{self.ports[h][1]}"
                           for h in self.hosts)
        client = f"{self.scheme()}://{addr}:{self.ports[host][0]}"
        args = ["etcd", f"--name={host}", f"--data-dir={os.path.join(self.root, host)}",
                f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
                f"--listen-peer-urls=http://{addr}:{self.ports[host][1]}",
                f"--initial-advertise-peer-urls=http://{addr}:{self.ports[host][1]}",
                f"--initial-cluster={cluster}", "--initial-cluster-token=crun-test",
                "--heartbeat-interval=100", "--election-timeout=1000",
                "--logger=zap", "--log-level=warn"]
        if self.tls:
            args += [f"--trusted-ca-file={self.tls['ca']}", f"--cert-file={self.tls['cert']}",
                     f"--key-file={self.tls['key']}"]
        if initial:
            args.append("--initial-cluster-state=new")
        if host in self.logs:
            self.logs[host].close()
        log = open(os.path.join(self.root, f"{host}.log"), "ab")
        self.logs[host] = log
        self.procs[host] = self.fab.popen(host, args, stdout=log, stderr=log,
                                          start_new_session=True)

    def kill(self, host):
        p = self.procs.pop(host, None)
        if p is None:
            return
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it had ended already (etcd that could not start): reaped below
        p.wait(timeout=30)

    def stop(self, host):
        """SIGTERM (etcd shuts down cleanly), then SIGKILL after 10 s."""
        p = self.procs.pop(host, None)
        if p is None:
            return
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)

    def running(self):
        return [h for h, p in self.procs.items() if p.poll() is None]

    def etcdctl(self, *args, hosts=None, timeout=30, user=None):
        """etcdctl run in the first host's namespace against `hosts` (default: all); `user`:
        "name:password" once etcd's auth is on."""
        env = dict(os.environ, ETCDCTL_API="3")
        cmd = ["etcdctl", f"--endpoints={self.endpoints(hosts)}", "--command-timeout=5s"]
        if user:
            cmd.append(f"--user={user}")
        if self.tls:
            cmd += [f"--cacert={self.tls['ca']}", f"--cert={self.tls['client_cert']}",
                    f"--key={self.tls['client_key']}"]
        r = subprocess.run(self.fab.command(self.hosts[0], [*cmd, *args]), capture_output=True,
                           text=True, timeout=timeout, env=env)
        return r

    def wait_healthy(self, hosts, limit=60):
        deadline = time.monotonic() + limit
        while True:
            r = self.etcdctl("endpoint", "health", hosts=hosts)
            if r.returncode == 0:
                return
            dead = [h for h in hosts if h in self.procs and self.procs[h].poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"etcd members {hosts} not healthy (dead: {dead}): "
                                   f"{r.stderr.strip()[-500:]}\n" + self.logs_tail())
            time.sleep(0.1)

    def logs_tail(self):
        out = []
        for h in self.hosts:
            path = os.path.join(self.root, f"{h}.log")
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    out.append(f"--- etcd {h} ---\n" + "".join(f.readlines()[-10:]))
        return "\n".join(out)

    def close(self):
        for h in list(self.procs):
            self.kill(h)
        for log in self.logs.values():
            log.close()
        self.logs = {}
