"""Kubernetes pods without a cluster: each pod is a Fabric host (a network namespace with its own
address) that also has its own host name (a UTS namespace, as the kubelet gives a pod) and an
/etc/netns/<namespace>/hosts that resolves the headless Service's names of every pod, as the
cluster's DNS would: `<pod>.<service>` and `<pod>.<service>.<namespace>.svc.cluster.local`.
`ip netns exec` bind-mounts that file over /etc/hosts for what it runs, and glibc reads it on
every lookup, so a rewrite is what the next lookup sees (a pod replaced with a new address).

    with Pods(["train-0", "train-1"], service="train") as pods:
        pods.popen("train-1", [...], env=...)   # in pod train-1: its address, name, resolver
        pods.replace("train-1")                  # the controller's new pod: same name, new IP

`service` may instead map each pod to its Service: {"etcd-0": "etcd", "train-0": "train"}.
"""
import os
import shutil

from fabric import Fabric

CLUSTER_DOMAIN = "default.svc.cluster.local"


class Pods(Fabric):
    def __init__(self, pods, service):
        super().__init__(pods)
        self.service = service
        self.next_index = len(pods) + 1
        self.etc = []  # the /etc/netns/<ns> directories made here

    def fqdn(self, pod):
        service = self.service if isinstance(self.service, str) else self.service[pod]
        return f"{pod}.{service}"

    def __enter__(self):
        super().__enter__()
        try:
            for pod in self.hosts:
                d = f"/etc/netns/{self.ns(pod)}"
                os.makedirs(d)
                self.etc.append(d)
            self.write_hosts()
        except Exception:
            self.close()
            raise
        return self

    def write_hosts(self):
        """Every pod's resolver, from the pods' addresses now. Rewritten in place (the bind
        mount holds the file, not its name), in one write."""
        lines = ["127.0.0.1 localhost", "::1 localhost"]
        for pod in self.hosts:
            # The bare name too: a PyTorchJob gives each pod a Service of its own by that name.
            lines.append(f"{self.addr(pod)} {self.fqdn(pod)} {self.fqdn(pod)}.{CLUSTER_DOMAIN} "
                         f"{pod}")
        text = ("\n".join(lines) + "\n").encode()
        for pod in self.hosts:
            path = f"/etc/netns/{self.ns(pod)}/hosts"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, text)
            finally:
                os.close(fd)

    def command(self, pod, cmd):
        """`cmd` in `pod`: its network namespace and resolver, and its host name (the pod's)."""
        return ["ip", "netns", "exec", self.ns(pod), "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', pod, *cmd]

    def replace(self, pod):
        """The controller's new pod for `pod`: the same name with a new address, which the
        headless Service's names then resolve to. Every process of the old pod must be gone."""
        self.replug(pod, self.next_index)
        self.next_index += 1
        self.write_hosts()

    def close(self):
        super().close()
        for d in self.etc:
            shutil.rmtree(d, ignore_errors=True)
        self.etc = []
