"""Stock PyTorch's TCPStore client against `crun store`.

Runs unchanged under Debian's python3-torch (1.13, legacy wire dialect) and PyTorch 2.x from
PyPI (modern dialect): every public TCPStore operation the running version exposes, timeouts,
world_size / wait_for_workers, PrefixStore, many concurrent client processes, and real gloo
process groups (explicit store and the env:// agent-store path that workers use under crun).

The crun binary comes from $CRUN_BIN. Every child process and wait has a time limit.
"""
import datetime
import multiprocessing
import os
import socket
import sys
import threading
import time
import unittest

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from crun_testing import connect_2x, raw_add, start_store, stop_store  # noqa: E402

CRUN = os.environ["CRUN_BIN"]
TORCH2 = int(torch.__version__.split(".")[0]) >= 2
MP = multiprocessing.get_context("fork")
CHILD_LIMIT_S = 120


class CrunStore:
    """A `crun store` process on a free loopback port."""

    def __init__(self, *extra):
        self.proc, self.port = start_store(CRUN, "--log-level", "warn", *extra)

    def client(self, timeout_s=30.0, world_size=None, wait_for_workers=True):
        kwargs = {"timeout": datetime.timedelta(seconds=timeout_s)}
        if world_size is not None:
            kwargs["world_size"] = world_size
            kwargs["wait_for_workers"] = wait_for_workers
        return dist.TCPStore("127.0.0.1", self.port, is_master=False, **kwargs)

    def stop(self):
        rc, stderr = stop_store(self.proc)
        if rc != 0:
            raise AssertionError(f"crun store exited {rc} on SIGTERM: {stderr}")
        return stderr


def raw_read_counter(port, key):
    with connect_2x(port) as s:
        return raw_add(s, key, 0)


def run_children(target, args_list):
    procs = [MP.Process(target=target, args=args) for args in args_list]
    for p in procs:
        p.start()
    for p in procs:
        p.join(CHILD_LIMIT_S)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
            raise AssertionError(f"child {p.pid} still running after {CHILD_LIMIT_S} s")
    codes = [p.exitcode for p in procs]
    if any(codes):
        raise AssertionError(f"child exit codes {codes}")


# Operations the suite covers; test_every_public_operation_is_covered keeps this honest.
COVERED = {
    "set", "get", "add", "compare_set", "delete_key", "num_keys", "wait", "set_timeout",
    "timeout", "host", "port", "append", "check", "multi_get", "multi_set", "queue_push",
    "queue_pop", "queue_len", "list_keys", "barrier", "clone", "has_extended_api", "libuvBackend",
}


