"""Store benchmark: crun's store against PyTorch's servers, in the same run, with one load
generator (store_loadgen). Writes docs/benchmarks.md.

Servers: `crun store`; PyTorch 1.13's classic server (Debian python3-torch); PyTorch 2.x's
libuv server (PyPI; the default since 2.4) and, for reference, 2.x's classic server.
crun is driven in the 2.x dialect against the 2.x servers and in the 1.13 dialect against
the 1.13 server, so every comparison uses the same bytes on the wire.

Everything runs inside a private network namespace with only loopback (created and removed
by this script; needs root). Outside one, on a host whose DNS resolver does not answer,
PyTorch 2.x's servers stall: they reverse-resolve every accepted peer address on the serving
thread (seen here with gdb: `res_context_query("1.0.0.127.in-addr.arpa")`, 5 s each), which
would measure the resolver, not the store. `--no-netns` runs on the host anyway.

Every server and load generator it starts is stopped however the run ends (a later server
failing to start included). The 2.x servers need a TCPStore that takes `use_libuv` (PyTorch
2.1 and later): a --torch2-python whose torch lacks it is refused by name before anything
starts.

Usage: store_bench.py --crun BIN --loadgen BIN --torch2-python PY [--quick] [--out FILE]
"""
import argparse
import contextlib
import json
import os
import platform
import select
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from bench_support import in_private_netns, measured_at  # noqa: E402

# What a python's torch offers, read without starting a server: its version, and whether its
# TCPStore takes use_libuv (pybind11 writes every constructor's signature into its docstring).
TORCH_PROBE = r"""
import torch
try:
    import torch.distributed as d
    doc = (d.TCPStore.__doc__ or "") + (d.TCPStore.__init__.__doc__ or "")
except (ImportError, AttributeError):
    doc = ""
print(torch.__version__)
print("use_libuv" in doc)
"""
PROBE_LIMIT_S = 120
SERVER_START_LIMIT_S = 120
STOP_LIMIT_S = 30
# A storm generator reports by its --storm-timeout-ms; this much later it is taken as hung.
STORM_REPORT_GRACE_S = 60
# How long a generator may take to let its connections go once its stdin closes.
GENERATOR_END_LIMIT_S = 60
# The servers whose script passes use_libuv (SERVER_SCRIPT).
NEEDS_USE_LIBUV = ("torch2-libuv", "torch2-classic")

SERVER_SCRIPT = r"""
import datetime, sys, torch.distributed as d
kw = {}
if sys.argv[1] != "default":
    kw["use_libuv"] = sys.argv[1] == "libuv"
s = d.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=3600),
               wait_for_workers=False, **kw)
print("listening on 127.0.0.1:%d" % s.port, flush=True)
sys.stdin.read()
"""


NOTES_MARKER = "<!-- Analysis: hand-written; store_bench.py keeps everything from here on. -->"


class UnsupportedPython(RuntimeError):
    """A python whose torch cannot run the servers asked of it."""


def torch_of(python):
    """(torch version, whether its TCPStore takes use_libuv) of `python`; starts no server."""
    try:
        r = subprocess.run([python, "-c", TORCH_PROBE], capture_output=True, text=True,
                           timeout=PROBE_LIMIT_S)
    except subprocess.TimeoutExpired:
        raise UnsupportedPython(f"{python}: importing torch took over {PROBE_LIMIT_S} s") \
            from None
    except OSError as e:
        raise UnsupportedPython(f"{python}: cannot run it: {e}") from None
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or len(lines) < 2:
        raise UnsupportedPython(f"{python}: cannot import torch (exit {r.returncode}): "
                                f"{r.stderr.strip()[-300:]}")
    return lines[-2].strip(), lines[-1].strip() == "True"


def require_use_libuv(python):
    """`python`'s torch version, or UnsupportedPython naming it when its TCPStore has no
    use_libuv (PyTorch 2.0's has not: the 2.x servers would fail to start)."""
    version, use_libuv = torch_of(python)
    if not use_libuv:
        raise UnsupportedPython(
            f"{python}: its torch {version} has a TCPStore without use_libuv (PyTorch 2.1 and "
            f"later have it), which the PyTorch 2.x servers need; nothing was started. Pass a "
            f"newer PyTorch as --torch2-python (bash scripts/setup-torch2.sh)")
    return version


