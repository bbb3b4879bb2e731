"""`crun store` as an operator meets it: flags, errors, signals, what is left behind."""
import json
import os
import resource
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from crun_testing import VALIDATE, connect_2x, raw_add, start_store, stop_store  # noqa: E402

CRUN = os.environ["CRUN_BIN"]


def start(*args, nofile=None):
    limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))) if nofile \
        else None
    return start_store(CRUN, *args, preexec_fn=limit)


def read_line_with(stream, marker, timeout=30):
    """Reads `stream` (a pipe) up to the first line that contains `marker`; returns (that
    line, everything read), as text."""
    deadline = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(stream.fileno(), 4096)
        if not chunk:
            break
        buf += chunk
        for line in buf.split(b"\n"):
            if marker in line:
                return line.decode(), buf.decode()
    raise AssertionError(f"no line with {marker!r} within {timeout} s: {buf.decode()[-2000:]}")


def finish(proc, timeout=30):
    """Waits for a store that was already signalled; returns (exit code, stdout, stderr)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return proc.returncode, out.decode(), err.decode()


def try_round_trip(port):
    """Connects and does one ADD; returns the socket, or None if the server refused it."""
    c = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        c.sendall(VALIDATE)
        raw_add(c, "n", 1)
        return c
    except OSError:
        c.close()
        return None


def storm_child():
    """Run by test_a_storm_beyond_one_backlog_is_queued_not_dropped inside a network namespace
    of its own (clean TCP counters): a stopped store with a 64-connection backlog is sent 400
    connections; the kernel must queue every one (no listen overflow), and once the store
    runs again it must serve them all. Prints a JSON summary."""
    def overflows():
        out = subprocess.run(["nstat", "-az", "TcpExtListenOverflows"], capture_output=True,
                             text=True, timeout=30).stdout
        return int(next((x.split()[1] for x in out.splitlines()
                         if x.startswith("TcpExtListenOverflows")), "0"))
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=30)
    proc, port = start("--backlog", "64", "--log-level", "info", nofile=2048)
    try:
        _, log = read_line_with(proc.stderr, b"listening (")
        before = overflows()
        proc.send_signal(signal.SIGSTOP)
        socks = []
        for _ in range(400):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(("127.0.0.1", port))
            socks.append(c)
        deadline = time.monotonic() + 30
        waiting = list(socks)
        while waiting and time.monotonic() < deadline:
            _, writable, _ = select.select([], waiting, [], 1)
            waiting = [c for c in waiting if c not in writable]
        dropped = overflows() - before
        proc.send_signal(signal.SIGCONT)
        served = 0
        for c in socks:
            c.setblocking(True)
            c.settimeout(30)
            try:
                c.sendall(VALIDATE)
                raw_add(c, "n", 1)
                served += 1
            except OSError:
                pass
            c.close()
        print(json.dumps({"log": log, "dropped": dropped, "served": served,
                          "unconnected": len(waiting)}))
    finally:
        proc.send_signal(signal.SIGCONT)
        stop_store(proc)


class StoreCli(unittest.TestCase):
    def test_bad_flags_name_the_value_and_fail(self):
        for args, needle in [(["--port", "70000"], "70000"),
                             (["--port", "abc"], "abc"),
                             (["--log-level", "loud"], "loud"),
                             (["--max-key-bytes", "0"], "0"),
                             (["--no-such-flag"], "--no-such-flag")]:
            with self.subTest(args=args):
                r = subprocess.run([CRUN, "store", *args], capture_output=True, text=True,
                                   timeout=30)
                self.assertNotEqual(r.returncode, 0)
                self.assertIn(needle, r.stderr + r.stdout)

    @unittest.skipUnless(os.geteuid() == 0 and shutil.which("nstat"),
                         "needs root (a network namespace) and nstat")
    def test_a_storm_beyond_one_backlog_is_queued_not_dropped(self):
        """The store listens on several sockets of one port (SO_REUSEPORT), each with its own
        accept queue, enough for the connections it may hold: with a backlog of 64 and 2,048
        descriptors, 16 queues. One queue would drop 336 of these 400 connections (the
        clients retry a second later: the storm regression of issue 23)."""
        ns = f"crun-storm-{os.getpid()}"
        subprocess.run(["ip", "netns", "add", ns], check=True, timeout=30)
        try:
            r = subprocess.run(["ip", "netns", "exec", ns, sys.executable,
                                os.path.abspath(__file__), "--storm-child"],
                               capture_output=True, text=True, timeout=120,
                               env=dict(os.environ, PYTHONUNBUFFERED="1"))
        finally:
            subprocess.run(["ip", "netns", "del", ns], check=False, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        result = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertIn("16 x backlog 64", result["log"])
        self.assertEqual(result["unconnected"], 0)
        self.assertEqual(result["dropped"], 0)
        self.assertEqual(result["served"], 400)

    def test_port_in_use_is_named(self):
        first, port = start("--host", "127.0.0.1", "--port", "0")
        try:
            r = subprocess.run([CRUN, "store", "--host", "127.0.0.1", "--port", str(port)],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 1)
            self.assertIn(f"127.0.0.1:{port}", r.stderr)
            self.assertIn("in use", r.stderr)
        finally:
            first.send_signal(signal.SIGTERM)
            finish(first)

    def test_metrics_count_what_clients_did(self):
        proc, port = start("--metrics-port", "0")
        try:
            # Printed and flushed with the first line, which start() has read.
            line = proc.stdout.readline().decode()
            self.assertIn("crun store metrics on ", line)
            url = line.split("metrics on ", 1)[1].strip()
            self.assertRegex(url, r"^http://127\.0\.0\.1:\d+/metrics$")
            c = connect_2x(port)
            for _ in range(3):
                raw_add(c, "n", 1)
            bad = socket.create_connection(("127.0.0.1", port), timeout=10)
            bad.sendall(b"\xff" * 64)  # no such command in any dialect
            self.assertEqual(bad.recv(1), b"")  # closed by the store
            bad.close()
            with urllib.request.urlopen(url, timeout=10) as r:
                self.assertEqual(r.headers["Content-Type"],
                                 "text/plain; version=0.0.4; charset=utf-8")
                page = r.read().decode()
            values = {}
            for sample in page.splitlines():
                if sample and not sample.startswith("#"):
                    name, value = sample.rsplit(" ", 1)
                    values[name] = float(value)
            self.assertEqual(values['crun_store_requests_total{op="add"}'], 3)
            self.assertEqual(values['crun_store_requests_total{op="validate"}'], 1)
            self.assertEqual(values['crun_store_requests_total{op="set"}'], 0)
            self.assertEqual(values["crun_store_connections_accepted_total"], 2)
            self.assertEqual(values["crun_store_connections"], 1)
            self.assertEqual(values["crun_store_protocol_errors_total"], 1)
            self.assertEqual(values['crun_store_connections_refused_total{reason="stranger"}'],
                             0)
            self.assertGreater(values["crun_store_stored_bytes"], 0)
            if shutil.which("promtool"):
                r = subprocess.run(["promtool", "check", "metrics"], input=page,
                                   capture_output=True, text=True, timeout=30)
                self.assertEqual((r.returncode, r.stdout + r.stderr), (0, ""))
            with self.assertRaises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(url.replace("/metrics", "/other"), timeout=10)
            self.assertEqual(e.exception.code, 404)
            c.close()
        finally:
            code, err = stop_store(proc)
        self.assertEqual(code, 0, err)

    def test_bad_metrics_flags_and_a_taken_metrics_port_are_named(self):
        for args, code, needle in [
                (["--metrics-port", "70000"], 2, "70000"),
                (["--metrics-port", "0", "--metrics-host", "localhost"], 1,
                 "--metrics-host 'localhost' is not an IP address")]:
            with self.subTest(args=args):
                r = subprocess.run([CRUN, "store", "--host", "127.0.0.1", "--port", "0", *args],
                                   capture_output=True, text=True, timeout=30)
                self.assertEqual(r.returncode, code, r.stderr)
                self.assertIn(needle, r.stderr + r.stdout)
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        try:
            busy = taken.getsockname()[1]
            r = subprocess.run([CRUN, "store", "--host", "127.0.0.1", "--port", "0",
                                "--metrics-port", str(busy)],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn(f"metrics at 127.0.0.1:{busy}", r.stderr)
            self.assertIn("in use", r.stderr)
            self.assertNotIn("listening on", r.stdout)  # nothing announced
        finally:
            taken.close()

    def test_unresolvable_bind_host_is_named(self):
        r = subprocess.run([CRUN, "store", "--host", "no-such-host.invalid", "--port", "0"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no-such-host.invalid", r.stderr)

    def test_sigint_and_sigterm_stop_cleanly_with_clients_attached(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            with self.subTest(signal=sig.name):
                proc, port = start("--host", "127.0.0.1", "--port", "0")
                clients = [socket.create_connection(("127.0.0.1", port), timeout=10)
                           for _ in range(5)]
                for c in clients:
                    c.sendall(VALIDATE)
                    self.assertEqual(raw_add(c, "n", 1) > 0, True)
                # One client is blocked in a WAIT when the signal arrives.
                k = b"/never"
                clients[0].sendall(b"\x06" + struct.pack("<Q", 1) + struct.pack("<Q", len(k)) + k)
                proc.send_signal(sig)
                rc, _, err = finish(proc)
                self.assertEqual(rc, 0, err)
                self.assertIn(sig.name, err)
                for c in clients:
                    c.settimeout(10)
                    self.assertEqual(c.recv(1), b"")  # closed, not hung
                    c.close()
                # The port is free again: nothing was left running.
                again, _ = start("--host", "127.0.0.1", "--port", str(port))
                again.send_signal(signal.SIGTERM)
                self.assertEqual(finish(again)[0], 0)

    # UBSan's vptr check (scripts/test.sh --sanitize address) reads an object it has not seen
    # before through a pipe of its own; at the descriptor limit, which this case reaches on
    # purpose, pipe() fails and it calls the valid StoreServer "invalid vptr" and aborts. The
    # ordinary build (CI) runs the case.
    @unittest.skipIf(os.environ.get("CRUN_SANITIZER") == "address",
                     "UBSan's vptr check needs descriptors of its own, and this case has none")
    def test_descriptor_limit_refuses_cleanly_and_recovers(self):
        """At RLIMIT_NOFILE the store holds what it can, closes the rest at once (no client
        left hanging in the backlog), stays up, and serves again when descriptors free up."""
        proc, port = start("--host", "127.0.0.1", "--port", "0", nofile=64)
        held, refused = [], 0
        try:
            for _ in range(100):
                c = try_round_trip(port)
                if c is None:
                    refused += 1
                else:
                    held.append(c)
            self.assertGreater(len(held), 40)   # most of the 64 descriptors serve clients
            self.assertEqual(len(held) + refused, 100)
            for c in held[:10]:
                c.close()
            # Freed descriptors are usable again, once the server has seen the closes: under
            # load its loop may take the next connections before those, so it gets 10 s.
            deadline = time.monotonic() + 10
            while True:
                c = try_round_trip(port)
                if c is not None:
                    c.close()
                    break
                if time.monotonic() > deadline:
                    self.fail("no connection served in 10 s after descriptors were freed")
        finally:
            for c in held:
                c.close()
            proc.send_signal(signal.SIGTERM)
            rc, _, err = finish(proc)
        self.assertEqual(rc, 0, err)
        self.assertIn("process descriptor limit", err)

    def test_allow_list_closes_strangers_and_serves_the_listed(self):
        proc, port = start("--allow", "127.0.0.1", "--max-waits-per-connection", "8")
        try:
            stranger = socket.socket()
            stranger.bind(("127.0.0.2", 0))
            stranger.connect(("127.0.0.1", port))
            stranger.settimeout(30)
            stranger.sendall(VALIDATE)
            try:
                self.assertEqual(stranger.recv(1), b"")
            except ConnectionResetError:
                pass
            stranger.close()
            member = socket.create_connection(("127.0.0.1", port), timeout=30)
            member.sendall(VALIDATE)
            self.assertEqual(raw_add(member, "k", 2), 2)
            # The counters, on request: the member is still connected, the stranger counted.
            proc.send_signal(signal.SIGUSR1)
            stats, log = read_line_with(proc.stderr, b"stats: ")
            for part in ("1 open", "2 accepted", "1 refused strangers", "2 requests",
                         "0 closed for protocol errors"):
                self.assertIn(part, stats)
            member.close()
        finally:
            code, err = stop_store(proc)
        self.assertEqual(code, 0, err)
        self.assertIn("refused connection #1 from 127.0.0.2: not an address of this job's nodes",
                      log + err)
        r = subprocess.run([CRUN, "store", "--port", "0", "--allow", "node-a"],
                           capture_output=True, text=True, timeout=30)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("allowed peer 'node-a' is not an IP address", r.stderr)

    def test_help_lists_the_limits(self):
        r = subprocess.run([CRUN, "store", "--help"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0)
        for flag in ["--host", "--port", "--max-connections", "--max-value-bytes", "--backlog",
                     "--max-connections-per-peer", "--max-waits-per-connection",
                     "--max-pending-waits", "--allow"]:
            self.assertIn(flag, r.stdout)


if __name__ == "__main__":
    if "--storm-child" in sys.argv:
        storm_child()
        sys.exit(0)
    unittest.main(verbosity=2)
