"""Several "hosts" on one machine: network namespaces joined by veth pairs to a bridge that
lives in a namespace of its own (the switch). Each host gets eth0 with 10.77.0.(index+1)/24 and
its own loopback; nothing is routed anywhere else. Needs root (CAP_NET_ADMIN) and iproute2.

    with Fabric(["a", "b"]) as fab:
        fab.popen("a", [...])          # runs inside host a's namespace
        fab.link_down("b")             # b's cable pulled: its packets vanish, no reset is sent
        fab.link_up("b")               # and plugged back in
"""
import itertools
import os
import subprocess

import bench_support

SUBNET = "10.77.0"
_built = itertools.count()  # this process's fabrics, each its own names


def _ip(*args):
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


class Fabric:
    def __init__(self, hosts):
        self.hosts = list(hosts)
        # crunPID-N-HOST: the Nth fabric of process PID, so that tests running at once in one
        # process (tests/pylib/lanes.py) each build their own (bench_support.sweep_stale_netns
        # reads the PID).
        self.tag = f"crun{os.getpid()}-{next(_built)}"
        self.switch = f"{self.tag}-sw"
        self.created = []
        self.moved = {}  # host -> its address once replug() gave it a new one

    def ns(self, host):
        return f"{self.tag}-{host}"

    def addr(self, host):
        return self.moved.get(host, f"{SUBNET}.{self.hosts.index(host) + 1}")

    def port_name(self, host):
        return f"p{self.hosts.index(host)}"  # the host's cable end on the switch

    def __enter__(self):
        # Hosts a Fabric of a killed test left behind (ctest's TIMEOUT kills outright, and no
        # cleanup runs) go first: their processes are gone, their names are this module's.
        bench_support.sweep_stale_netns(prefix="crun")
        try:
            self._build()
        except Exception:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _add_ns(self, name):
        _ip("netns", "add", name)
        self.created.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _build(self):
        self._add_ns(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for host in self.hosts:
            self._plug(host)

    def _plug(self, host):
        ns = self.ns(host)
        self._add_ns(ns)
        port = self.port_name(host)
        _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
            "netns", ns)
        _ip("-n", self.switch, "link", "set", port, "master", "br0")
        _ip("-n", self.switch, "link", "set", port, "up")
        _ip("-n", ns, "addr", "add", f"{self.addr(host)}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")

    def replug(self, host, index):
        """`host` comes back as a new machine with the same name and address SUBNET.index: its
        namespace is made anew (a pod that its controller replaced). Every process of the old
        one must have exited: the old namespace, and its cable, go with the last of them."""
        ns = self.ns(host)
        _ip("-n", self.switch, "link", "del", self.port_name(host))  # both ends of the cable
        _ip("netns", "del", ns)
        self.created.remove(ns)
        self.moved[host] = f"{SUBNET}.{index}"
        self._plug(host)

    def close(self):
        for name in reversed(self.created):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.created = []

    def command(self, host, cmd):
        """`cmd` run inside `host`'s namespace (ip netns exec execs it: same pid)."""
        return ["ip", "netns", "exec", self.ns(host), *cmd]

    def popen(self, host, cmd, **kwargs):
        return subprocess.Popen(self.command(host, cmd), **kwargs)

    def link_down(self, host):
        """Pulls `host`'s cable at the switch: from then on its packets and the packets sent to
        it are dropped silently, as when a host freezes or its switch port dies."""
        _ip("-n", self.switch, "link", "set", self.port_name(host), "down")

    def link_up(self, host):
        """Plugs `host`'s cable back in (the partition heals)."""
        _ip("-n", self.switch, "link", "set", self.port_name(host), "up")
