"""The node's snapshot store (docs/checkpoints.md) with real processes under crun.

- A stock PyTorch DDP job (each PyTorch here) that saves its state with the crun_worker module
  at every step, SIGKILLed in the middle and restarted, ends with exactly the parameters of an
  uninterrupted run.
- The soak: a native SDK worker SIGKILLs itself in the middle of a save, attempt after attempt;
  every restart loads the newest step every rank committed, byte for byte.
- A tmpfs too small for a snapshot: the save is refused naming the size and the limit, and the
  tmpfs is empty afterwards. crun SIGKILLed: its snapshot memory is freed with its workers.
- Bad options are refused naming the value; with --snapshots off the module says so.
- Copies to a peer: a spare loads a lost node's ranks from the copies on another node, with a
  job token, and over TLS (mutual, or the CA alone with the token), where strangers in
  plaintext, without a certificate or without the token are refused.
- On disk (--checkpoint-dir): a fresh crun resumes from the newest step every rank has there,
  saying so; --resume-from-disk off starts over; K steps are kept; a corrupted file is refused
  naming the rank and step; crun SIGKILLed again and again in the middle of its writes leaves
  only whole files under their names, and the next crun resumes from them."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

CRUN = os.environ["CRUN_BIN"]
WORKER = os.environ["SNAPSHOT_WORKER"]
HERE = os.path.dirname(os.path.abspath(__file__))
DDP = os.path.join(HERE, "..", "workers", "ddp_snapshot.py")
REPLICA = os.path.join(HERE, "..", "workers", "replica_worker.py")
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from crun_testing import free_port, make_certificates, scratch_dir  # noqa: E402
import lanes  # noqa: E402

PYTHONS = [p for p in os.environ.get("TORCH_PYTHONS", "python3").split(",") if p]


def children_of(pid):
    """Every descendant of `pid`, from /proc."""
    parents = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{p}/stat") as f:
                parents[int(p)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
    out, frontier = [], [pid]
    while frontier:
        nxt = [c for c, par in parents.items() if par in frontier]
        out += nxt
        frontier = nxt
    return out


def used_bytes(path):
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


# A worker that saves 8 MiB twice, says so, and waits to be killed.
HOLD = ("import threading, torch, crun_worker\n"
        "crun_worker.save(1, {'w': torch.ones(2 << 20)})\n"
        "crun_worker.save(2, {'w': torch.ones(2 << 20)})\n"
        "print('saved', flush=True)\n"
        "threading.Event().wait()\n")


class SmallTmpfs:
    """A tmpfs of `size` mounted for one test (root only)."""

    def __init__(self, size):
        self.dir = tempfile.mkdtemp(prefix="crun-snap-tmpfs-")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", self.dir],
                           capture_output=True, text=True)
        self.mounted = r.returncode == 0
        self.why = r.stderr.strip()

    def close(self):
        if self.mounted:
            subprocess.run(["umount", self.dir], check=True)
        os.rmdir(self.dir)


class Snapshots(unittest.TestCase):
    def setUp(self):
        self.dir = scratch_dir(self, "crun-snapshots-")

    def tmpfs(self, size):
        t = SmallTmpfs(size)
        self.addCleanup(t.close)
        if not t.mounted:
            self.skipTest(f"cannot mount a tmpfs here ({t.why})")
        return t.dir

    def run_ddp(self, python, out, steps, kill_at=None, extra=(), into=False):
        """crun with two workers of ddp_snapshot.py; SIGKILLs rank 1 where it holds after
        saving step `kill_at`. Returns (exit code, output)."""
        cmd = [CRUN, "--nproc-per-node", "2", "--max-restarts", "1", *extra, DDP, out, str(steps),
               *([str(kill_at)] if kill_at is not None else [])]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=dict(os.environ, PYTHON_EXEC=python,
                                      DDP_LOAD_INTO="1" if into else "0"))
        lines, killed = [], False
        with p.stdout:
            for line in p.stdout:
                lines.append(line)
                if kill_at is not None and not killed and f"rank 1 holds at step {kill_at}" in line:
                    for pid in children_of(p.pid):
                        try:
                            with open(f"/proc/{pid}/environ", "rb") as f:
                                if b"RANK=1" in f.read().split(b"\0"):
                                    os.kill(pid, signal.SIGKILL)
                                    killed = True
                        except OSError:
                            continue
        p.wait(timeout=600)
        if kill_at is not None:
            self.assertTrue(killed, "".join(lines[-30:]))
        return p.returncode, "".join(lines)

    def finals(self, out):
        got = []
        for r in range(2):
            with open(os.path.join(out, f"final-{r}.json")) as f:
                got.append(json.load(f))
        return got

    def test_ddp_resumes_with_identical_parameters(self):
        # Warm workers (one torch import a run, not one a worker and attempt): what is proven
        # here is the resume, and a warm worker is found and killed by its RANK as a cold one
        # is (docs/warm.md). The suite's other DDP cases start cold.
        warm = ("--warm",)
        for python in PYTHONS:
            with self.subTest(python=python):
                plain = tempfile.mkdtemp(dir=self.dir)
                rc, text = self.run_ddp(python, plain, 60, extra=warm)
                self.assertEqual(rc, 0, text[-3000:])
                uninterrupted = self.finals(plain)
                self.assertEqual([f["start"] for f in uninterrupted], [0, 0])
                killed = tempfile.mkdtemp(dir=self.dir)
                rc, text = self.run_ddp(python, killed, 60, kill_at=25, extra=warm, into=True)
                self.assertEqual(rc, 0, text[-3000:])
                # Filled in place: the model's own tensors came back, not copies of them.
                self.assertEqual(text.count("resumed at step 25 (in place: True)"), 2, text[-3000:])
                resumed = self.finals(killed)
                # Both ranks saved step 25 (rank 0 then waits for rank 1 in step 26's
                # allreduce): the job resumes there, losing nothing before it.
                self.assertEqual([f["start"] for f in resumed], [25, 25], text[-3000:])
                self.assertEqual([f["hash"] for f in resumed], [f["hash"] for f in uninterrupted])
                # From disk: a job of 30 steps, then a new crun (nothing in memory) that goes
                # on to 60 from the newest step on disk, with the module.
                ck = tempfile.mkdtemp(dir=self.dir)
                first = tempfile.mkdtemp(dir=self.dir)
                extra = (*warm, "--checkpoint-dir", ck, "--checkpoint-every", "10")
                rc, text = self.run_ddp(python, first, 30, extra=extra)
                self.assertEqual(rc, 0, text[-3000:])
                second = tempfile.mkdtemp(dir=self.dir)
                rc, text = self.run_ddp(python, second, 60, extra=extra)
                self.assertEqual(rc, 0, text[-3000:])
                self.assertIn("resuming from disk", text)
                self.assertIn("(in place: False)", text)
                from_disk = self.finals(second)
                self.assertGreaterEqual(from_disk[0]["start"], 20, text[-3000:])
                self.assertEqual([f["hash"] for f in from_disk],
                                 [f["hash"] for f in uninterrupted])

    def test_soak_kill_in_the_middle_of_a_save(self):
        kills = int(os.environ.get("SNAPSHOT_SOAK_KILLS", "200"))
        cmd = [CRUN, "--nproc-per-node", "2", "--max-restarts", str(kills), WORKER, self.dir,
               str(kills * 5 + 20), str(1 << 20), str(kills)]
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=800)
        errors = [f for f in os.listdir(self.dir) if f.startswith("error-")]
        self.assertEqual(errors, [], r.stderr[-3000:])
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        results = []
        for name in os.listdir(self.dir):
            if name.startswith("result-"):
                with open(os.path.join(self.dir, name)) as f:
                    results.append(json.load(f))
        # The last attempt ran to the end on both ranks, from what the kills left.
        self.assertEqual(sorted((x["attempt"], x["rank"]) for x in results),
                         [(kills, 0), (kills, 1)])
        self.assertGreater(results[0]["start"], kills)
        # Where crun gives each attempt a cgroup of its own, the snapshots outlived every one
        # of them: each attempt's cgroup was killed and removed at its end.
        groups = set()
        for name in os.listdir(self.dir):
            if name.startswith("cgroup-"):
                with open(os.path.join(self.dir, name)) as f:
                    groups |= {line.split("::", 1)[1].strip() for line in f
                               if line.startswith("0::") and "/attempt-" in line}
        if groups:
            self.assertEqual(len(groups), kills + 1, sorted(groups)[:5])
            self.assertEqual([g for g in groups if os.path.exists("/sys/fs/cgroup" + g)], [])
        print(f"\n  {kills} workers SIGKILLed mid-save, every restart loaded the agreed step "
              f"({time.monotonic() - t0:.1f} s)")

    def test_a_snapshot_larger_than_the_memory_is_refused(self):
        shm = self.tmpfs("1m")
        cmd = [CRUN, "--nproc-per-node", "1", "--snapshot-memory", shm, WORKER, self.dir, "3",
               str(4 << 20), "0"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("local rank 0's snapshot buffer needs 4.0 MiB", r.stderr)
        self.assertIn(f"but {shm} has", r.stderr)
        self.assertIn("free (of 1.0 MiB)", r.stderr)
        self.assertEqual(used_bytes(shm), 0)

    def test_sigkilled_crun_leaves_no_snapshot_memory(self):
        shm = self.tmpfs("64m")
        script = os.path.join(self.dir, "hold.py")
        with open(script, "w") as f:
            f.write(HOLD)
        # Warm: torch imported once, in the template, which crun's SIGKILL ends with the
        # workers (docs/warm.md); the memory it must free is the workers' either way.
        p = subprocess.Popen([CRUN, "--nproc-per-node", "2", "--warm", "--snapshot-memory", shm,
                              script],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=dict(os.environ, PYTHON_EXEC=PYTHONS[0]))
        seen = 0
        with p.stdout:
            for line in p.stdout:
                seen += "saved" in line
                if seen == 2:
                    break
            self.assertEqual(seen, 2)
            self.assertGreaterEqual(used_bytes(shm), 4 * (8 << 20))
            workers = children_of(p.pid)
            p.kill()
            p.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (
                used_bytes(shm) > 0 or any(os.path.exists(f"/proc/{w}") for w in workers)):
            time.sleep(0.05)
        self.assertEqual(used_bytes(shm), 0)

    def test_metrics_count_the_store(self):
        script = os.path.join(self.dir, "hold.py")
        with open(script, "w") as f:
            f.write(HOLD)
        ck = os.path.join(self.dir, "ck")
        p = subprocess.Popen([CRUN, "--nproc-per-node", "2", "--warm", "--metrics-port", "0",
                              "--checkpoint-dir", ck, "--checkpoint-every", "1", script],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=dict(os.environ, PYTHON_EXEC=PYTHONS[0]))
        url, seen = None, 0
        with p.stdout:
            for line in p.stdout:
                if "metrics on " in line:
                    url = line.split("metrics on ", 1)[1].strip()
                seen += "saved" in line
                if seen == 2:
                    break
            self.assertIsNotNone(url)
            page = urllib.request.urlopen(url, timeout=30).read().decode()
            p.terminate()
            p.wait(timeout=60)

        def value(name):
            for line in page.splitlines():
                if line.startswith(name + "{") or line.startswith(name + " "):
                    return float(line.rsplit(" ", 1)[1])
            self.fail(f"{name} not on the page:\n{page}")
        self.assertEqual(value("crun_agent_snapshot_saves_total"), 4)
        self.assertGreaterEqual(value("crun_agent_snapshot_bytes"), 4 * (8 << 20))
        self.assertEqual(value("crun_agent_snapshot_refusals_total"), 0)
        self.assertEqual(value("crun_agent_snapshot_corrupt_total"), 0)
        # The disk writer's count lags (it runs beside the saves): what it shows is a part of
        # the four steps chosen, and nothing failed.
        self.assertLessEqual(value("crun_agent_snapshot_disk_writes_total")
                             + value("crun_agent_snapshot_disk_skipped_total"), 4)
        self.assertEqual(value("crun_agent_snapshot_disk_failures_total"), 0)
        self.assertEqual(value("crun_agent_snapshot_disk_restores_total"), 0)

    def test_status_shows_each_node_store(self):
        script = os.path.join(self.dir, "hold.py")
        with open(script, "w") as f:
            f.write(HOLD)
        endpoint = f"127.0.0.1:{free_port()}"
        nodes = [subprocess.Popen(
            [CRUN, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
             "--rdzv-endpoint", endpoint, "--rdzv-id", "snapjob", "--checkpoint-dir",
             os.path.join(self.dir, f"ck{i}"), "--checkpoint-every", "1", script],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHON_EXEC=PYTHONS[0])) for i in range(2)]
        try:
            deadline, seen = time.monotonic() + 120, []
            while time.monotonic() < deadline:
                r = subprocess.run([CRUN, "status", "--rdzv-endpoint", endpoint, "--json"],
                                   capture_output=True, text=True, timeout=60)
                if r.returncode == 0:
                    jobs = json.loads(r.stdout)
                    seen = jobs[0]["nodes"] if jobs else []
                    if len(seen) == 2 and all(n["snapshot_step"] == 2 and n["disk_step"] == 2
                                              for n in seen):
                        break
                time.sleep(0.2)
            self.assertEqual([(n["snapshot_step"], n["disk_step"]) for n in seen],
                             [(2, 2), (2, 2)], seen)
            # Two buffers of 8 MiB and their headers on each node.
            self.assertTrue(all(n["snapshot_bytes"] >= 2 * (8 << 20) for n in seen), seen)
            table = subprocess.run([CRUN, "status", "--rdzv-endpoint", endpoint],
                                   capture_output=True, text=True, timeout=60).stdout
            self.assertIn("SNAPSHOTS", table)
            self.assertEqual(table.count("MiB, step 2, disk 2"), 2, table)
        finally:
            for p in nodes:
                p.terminate()
            for p in nodes:
                p.communicate(timeout=60)

    def read_value(self, path):
        try:
            with open(path) as f:
                return int(f.read())
        except (OSError, ValueError):
            return None

    def test_a_spare_loads_a_lost_node_from_its_peer(self):
        """Nodes a and b (two workers each) and spare c, against a `crun rendezvous` daemon
        with a job token. b is SIGKILLed with its workers; c takes its ranks and loads them
        from a, which held b's copies; every rank resumes at one step, each with its own
        state. A stranger without the token is refused by a's replica server."""
        self.spare_loads_from_peer(tls="")

    def test_over_mutual_tls_a_spare_loads_from_its_peer_and_plaintext_is_refused(self):
        """The same job with mutual TLS (every node with a certificate from the job's CA): the
        copies travel over TLS, and a's replica server refuses a plaintext stranger and a TLS
        one without a certificate, naming them."""
        self.spare_loads_from_peer(tls="mutual", warm=True)

    def test_over_tls_without_node_certificates_the_token_proves_peers(self):
        """TLS with the CA alone on the nodes: each crun makes a certificate of its own for its
        copies, which travel over TLS; a plaintext stranger is refused, and a TLS one that
        cannot prove the token too."""
        self.spare_loads_from_peer(tls="ca", warm=True)

    def spare_loads_from_peer(self, tls, warm=False):
        """The spare-node job; `warm`: its workers forked from templates that imported torch
        once a node (the TLS variants: the plaintext one keeps cold starts), about five imports
        of torch fewer."""
        import socket
        import ssl
        token = os.path.join(self.dir, "token")
        with open(os.open(token, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write("replica-test-token\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRUN_")}
        env.update(CRUN_TOKEN_FILE=token, PYTHON_EXEC=PYTHONS[-1])
        service_tls, node_tls = [], []
        if tls:
            certs = make_certificates(os.path.join(self.dir, "pki"))
            service_tls = ["--tls-cert", certs["service.pem"], "--tls-key",
                           certs["service.key"]]
            node_tls = ["--tls-ca", certs["ca.pem"]]
        if tls == "mutual":
            service_tls += ["--tls-ca", certs["ca.pem"]]
            node_tls += ["--tls-cert", certs["client.pem"], "--tls-key", certs["client.key"]]
        daemon = subprocess.Popen([CRUN, "rendezvous", "--host", "127.0.0.1", "--port", "0",
                                   "--token-file", token, *service_tls],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env)
        procs = {"daemon": daemon}
        logs = {tag: os.path.join(self.dir, f"{tag}.log") for tag in "abc"}
        try:
            line = daemon.stdout.readline()
            self.assertIn("listening on", line)
            endpoint = "127.0.0.1:" + line.rsplit(":", 1)[1].strip()
            out = os.path.join(self.dir, "out")
            os.mkdir(out)

            def node(tag):
                with open(logs[tag], "w") as log:
                    return subprocess.Popen(
                        [CRUN, "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint",
                         endpoint, "--rdzv-id", "replicas", "--max-restarts", "0",
                         "--log-level", "info", *node_tls, *(["--warm"] if warm else []),
                         "--rdzv-conf", f"node_id={tag},is_host=0", REPLICA, out],
                        stdout=log, stderr=subprocess.STDOUT, env=env,
                        start_new_session=True)
            procs["a"], procs["b"] = node("a"), node("b")

            def wait(what, check, seconds=120):
                deadline = time.monotonic() + seconds
                while not check():
                    for tag, p in procs.items():
                        if p.poll() is not None:
                            with open(logs.get(tag, os.devnull)) as f:
                                self.fail(f"{tag} ended while waiting for {what}: {f.read()[-3000:]}")
                    self.assertLess(time.monotonic(), deadline, f"no {what}")
                    time.sleep(0.02)

            saved = lambda r: self.read_value(os.path.join(out, f"saved-{r}")) or 0
            wait("five steps saved", lambda: all(saved(r) >= 5 for r in range(4)))
            procs["c"] = node("c")  # waits as a spare, and says so
            text = lambda tag: open(logs[tag]).read()  # noqa: SIM115 (read whole, closed by GC)
            wait("c to wait as a spare", lambda: "this node is a spare" in text("c"))
            wait("the copies' line", lambda: "sends its own" in text("a"))
            port = int(text("a").split("keeps the previous node's at ")[1].split()[0]
                       .rsplit(":", 1)[1].rstrip(","))
            if tls:
                self.assertIn("snapshot copies travel over TLS 1.3, " + (
                    "each node's certificate checked against --tls-ca" if tls == "mutual" else
                    "peers proven by the job's token, bound to each session"), text("a"))
                # Strangers in plaintext, and over TLS without a certificate (mutual) or
                # without the token: refused by a, and said so.
                got = b""
                with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                    s.sendall(b"auth 0123abcd\n")
                    try:
                        got = s.recv(4096)
                    except ConnectionResetError:  # closed with our line unread
                        pass
                self.assertNotIn(b"crun-replica", got)
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
                got = b""
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                            ctx.wrap_socket(raw) as s:
                        f = s.makefile("rwb")
                        got = f.readline()
                        f.write(b"auth 0123abcd\n")
                        f.flush()
                        got += f.readline()
                except (ssl.SSLError, OSError):
                    pass
                if tls == "mutual":
                    self.assertNotIn(b"crun-replica", got)
                else:
                    self.assertIn(b"error refused", got)
                refusals = (2, 0) if tls == "mutual" else (1, 1)
                wait("a's refusals", lambda: (
                    text("a").count("replication connection from 127.0.0.1: no TLS session"),
                    text("a").count("replication connection from 127.0.0.1: it did not "
                                    "prove")) == refusals)
            else:
                # A stranger without the token: refused, and said so by a.
                with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                    f = s.makefile("rw")
                    self.assertTrue(f.readline().startswith("crun-replica 1 "))
                    f.write("auth 0123abcd\n")
                    f.flush()
                    self.assertIn("error refused", f.readline())
                wait("a's refusal", lambda: "refused a snapshot replication connection from "
                     "127.0.0.1: it did not prove" in text("a"))
            # b and its workers SIGKILLed: c takes ranks 2 and 3 over.
            os.killpg(procs["b"].pid, signal.SIGKILL)
            procs.pop("b").wait(timeout=60)
            loads = lambda: [self.read_value(os.path.join(out, f)) for f in os.listdir(out)
                             if f.startswith("loaded-") and not f.endswith(".tmp")]
            wait("every rank loaded after b was lost", lambda: len(loads()) == 8)
            self.assertEqual([f for f in os.listdir(out) if f.startswith("error-")], [])
            resumed = sorted(loads())
            self.assertEqual(resumed[:4], [0] * 4)  # the first round: nothing to load
            self.assertEqual(len(set(resumed[4:])), 1, resumed)  # one step, every rank
            step = resumed[4]
            self.assertGreaterEqual(step, 5)
            # crun's log has a writer thread of its own (base/fd_writer.h): the line may reach
            # the file a moment after the worker's answer that it precedes.
            resumed_line = f"resuming from a peer: step {step} from the copy on 127.0.0.1:{port}"
            wait("c's line " + repr(resumed_line), lambda: resumed_line in text("c"), seconds=30)
            open(os.path.join(out, "stop"), "w").close()
            for tag in ("a", "c"):
                self.assertEqual(procs[tag].wait(timeout=120), 0, text(tag)[-3000:])
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                p.wait(timeout=60)
            daemon.stdout.close()
            daemon.stderr.close()

    def test_bad_options_are_named(self):
        r = subprocess.run([CRUN, "--snapshots", "maybe", "true"], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--snapshots 'maybe' is not valid: expected on or off", r.stderr)
        missing = os.path.join(self.dir, "no-such-dir")
        r = subprocess.run([CRUN, "--snapshot-memory", missing, "--no-python", "true"],
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(f"--snapshot-memory {missing}", r.stderr)
        self.assertFalse(os.path.exists(missing))
        for args, message in [
            (["--checkpoint-every", "0"], "--checkpoint-every '0' is not a whole number"),
            (["--checkpoint-keep", "x"], "--checkpoint-keep 'x' is not a whole number"),
            (["--resume-from-disk", "yes"], "--resume-from-disk 'yes' is not valid"),
            (["--snapshot-replicas", "maybe"], "--snapshot-replicas 'maybe' is not valid"),
            (["--snapshots", "off", "--checkpoint-dir", self.dir],
             f"--checkpoint-dir {self.dir} writes the node's snapshots to disk, and --snapshots "
             "is off"),
            (["--checkpoint-dir", "/proc/crun-cannot-write-here"],
             "--checkpoint-dir /proc/crun-cannot-write-here: cannot create it"),
        ]:
            with self.subTest(args=args):
                r = subprocess.run([CRUN, *args, "--no-python", "true"], capture_output=True,
                                   text=True, timeout=60)
                self.assertNotEqual(r.returncode, 0, r.stderr)
                self.assertIn(message, r.stderr)

    def disk_job(self, work, ck, steps, *extra, expect_ok=True, size=1 << 20):
        cmd = [CRUN, "--nproc-per-node", "2", "--checkpoint-dir", ck, *extra, WORKER, work,
               str(steps), str(size), "0"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if expect_ok:
            errors = [f for f in os.listdir(work) if f.startswith("error-")]
            self.assertEqual((r.returncode, errors), (0, []), r.stderr[-3000:])
        return r

    def disk_steps(self, ck):
        """{rank: [steps on disk under final names, newest first]}"""
        out = {}
        for d, f in self.disk_files(ck):
            if f.endswith(".snap"):
                out.setdefault(int(f[5:10]), []).append(int(d[5:]))
        return {r: sorted(v, reverse=True) for r, v in out.items()}

    def disk_files(self, ck):
        """[(step directory, file name)] under ck; its claims (crun's own files) aside."""
        return [(d, f) for d in os.listdir(ck) if d.startswith("step-")
                for f in os.listdir(os.path.join(ck, d))]

    def fresh_work(self, committed=None):
        work = tempfile.mkdtemp(dir=self.dir)
        if committed is not None:
            for r in range(2):
                with open(os.path.join(work, f"committed-{r}"), "w") as f:
                    f.write(f"{committed}\n")
        return work

    def result(self, work, rank=0):
        with open(os.path.join(work, f"result-{rank}-0.json")) as f:
            return json.load(f)

    def test_disk_resume_keep_and_off(self):
        ck = os.path.join(self.dir, "ck", "nested")  # created by crun, parents included
        self.disk_job(self.fresh_work(), ck, 40, "--checkpoint-every", "10")
        held = self.disk_steps(ck)
        self.assertEqual(sorted(held), [0, 1])
        # Kept: two steps a rank, each a first save at or past a multiple of 10 (or the first
        # save of this crun), and no temporary file left.
        for steps in held.values():
            self.assertEqual(len(steps), 2, held)
            self.assertTrue(all(s % 10 == 0 or s == 1 for s in steps), held)
        self.assertEqual([f for _, f in self.disk_files(ck)
                          if ".tmp-" in f], [])
        common = max(set(held[0]) & set(held[1]))
        # A fresh crun (nothing in memory) resumes there and says so in one line.
        work = self.fresh_work(committed=common)
        r = self.disk_job(work, ck, common + 5, "--checkpoint-every", "10")
        self.assertEqual(self.result(work)["start"], common + 1)
        said = [line for line in r.stderr.splitlines() if "resuming from disk" in line]
        self.assertEqual(len(said), 1, r.stderr)
        self.assertIn(f"step {common} from {ck}", said[0])
        # Off: the same directory, started over from the first step.
        work = self.fresh_work()
        r = self.disk_job(work, ck, 3, "--resume-from-disk", "off")
        self.assertEqual(self.result(work)["start"], 1)
        self.assertNotIn("resuming from disk", r.stderr)

    def test_the_last_save_reaches_disk_when_the_worker_ends_at_once(self):
        """A worker that saves its last step and ends at once: crun takes that save before the
        job ends (each SDK waits for it at exit), so every rank's last step is on disk, run
        after run: the C++ SDK's worker 10 times, a stock PyTorch one 3 times (warm: one
        import of torch a run, not one a worker; a warm worker ends through the interpreter's
        exit, the SDK's wait included, as a cold one does)."""
        for i in range(10):
            ck = os.path.join(self.dir, f"last-{i}")
            self.disk_job(self.fresh_work(), ck, 6, "--checkpoint-every", "1")
            self.assertEqual({r: s[0] for r, s in self.disk_steps(ck).items()}, {0: 6, 1: 6})
        script = os.path.join(self.dir, "last.py")
        with open(script, "w") as f:
            f.write("import torch, crun_worker\n"
                    "for step in range(1, 6):\n"
                    "    crun_worker.save(step, {'w': torch.full((1 << 18,), float(step))})\n")
        for i in range(3):
            ck = os.path.join(self.dir, f"last-py-{i}")
            r = subprocess.run([CRUN, "--nproc-per-node", "2", "--warm", "--checkpoint-dir", ck,
                                "--checkpoint-every", "1", script], capture_output=True,
                               text=True, timeout=300,
                               env=dict(os.environ, PYTHON_EXEC=PYTHONS[-1]))
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            self.assertEqual({r: s[0] for r, s in self.disk_steps(ck).items()}, {0: 5, 1: 5})

    def test_disk_corrupt_snapshot_is_refused(self):
        ck = os.path.join(self.dir, "ck")
        self.disk_job(self.fresh_work(), ck, 20, "--checkpoint-every", "10",
                      "--checkpoint-keep", "1")
        held = self.disk_steps(ck)
        step = held[1][0]
        self.assertEqual(held, {0: [step], 1: [step]})
        path = os.path.join(ck, f"step-{step:012d}", "rank-00001.snap")
        with open(path, "r+b") as f:
            f.seek(4096 + 1000)
            byte = f.read(1)
            f.seek(4096 + 1000)
            f.write(bytes([byte[0] ^ 0xFF]))
        work = self.fresh_work(committed=step)
        r = self.disk_job(work, ck, step + 3, expect_ok=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(f"rank 1 cannot resume from disk at step {step}", r.stderr)
        self.assertIn(f"the snapshot of rank 1 at step {step} fails its checksum", r.stderr)

    def test_disk_directory_of_a_running_job_is_refused(self):
        ck = os.path.join(self.dir, "ck")
        work = self.fresh_work()
        first = subprocess.Popen([CRUN, "--nproc-per-node", "2", "--checkpoint-dir", ck,
                                  "--checkpoint-every", "1", WORKER, work, "1000000",
                                  str(1 << 16), "0"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while self.newest_step(ck) < 3 and first.poll() is None:
                self.assertLess(time.monotonic(), deadline, "the first job wrote nothing")
                time.sleep(0.01)
            # A second job on the same directory: refused before any worker of it starts.
            other = self.fresh_work()
            r = self.disk_job(other, ck, 5, expect_ok=False)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn(f"--checkpoint-dir {ck} is in use by another job: crun pid "
                          f"{first.pid} on host", r.stderr)
            self.assertEqual(os.listdir(other), [])
            self.assertIsNone(first.poll())
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=60)
            first.stderr.close()
        # SIGKILLed, the first job lets go of it: the next one resumes where it stopped.
        held = self.disk_steps(ck)
        common = max(set(held[0]) & set(held[1]))
        work = self.fresh_work(committed=common)
        self.disk_job(work, ck, common + 2)
        self.assertEqual(self.result(work)["start"], common + 1)

    def test_disk_writes_survive_crun_sigkilled(self):
        ck = os.path.join(self.dir, "ck")
        kills = int(os.environ.get("SNAPSHOT_DISK_KILLS", "200"))
        size = 8 << 20
        common, cut = None, 0
        for i in range(kills):
            # Each crun resumes from the newest step both ranks hold on disk (the worker checks
            # the step and every byte), writes every step it can, and is SIGKILLed at some
            # moment in the middle of its writes.
            work = self.fresh_work(committed=common)
            p = subprocess.Popen([CRUN, "--nproc-per-node", "2", "--checkpoint-dir", ck,
                                  "--checkpoint-every", "1", "--checkpoint-keep", "3", WORKER,
                                  work, "1000000", str(size), "0"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)
            target = max(self.newest_step(ck), 0) + 1 + i % 4  # past what the killed wrote
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and p.poll() is None:
                if self.newest_step(ck) >= target and os.path.exists(
                        os.path.join(work, "started-0")):
                    break
                time.sleep(0.005)
            time.sleep((i % 7) * 0.003)
            if p.poll() is not None:
                self.fail(f"crun ended before it was killed: {p.stderr.read()[-3000:]}")
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=60)
            p.stderr.close()
            # A worker whose crun died may report its store gone (the round's store for a
            # barrier, the snapshot store for a save that crun's death cut); nothing else.
            gone = ("barrier:", "save: unavailable: crun's snapshot store")
            errors = []
            for name in os.listdir(work):
                if name.startswith("error-") and not name.endswith(".tmp"):  # whole ones
                    with open(os.path.join(work, name)) as f:
                        text = f.read()
                    errors += [] if text.startswith(gone) else [text]
            self.assertEqual(errors, [], f"kill {i}")
            self.assertEqual(self.result_started(work), (common or 0) + 1)
            deadline = time.monotonic() + 30
            while any(children_of(p.pid)) and time.monotonic() < deadline:
                time.sleep(0.05)
            cut += any(".tmp-" in f for _, f in self.disk_files(ck))
            held = self.disk_steps(ck)
            common = max(set(held.get(0, [])) & set(held.get(1, [])), default=None)
        self.assertIsNotNone(common)
        # The temporaries of killed cruns go when the next one prepares the directory.
        work = self.fresh_work(committed=common)
        r = self.disk_job(work, ck, common + 2, "--checkpoint-every", "1", size=size)
        self.assertEqual(self.result(work)["start"], common + 1)
        self.assertEqual([f for _, f in self.disk_files(ck)
                          if ".tmp-" in f], [])
        print(f"\n  {kills} cruns SIGKILLed while writing ({cut} of them in the middle of a "
              f"file); each next one resumed from disk (the last at step {common})")

    def newest_step(self, ck):
        """The newest step directory, temporaries included; -1 when none."""
        try:
            return max([int(d[5:]) for d in os.listdir(ck) if d.startswith("step-")] or [-1])
        except FileNotFoundError:
            return -1

    def result_started(self, work):
        """The step a (killed) worker resumed at, from its start line."""
        with open(os.path.join(work, "started-0")) as f:
            return int(f.read())

    def test_off_says_so_in_the_module(self):
        script = os.path.join(self.dir, "off.py")
        with open(script, "w") as f:
            f.write("import crun_worker\n"
                    "print('available', crun_worker.available())\n"
                    "try:\n"
                    "    crun_worker.load()\n"
                    "except crun_worker.SnapshotError as e:\n"
                    "    print('refused:', e)\n")
        r = subprocess.run([CRUN, "--snapshots", "off", script], capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, PYTHON_EXEC=sys.executable))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("available False", r.stdout)
        self.assertIn("refused: no snapshot store: CRUN_SNAPSHOT_SOCKET is not set", r.stdout)


if __name__ == "__main__":
    # Two tests at a time (SNAPSHOT_LANES): alone, one after another, the suite left a core
    # idle a third of its time (crun's starts and rounds, restarts, fsyncs, rank 0 waiting on
    # rank 1); every case has its own directories, tmpfs and ports, and waits by deadlines.
    lanes.main(int(os.environ.get("SNAPSHOT_LANES", "2")))