class Server:
    """A store server process; a context manager that stops it. The constructor returns once
    the server says where it listens, or stops it and raises."""

    def __init__(self, name, cmd, dialect):
        self.name, self.dialect = name, dialect
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        try:
            self.port = self._port()
        except BaseException:
            self.stop()
            raise

    def _port(self):
        ready, _, _ = select.select([self.proc.stdout], [], [], SERVER_START_LIMIT_S)
        if not ready:
            raise RuntimeError(f"{self.name}: no address within {SERVER_START_LIMIT_S} s")
        line = self.proc.stdout.readline().decode()
        if "listening on" not in line:
            self.stop()  # then its stderr ends: read it to the end
            try:
                _, err = self.proc.communicate(timeout=STOP_LIMIT_S)
            except subprocess.TimeoutExpired:
                err = b"(its stderr still open)"
            raise RuntimeError(f"{self.name}: unexpected output {line!r}: "
                               f"{err.decode(errors='replace')[-2000:]}")
        return int(line.rsplit(":", 1)[1])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def cpu_seconds(self):
        """(user, system) CPU time the server process has used so far."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        return int(fields[11]) / tick, int(fields[12]) / tick

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_LIMIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=STOP_LIMIT_S)


def start_server(kind, args):
    if kind == "crun-2x":
        return Server("crun (2.x dialect)", [args.crun, "store", "--host", "127.0.0.1", "--port",
                                              "0", "--log-level", "error"], "modern")
    if kind == "crun-1.13":
        return Server("crun (1.13 dialect)", [args.crun, "store", "--host", "127.0.0.1",
                                               "--port", "0", "--log-level", "error"], "legacy")
    if kind == "torch2-libuv":
        return Server("PyTorch 2.x libuv", [args.torch2_python, "-c", SERVER_SCRIPT, "libuv"],
                      "modern")
    if kind == "torch2-classic":
        return Server("PyTorch 2.x classic", [args.torch2_python, "-c", SERVER_SCRIPT,
                                               "classic"], "modern")
    if kind == "torch1.13":
        return Server("PyTorch 1.13 classic", [args.torch1_python, "-c", SERVER_SCRIPT,
                                                "default"], "legacy")
    raise ValueError(kind)


@contextlib.contextmanager
def running_servers(kinds, args):
    """{kind: Server} of every kind, started in order; each one started is stopped when the
    block ends, or when a later one fails to start."""
    with contextlib.ExitStack() as started:
        yield {k: started.enter_context(start_server(k, args)) for k in kinds}


def loadgen(args, server, op, clients):
    cmd = [args.loadgen, "--port", str(server.port), "--dialect", server.dialect, "--op", op,
           "--clients", str(clients), "--warmup-ms", str(args.warmup_ms),
           "--duration-ms", str(args.duration_ms)]
    user0, sys0 = server.cpu_seconds()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    user1, sys1 = server.cpu_seconds()
    if r.returncode != 0:
        return {"error": (r.stderr.strip() or f"exit {r.returncode}")[-300:]}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # Server CPU per operation over the whole run (warm-up included, so all its operations).
    n = out.get("total_ops") or 1
    out["user_us_per_op"] = (user1 - user0) * 1e6 / n
    out["cpu_us_per_op"] = ((user1 - user0) + (sys1 - sys0)) * 1e6 / n
    return out


def storm(args, server, total, processes):
    """`total` connections at once from `processes` generators, each from its own 127.0.0.x
    source address. Returns the generators' reports and the server's RSS while they hold."""
    per = total // processes
    # One client served first: the idle figure is then a store that has served (crun gives
    # back the pages only its start-up touched, base/proc.h, and serving maps some again).
    subprocess.run([args.loadgen, "--port", str(server.port), "--dialect", server.dialect,
                    "--storm", "1", "--storm-timeout-ms", "10000"], input="", capture_output=True,
                   text=True, timeout=60)
    idle = server.rss_kib()
    gens = []
    try:
        t0 = time.monotonic()
        for p in range(processes):
            cmd = [args.loadgen, "--port", str(server.port), "--dialect", server.dialect,
                   "--storm", str(per), "--storm-timeout-ms", str(args.storm_timeout_ms),
                   "--source", f"127.0.0.{p + 2}"]
            gens.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True))
        deadline = time.monotonic() + args.storm_timeout_ms / 1000 + STORM_REPORT_GRACE_S
        reports = [storm_report(g, deadline) for g in gens]
        wall = time.monotonic() - t0
        held_rss = server.rss_kib() if server.alive() else 0
        alive = server.alive()
    finally:
        # Each holds its connections until its stdin closes; each is ended, however we got here.
        errs = [end_generator(g) for g in gens]
    for r, err in zip(reports, errs):
        if "error" in r:
            r["error"] += err[-300:]
    held = sum(r.get("held", 0) for r in reports)
    refused = sum(r.get("refused", 0) for r in reports)
    pending = sum(r.get("pending", 0) for r in reports)
    slowest = max((r.get("seconds", 0) for r in reports), default=0)
    return {"attempted": per * processes, "held": held, "refused": refused, "pending": pending,
            "seconds": slowest, "wall": wall, "idle_kib": idle, "held_kib": held_rss,
            "server_alive": alive}


def storm_report(gen, deadline):
    """A storm generator's JSON report line, or {"error": ...} when it has none by `deadline`."""
    ready, _, _ = select.select([gen.stdout], [], [], max(0.0, deadline - time.monotonic()))
    line = gen.stdout.readline() if ready else ""
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return {"error": line or "no report by the storm's deadline; "}