class TCPStoreCompat(unittest.TestCase):
    def setUp(self):
        self.server = CrunStore()

    def tearDown(self):
        self.server.stop()

    def test_every_public_operation_is_covered(self):
        public = {m for m in dir(dist.TCPStore) if not m.startswith("_")}
        self.assertEqual(public - COVERED, set(),
                         f"torch {torch.__version__} exposes operations this suite does not test")

    def test_set_get_overwrite_binary(self):
        s = self.server.client()
        s.set("a", "xy")
        self.assertEqual(s.get("a"), b"xy")
        s.set("a", b"\x00\x01\xff")
        self.assertEqual(s.get("a"), b"\x00\x01\xff")
        s.set("empty", "")
        self.assertEqual(s.get("empty"), b"")
        self.assertEqual((s.host, s.port), ("127.0.0.1", self.server.port))

    def test_get_waits_for_another_client(self):
        reader, writer = self.server.client(), self.server.client()
        out = {}
        t = threading.Thread(target=lambda: out.update(v=reader.get("late")))
        t.start()
        writer.set("late", "here")
        t.join(60)
        self.assertEqual(out.get("v"), b"here")

    def test_add(self):
        s = self.server.client()
        self.assertEqual(s.add("n", 5), 5)
        self.assertEqual(s.add("n", -7), -2)
        self.assertEqual(s.add("n", 0), -2)
        self.assertEqual(s.get("n"), b"-2")

    def test_compare_set(self):
        s = self.server.client()
        self.assertEqual(s.compare_set("k", "", "v1"), b"v1")
        self.assertEqual(s.compare_set("k", "v1", "v2"), b"v2")
        self.assertEqual(s.compare_set("k", "nope", "v3"), b"v2")
        self.assertEqual(s.compare_set("absent", "exp", "des"), b"exp")
        self.assertEqual(s.get("k"), b"v2")

    def test_delete_and_num_keys(self):
        s = self.server.client(world_size=1)  # world_size adds the raw "init/" key
        base = s.num_keys()
        self.assertEqual(base, 1)
        s.set("a", "1")
        s.set("b", "1")
        self.assertEqual(s.num_keys(), base + 2)
        self.assertTrue(s.delete_key("a"))
        self.assertFalse(s.delete_key("a"))
        self.assertEqual(s.num_keys(), base + 1)

    def test_wait_and_timeouts(self):
        s = self.server.client()
        s.set("x", "1")
        s.wait(["x"])
        s.wait(["x"], datetime.timedelta(seconds=5))
        start = time.monotonic()
        with self.assertRaises(Exception) as err:
            s.wait(["never"], datetime.timedelta(milliseconds=200))
        self.assertLess(time.monotonic() - start, 10)
        if TORCH2:
            self.assertIn("never", str(err.exception))
            # CANCEL_WAIT left the connection usable.
            self.assertEqual(s.add("after", 1), 1)
        g = self.server.client()
        g.set_timeout(datetime.timedelta(milliseconds=300))
        self.assertEqual(g.timeout, datetime.timedelta(milliseconds=300))
        start = time.monotonic()
        with self.assertRaises(Exception) as err:
            g.get("missing")
        self.assertLess(time.monotonic() - start, 10)
        self.assertIn("imeout", str(err.exception))

    def test_wait_for_workers_counts_every_client(self):
        n = 6
        run_children(_join_world, [(self.server.port, n, i) for i in range(n)])
        self.assertEqual(raw_read_counter(self.server.port, "init/"), n)

    def test_prefix_store(self):
        s = self.server.client()
        p = dist.PrefixStore("job7", s)
        p.set("k", "v")
        self.assertEqual(p.get("k"), b"v")
        self.assertEqual(self.server.client().get("job7/k"), b"v")
        self.assertEqual(p.add("c", 2), 2)
        nested = dist.PrefixStore("inner", p)
        nested.set("z", "1")
        self.assertEqual(s.get("job7/inner/z"), b"1")

    def test_many_concurrent_client_processes(self):
        n, adds = 8, 200
        run_children(_add_many, [(self.server.port, adds)] * n)
        self.assertEqual(self.server.client().add("counter", 0), n * adds)

    @unittest.skipUnless(TORCH2, "append/check/multi_*/queue/list_keys/barrier/clone are 2.x")
    def test_extended_api(self):
        s = self.server.client()
        self.assertTrue(s.has_extended_api())
        s.append("log", "a")
        s.append("log", "bc")
        self.assertEqual(s.get("log"), b"abc")
        self.assertTrue(s.check(["log"]))
        self.assertFalse(s.check(["log", "nope"]))
        s.multi_set(["m1", "m2"], ["1", "2"])
        self.assertEqual(s.multi_get(["m2", "m1"]), [b"2", b"1"])
        self.assertIn("m1", s.list_keys())
        c = s.clone()
        self.assertEqual(c.get("m1"), b"1")

    @unittest.skipUnless(TORCH2, "queues are 2.x")
    def test_queues(self):
        s = self.server.client()
        self.assertEqual(s.queue_len("q"), 0)
        s.queue_push("q", "one")
        s.queue_push("q", "two")
        self.assertEqual(s.queue_len("q"), 2)
        self.assertEqual(s.queue_pop("q"), b"one")
        self.assertEqual(s.queue_pop("q", block=False), b"two")
        with self.assertRaises(Exception):
            s.queue_pop("q", block=False)
        other = self.server.client()
        out = {}
        t = threading.Thread(target=lambda: out.update(v=s.queue_pop("q")))
        t.start()
        other.queue_push("q", "three")
        t.join(60)
        self.assertEqual(out.get("v"), b"three")

    @unittest.skipUnless(TORCH2, "barrier is 2.x")
    def test_barrier(self):
        n = 4
        run_children(_barrier, [(self.server.port, n)] * n)
        s = self.server.client()
        with self.assertRaises(Exception):
            s.barrier("lonely", 2, datetime.timedelta(milliseconds=200))
        self.assertEqual(s.add("after", 1), 1)

    @unittest.skipUnless(TORCH2, "libuvBackend is a 2.x attribute")
    def test_libuv_flag_is_client_side(self):
        self.assertIn(self.server.client().libuvBackend, (True, False))

    def test_gloo_process_group_on_explicit_store(self):
        world = 2
        run_children(_gloo_explicit, [(self.server.port, r, world) for r in range(world)])

    def test_gloo_env_init_in_agent_store_mode(self):
        """The worker contract under crun: MASTER_ADDR/PORT name crun's store and
        TORCHELASTIC_USE_AGENT_STORE=True makes every rank a client of it."""
        world = 2
        run_children(_gloo_env, [(self.server.port, r, world) for r in range(world)])

    def test_garbage_on_the_port_disturbs_nobody(self):
        s = self.server.client()
        s.set("k", "v")
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=10) as raw:
            raw.sendall(b"\x7fNOT A STORE REQUEST")
            raw.settimeout(10)
            self.assertEqual(raw.recv(1), b"")  # closed by the server
        self.assertEqual(s.get("k"), b"v")
        self.assertEqual(s.add("n", 1), 1)
        log = self.server.stop()
        self.server = CrunStore()  # tearDown stops a live one
        self.assertIn("closing connection from 127.0.0.1:", log)
        self.assertIn("0x7f", log)


def _join_world(port, n, _rank):
    dist.TCPStore("127.0.0.1", port, world_size=n, is_master=False,
                  timeout=datetime.timedelta(seconds=60))


def _add_many(port, adds):
    s = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
    for _ in range(adds):
        s.add("counter", 1)


def _barrier(port, n):
    s = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
    s.barrier("bar", n, datetime.timedelta(seconds=60))


def _check_allreduce(rank, world):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    if t.item() != expected:
        raise SystemExit(f"rank {rank}: all_reduce gave {t.item()}, expected {expected}")
    dist.barrier()
    dist.destroy_process_group()


def _gloo_explicit(port, rank, world):
    store = dist.TCPStore("127.0.0.1", port, world_size=world, is_master=False,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    _check_allreduce(rank, world)


def _gloo_env(port, rank, world):
    os.environ.update({
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
        "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0",
    })
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
    _check_allreduce(rank, world)


if __name__ == "__main__":
    unittest.main(verbosity=2)
