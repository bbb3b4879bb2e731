"""Helpers shared by crun's Python test suites (stdlib only): run `crun store` as a real process
and speak the 2.x wire protocol over a raw socket."""
import json
import os
import random
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time


def wait_for(predicate, what, limit=60, every=0.01):
    """Polls an observable condition (files written, processes gone) up to a deadline, `every`
    seconds (more where each look runs a program, such as etcdctl)."""
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def scratch_dir(test, prefix):
    """A new directory under $TMPDIR for `test`, removed with all in it when the test ends,
    passed or failed, after its tearDown has stopped its processes. CRUN_KEEP_TEST_DIRS=1 keeps
    it, to look at after a failure."""
    d = tempfile.mkdtemp(prefix=prefix)
    if os.environ.get("CRUN_KEEP_TEST_DIRS") != "1":
        test.addCleanup(shutil.rmtree, d, ignore_errors=True)
    return d


def run_checked(cmd, timeout=600, **kw):
    """Runs `cmd` to completion; a non-zero exit fails the test with the command's output."""
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-3000:]}\n"
                             f"{r.stderr[-3000:]}")
    return r


def proc_state(pid):
    """The one-letter state of `pid` from /proc (R, S, T for stopped, Z for zombie), or None
    when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):  # gone before, or while, it was read
        return None


def proc_files(name):
    """(pid, bytes) of /proc/<pid>/<name> for every process that can be read (processes may end
    while they are listed)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/{name}", "rb") as f:
                yield int(entry), f.read()
        except OSError:
            continue


def alive(pid):
    """Whether `pid` runs: a zombie answers kill(0) but is gone for our purposes."""
    return proc_state(pid) not in (None, "Z")


def commands_mentioning(text):
    """(pid, command line, words joined by spaces) of the live processes (zombies and this one
    aside) whose command line mentions `text`, e.g. a run's directory."""
    needle = text.encode()
    return [(pid, cmdline.replace(b"\0", b" ").decode(errors="replace"))
            for pid, cmdline in proc_files("cmdline")
            if needle in cmdline and pid != os.getpid() and alive(pid)]


def processes_mentioning(text):
    """The pids of commands_mentioning(text): what a test asserts is empty once a job ended."""
    return [pid for pid, _ in commands_mentioning(text)]


def kill_all(procs):
    """Test teardown: SIGKILL whatever of `procs` still runs, reap it, and close its pipes."""
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.communicate()


def _ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


_GIVEN = set()  # the ports free_port() has handed out in this process
_GIVEN_LOCK = threading.Lock()


def free_port():
    """A TCP port free on loopback right now, from below the kernel's ephemeral range.

    A port the kernel hands out (bind to port 0) is one it may give, a moment later, to any
    outgoing connection as its local port; with other suites running (ctest -j2, stores taking
    thousands of connections), a crun that then binds it would find it "in use" and wait for a
    service that is not there. Ports below the ephemeral range are only taken by explicit binds."""
    low, _ = _ephemeral_range()
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(1000):
        port = rng.randrange(10000, max(low, 10001))
        with _GIVEN_LOCK:  # never the same port twice in one process (cases run at once)
            if port in _GIVEN:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _GIVEN.add(port)
            return port
    with socket.socket() as s:  # a crowded machine: any port, as before
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def whole_lines(path):
    """The complete lines of a file that others append to, without their newlines: a last line
    still being written (no newline yet) is left for the next read. [] before the file exists."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return []
    return text.split("\n")[:-1]


def ddp_digests(text, world):
    """{rank: the SHA-256 of its final parameters} that tests/workers/ddp_train.py printed in
    TEXT (its ranks' output, from every node). Raises AssertionError, with TEXT's end, unless
    every rank of WORLD printed one. A rank's record may follow another's on the same line:
    an unbuffered print writes its text and its newline apart, and the ranks' writes
    interleave (in crun's output and in Slurm's output file alike)."""
    got = {int(r): d for r, d in
           re.findall(rf"rank (\d+)/{world} \(torch [^)]*\) done, [^\n]*?params sha256 "
                      r"([0-9a-f]{64})", text)}
    if sorted(got) != list(range(world)):
        raise AssertionError(f"ranks {sorted(got)} of {world} printed their parameters' digest:"
                             f"\n{text[-3000:]}")
    return got


def probe_events(out_dir):
    """The lines tests/workers/node_probe.py appended to OUT/events.jsonl, one per start."""
    return [json.loads(line) for line in whole_lines(os.path.join(out_dir, "events.jsonl"))
            if line.strip()]


VALIDATE = b"\x00" + struct.pack("<I", 0x3C85F7CE)


def start_store(crun, *args, preexec_fn=None):
    """Starts `crun store ARGS` and returns (process, port) once it has announced its address.
    Defaults to a free loopback port."""
    if "--port" not in args:
        args = ("--host", "127.0.0.1", "--port", "0", *args)
    proc = subprocess.Popen([crun, "store", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=preexec_fn)
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    if not ready:
        proc.kill()
        raise AssertionError("crun store printed no address within 30 s")
    line = proc.stdout.readline().decode()
    if "listening on" not in line:
        proc.kill()
        raise AssertionError(f"unexpected first line from crun store: {line!r}: "
                             f"{proc.stderr.read().decode()[-2000:]}")
    return proc, int(line.rsplit(":", 1)[1])


def stop_store(proc, sig=signal.SIGTERM, timeout=30):
    """Signals the store and returns (exit code, stderr); kills it if it does not stop."""
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return proc.returncode, err.decode()


def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("store closed the connection")
        data += chunk
    return data


def raw_add(sock, key, delta):
    """ADD on a 2.x connection (VALIDATE already sent); returns the new value. Raw keys: no
    '/' is prepended, unlike PyTorch's client."""
    k = key.encode()
    sock.sendall(b"\x04" + struct.pack("<Q", len(k)) + k + struct.pack("<q", delta))
    return struct.unpack("<q", recv_exact(sock, 8))[0]


def connect_2x(port, timeout=10):
    """A raw connection that has sent VALIDATE: the store now speaks 2.x to it."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(VALIDATE)
    return sock


def signal_events(out_dir, event=None):
    """The lines tests/workers/signal_probe.py appended to OUT/signals.jsonl (start, signal,
    saved), those of kind `event` only when given."""
    lines = [json.loads(line) for line in whole_lines(os.path.join(out_dir, "signals.jsonl"))
             if line.strip()]
    return [e for e in lines if event is None or e["event"] == event]


def make_certificates(d, san="IP:127.0.0.1,DNS:localhost"):
    """A CA, a service certificate for `san` (openssl's subjectAltName syntax) and a client
    certificate, all signed by the CA (openssl CLI, EC keys: fast). Paths by file name."""
    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)
    os.makedirs(d, exist_ok=True)
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=crun test CA")
    with open(os.path.join(d, "san.ext"), "w") as f:
        f.write(f"subjectAltName={san}\n")
    for name in ("service", "client"):
        run("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN=crun test {name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", "san.ext")
    return {n: os.path.join(d, n) for n in ("ca.pem", "service.pem", "service.key",
                                            "client.pem", "client.key")}