def end_generator(gen):
    """Closes a generator's stdin (it then lets its connections go and exits), kills it if it
    has not exited within GENERATOR_END_LIMIT_S; its stderr."""
    try:
        _, err = gen.communicate(timeout=GENERATOR_END_LIMIT_S)
    except subprocess.TimeoutExpired:
        gen.kill()
        _, err = gen.communicate(timeout=STOP_LIMIT_S)
    return err or ""


def median_sample(samples):
    """The round with the median throughput (its latencies and CPU come with it), plus the
    spread of throughput across rounds."""
    good = [r for r in samples if "error" not in r]
    if not good or len(good) < len(samples):
        bad = [r for r in samples if "error" in r]
        return bad[0] if bad else {"error": "not run"}
    good.sort(key=lambda r: r["ops_per_s"])
    mid = dict(good[len(good) // 2])
    lo, hi = good[0]["ops_per_s"], good[-1]["ops_per_s"]
    mid["spread_pct"] = 100.0 * (hi - lo) / (2 * mid["ops_per_s"]) if mid["ops_per_s"] else 0
    return mid


def fmt_rate(r):
    if "error" in r:
        return "failed: " + r["error"].splitlines()[-1][:60]
    spread = f" ±{r['spread_pct']:.0f}%" if "spread_pct" in r else ""
    return (f"{r['ops_per_s']:,.0f}{spread} ({r['p50_us']:.0f}/{r['p99_us']:.0f} µs; "
            f"{r['cpu_us_per_op']:.1f}/{r['user_us_per_op']:.2f} µs)")


def main():
    if "--no-netns" not in sys.argv and "CRUN_BENCH_IN_NETNS" not in os.environ:
        sys.exit(in_private_netns([os.path.abspath(__file__), *sys.argv[1:]]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-netns", action="store_true", help="run on the host's network")
    ap.add_argument("--crun", required=True)
    ap.add_argument("--loadgen", required=True)
    ap.add_argument("--torch1-python", default="/usr/bin/python3")
    ap.add_argument("--torch2-python", required=True)
    ap.add_argument("--out", default="docs/benchmarks.md")
    ap.add_argument("--quick", action="store_true", help="short runs, small storm (smoke test)")
    ap.add_argument("--servers", help="comma-separated subset: crun-2x,torch2-libuv,"
                                      "torch2-classic,crun-1.13,torch1.13")
    ap.add_argument("--ops", help="comma-separated subset of set,get,add,wait")
    ap.add_argument("--clients", help="comma-separated client counts")
    ap.add_argument("--no-storm", action="store_true")
    args = ap.parse_args()
    args.measured_at = measured_at()  # before the run: the tree may change while it runs
    args.warmup_ms = 100 if args.quick else 300
    args.duration_ms = 300 if args.quick else 1500
    args.rounds = 1 if args.quick else 3
    args.storm_timeout_ms = 20000 if args.quick else 90000
    clients = [1, 8] if args.quick else [1, 64, 1000]
    storm_total = 400 if args.quick else 20000
    ops = ["set", "get", "add", "wait"]
    if args.ops:
        ops = args.ops.split(",")
    if args.clients:
        clients = [int(c) for c in args.clients.split(",")]

    groups = [("2.x wire dialect", ["crun-2x", "torch2-libuv", "torch2-classic"]),
              ("1.13 wire dialect", ["crun-1.13", "torch1.13"])]
    if args.servers:
        # A partial run prints its numbers and leaves docs/benchmarks.md alone.
        groups = [(t, [k for k in kinds if k in args.servers.split(",")]) for t, kinds in groups]
        groups = [(t, kinds) for t, kinds in groups if kinds]
    kinds_run = {k for _, kinds in groups for k in kinds}
    # Before any server starts: a torch that cannot run them is refused by name.
    versions = {}
    try:
        if kinds_run & set(NEEDS_USE_LIBUV):
            versions["torch2"] = require_use_libuv(args.torch2_python)
        if "torch1.13" in kinds_run:
            versions["torch1"] = torch_of(args.torch1_python)[0]
    except UnsupportedPython as e:
        print(f"store_bench.py: {e}", file=sys.stderr)
        sys.exit(2)
    results = {}
    storms = {}
    names = {}
    for _, kinds in groups:
        # All servers of a group run at once (an idle one uses no CPU) and are driven in turn,
        # round after round, so that drift in the machine's speed hits each of them alike.
        with running_servers(kinds, args) as servers:
            for k, server in servers.items():
                names[k] = server.name
                print(f"== {server.name} on port {server.port}", file=sys.stderr)
            for op in ops:
                for n in clients:
                    samples = {k: [] for k in kinds}
                    for _ in range(args.rounds):
                        for k in kinds:
                            if servers[k].alive():
                                samples[k].append(loadgen(args, servers[k], op, n))
                    for k in kinds:
                        results[(k, op, n)] = median_sample(samples[k])
                        print(f"   {names[k]:22} {op:4} x{n:<5} "
                              f"{fmt_rate(results[(k, op, n)])}", file=sys.stderr)
        if args.no_storm:
            continue
        for kind in kinds:
            # The storm gets a fresh server: its memory then reflects connections only.
            with start_server(kind, args) as server:
                s = storm(args, server, storm_total, 4)
            storms[kind] = s
            print(f"   {names[kind]} storm {s}", file=sys.stderr)

    if args.servers or args.ops or args.clients or args.no_storm:
        print("partial run: docs not written", file=sys.stderr)
        return
    write_report(args, versions, groups, names, results, storms, clients, ops, storm_total)


def write_report(args, versions, groups, names, results, storms, clients, ops, storm_total):
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    lines = []
    w = lines.append
    w("# Benchmarks")
    w("")
    w("Generated by `tests/bench/store_bench.py` (see *How to reproduce*); do not edit by hand.")
    w("")
    w(f"{args.measured_at} {os.cpu_count()} cores ({cpu}), Linux "
      f"{platform.release()}, PyTorch {versions['torch1']} (Debian) and {versions['torch2']} "
      f"(PyPI). The load generator and the server share the machine's cores, for every server "
      f"alike. Servers and load generators run in a private network namespace (loopback only)."
      f"{' QUICK MODE: short runs, not for quoting.' if args.quick else ''}")
    w("")
    w("## Store throughput and latency")
    w("")
    w("Closed loop: every connection keeps one operation in flight, as a c10d client does. Cells "
      "are operations/s with (p50/p99 latency; the server's CPU time per operation: all / "
      "user space only, from /proc/PID/stat). `set` is SET followed by CHECK (SET has no reply); "
      "`get` is a plain GET; `add` is ADD 1; `wait` is wait/wake: a waiter registers a WAIT, its "
      "partner connection then SETs the key, and the latency runs from that SET to the "
      "waiter's wake-up (clients = pairs, so 1,000 means 2,000 connections). "
      f"Each cell is the median of {args.rounds} rounds of {args.duration_ms / 1000:g} s (after "
      f"{args.warmup_ms} ms of warm-up), the servers of a table taking turns round by round; "
      "±x% is half the spread of throughput across the rounds.")
    for title, kinds in groups:
        w("")
        w(f"### {title}")
        w("")
        header = "| op | clients | " + " | ".join(names[k] for k in kinds) + " | crun / " + \
                 names[kinds[1]] + " |"
        w(header)
        w("|" + "---|" * (len(kinds) + 3))
        for op in ops:
            for n in clients:
                cells = [fmt_rate(results.get((k, op, n), {"error": "not run"})) for k in kinds]
                a = results.get((kinds[0], op, n), {})
                b = results.get((kinds[1], op, n), {})
                ratio = (f"{a['ops_per_s'] / b['ops_per_s']:.2f}×"
                         if a.get("ops_per_s") and b.get("ops_per_s") else "–")
                w(f"| {op} | {n:,} | " + " | ".join(cells) + f" | {ratio} |")
    w("")
    w("## Connection storm and memory")
    w("")
    w(f"{storm_total:,} connections opened at once by 4 generator processes (each from its own "
      "127.0.0.x source address), each doing one request round trip (2.x: VALIDATE + PING; "
      "1.13: GETNUMKEYS). Each server runs as its own process with a descriptor limit of "
      f"{soft_nofile()} (RLIMIT_NOFILE). *held*: connections served; *refused*: closed by the "
      "server; *pending*: neither within the time limit. Memory is the server's RSS while "
      "holding them, minus its idle RSS; the 100,000-connection column projects that per-"
      "connection cost.")
    w("")
    w("| server | held | refused | pending | time to resolve all | idle RSS | RSS holding | "
      "per connection | 100,000 connections |")
    w("|---|---|---|---|---|---|---|---|---|")
    for _, kinds in groups:
        for k in kinds:
            s = storms[k]
            per = ((s["held_kib"] - s["idle_kib"]) * 1024 / s["held"]) if s["held"] and \
                s["held_kib"] else 0
            proj = (s["idle_kib"] * 1024 + per * 100000) / 2**20 if per else 0
            note = "" if s["server_alive"] else " (server died)"
            w(f"| {names[k]}{note} | {s['held']:,} | {s['refused']:,} | {s['pending']:,} | "
              f"{s['seconds']:.2f} s | {s['idle_kib'] / 1024:.1f} MiB | "
              f"{s['held_kib'] / 1024:.1f} MiB | {per:,.0f} B | {proj:,.0f} MiB |")
    w("")
    w("## How to reproduce")
    w("")
    w("```sh")
    w("bash scripts/build.sh -DCRUN_TORCH2_PYTHON=\"$(bash scripts/setup-torch2.sh)\"")
    w("python3 tests/bench/store_bench.py --crun build/launcher/crun \\")
    w("    --loadgen build/tests/bench/store_loadgen \\")
    w("    --torch2-python \"$(bash scripts/setup-torch2.sh)\"")
    w("```")
    w("")
    # Hand-written analysis below the marker survives regeneration.
    kept = ""
    if os.path.exists(args.out):
        with open(args.out) as f:
            old = f.read()
        if NOTES_MARKER in old:
            kept = old[old.index(NOTES_MARKER):]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n" + (kept or NOTES_MARKER + "\n"))
    print(f"wrote {args.out}", file=sys.stderr)


def soft_nofile():
    import resource
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


if __name__ == "__main__":
    main()
