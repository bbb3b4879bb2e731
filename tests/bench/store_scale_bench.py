#!/usr/bin/env python3
"""The store at rank scale: N simulated ranks meet at one store, as a job's ranks do at its
start. Every client connects at once, sets a key of its own and waits on one shared key (WAIT,
then GETNUMKEYS, whose answer says the wait is registered); then one more client sets the
shared key and every waiter must wake. crun's store (`crun store`, 2.x dialect) against
PyTorch 2.x's libuv store (the default since 2.4), a fresh server each run, alternating, in
one run, at each of --clients. The clients come from one store_loadgen process per 12,500,
each from its own 127.0.0.x source address (a source address has about 28,000 ephemeral
ports). Servers and generators get a descriptor limit of N + 4,096, at most the hard limit
this process has: where that is below N (a container without CAP_SYS_RESOURCE cannot raise
it), one server cannot hold N connections, and the bench says so instead of running that N.

Measured: connect → every client set and registered (the slowest generator's); go → every
client woken (from the moment the bench says go); the server's RSS holding them, above its
idle RSS; its CPU in each phase. A run that did not end with every client registered and
woken counts as failed, with what was missing. Writes the store-scale-bench section of
docs/benchmarks.md. Runs in a private network namespace (needs root).

Usage: store_scale_bench.py --crun BIN --loadgen BIN --torch2-python PY
                            [--clients 10000,30000,100000] [--rounds 3] [--out FILE]
"""
import argparse
import json
import os
import resource
import select
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
sys.path.insert(0, HERE)
from bench_support import in_private_netns, measured_at, write_section  # noqa: E402
from store_bench import SERVER_SCRIPT, UnsupportedPython, require_use_libuv  # noqa: E402

PER_GENERATOR = 12500
LIMIT_S = 300  # one phase of one run
KINDS = (("crun", "crun store"), ("libuv", "PyTorch 2.x libuv"))


def hard_nofile():
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def limit_nofile(n):
    n = min(n, hard_nofile())

    def apply():
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return apply


# Descriptors a server needs beside its clients' (its listener, Python's own files).
SPARE_FDS = 256


def read_line(proc, what, timeout=LIMIT_S):
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    if not line and proc.poll() is not None:
        raise RuntimeError(f"{what}: exited {proc.returncode}: {proc.stderr.read()[-300:]}")
    if not line:
        raise RuntimeError(f"{what}: nothing within {timeout} s")
    return line


def proc_figures(pid):
    """(RSS in KiB, CPU seconds) of a process."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return rss, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(args, kind, clients):
    if kind == "crun":
        cmd = [args.crun, "store", "--host", "127.0.0.1", "--port", "0", "--log-level", "error"]
    else:
        cmd = [args.torch2_python, "-c", SERVER_SCRIPT, "libuv"]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=limit_nofile(clients + 4096))
    try:
        line = read_line(p, f"{kind} store start", 120)
        if "listening on" not in line:
            raise RuntimeError(f"{kind} store: {line!r}")
        return p, int(line.rsplit(":", 1)[1])
    except BaseException:
        p.kill()  # a server that did not say where it listens is not left running
        p.wait(timeout=30)
        raise


def run_once(args, kind, clients):
    """One run: the figures, or {"failed": why}."""
    if clients + SPARE_FDS > hard_nofile():
        return {"failed": f"not run: one process may hold {hard_nofile():,} descriptors here "
                          "(the hard RLIMIT_NOFILE, which this container cannot raise)"}
    server, port = start_server(args, kind, clients)
    gens = []
    try:
        # One client first: the idle figure is a store that has served one.
        subprocess.run([args.loadgen, "--port", str(port), "--storm", "1"], input="",
                       capture_output=True, text=True, timeout=60)
        idle_kib, cpu0 = proc_figures(server.pid)
        key = f"/scale/go/{os.getpid()}.{time.monotonic_ns()}"
        per = -(-clients // PER_GENERATOR)
        for g in range(per):
            n = min(PER_GENERATOR, clients - g * PER_GENERATOR)
            gens.append(subprocess.Popen(
                [args.loadgen, "--port", str(port), "--storm", str(n), "--storm-timeout-ms",
                 str(LIMIT_S * 1000), "--barrier", key, "--source", f"127.0.0.{g + 2}"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                preexec_fn=limit_nofile(n + 4096)))
        storms = [json.loads(read_line(g, "a generator's storm")) for g in gens]
        for g in gens:  # printed with the line above: already in the pipe's buffer
            if g.stdout.readline().strip() != "READY":
                raise RuntimeError("a generator did not say READY")
        held_kib, cpu1 = proc_figures(server.pid)
        held = sum(s["held"] for s in storms)
        if held < clients:
            return {"failed": f"{clients - held} of {clients:,} not registered "
                              f"({sum(s['refused'] for s in storms)} refused)"}
        for i, g in enumerate(gens):  # the first sets the key; every one times its wake-ups
            g.stdin.write("go set\n" if i == 0 else "go\n")
            g.stdin.flush()
        goes = [json.loads(read_line(g, "a generator's wake-ups")) for g in gens]
        _, cpu2 = proc_figures(server.pid)
        woken = sum(x["woken"] for x in goes)
        if woken < clients:
            return {"failed": f"{clients - woken} of {clients:,} not woken"}
        return {"registered_s": max(s["seconds"] for s in storms),
                "woken_s": max(x["seconds"] for x in goes),
                "above_idle_kib": held_kib - idle_kib,
                "cpu_registering_s": cpu1 - cpu0, "cpu_waking_s": cpu2 - cpu1}
    except (RuntimeError, ValueError, KeyError) as e:
        return {"failed": str(e)[:300]}
    finally:
        for g in gens:
            try:
                g.stdin.close()
            except OSError:
                pass
            try:
                g.wait(timeout=60)
            except subprocess.TimeoutExpired:
                g.kill()
                g.wait()
        server.kill()
        server.communicate(timeout=60)


def main():
    if "CRUN_BENCH_IN_NETNS" not in os.environ:
        sys.exit(in_private_netns([os.path.abspath(__file__), *sys.argv[1:]]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--crun", required=True)
    ap.add_argument("--loadgen", required=True)
    ap.add_argument("--torch2-python", required=True)
    ap.add_argument("--clients", default=f"10000,{hard_nofile() - SPARE_FDS - 744},30000,100000",
                    help="client counts (default: 10,000, the most this machine's descriptor "
                         "limit allows, 30,000 and 100,000)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="docs/benchmarks.md")
    ap.add_argument("--no-write", action="store_true", help="print, leave the docs alone")
    args = ap.parse_args()
    try:
        require_use_libuv(args.torch2_python)  # its libuv server: refused before anything starts
    except UnsupportedPython as e:
        print(f"store_scale_bench.py: {e}", file=sys.stderr)
        sys.exit(2)
    args.measured_at = measured_at()
    counts = [int(c) for c in args.clients.split(",")]
    results = {}
    for n in counts:
        for r in range(args.rounds):
            order = KINDS if r % 2 == 0 else tuple(reversed(KINDS))
            for kind, name in order:
                got = run_once(args, kind, n)
                results.setdefault((kind, n), []).append(got)
                print(f"{name} x{n:,}: {got}", file=sys.stderr, flush=True)
    if args.no_write:
        return
    write(args, counts, results)


def median_of(runs, key):
    ok = sorted(r[key] for r in runs if "failed" not in r)
    return ok[len(ok) // 2] if ok else None


def not_run(runs):
    return all(r.get("failed", "").startswith("not run") for r in runs)


def cell(runs, key, fmt):
    if not_run(runs):
        return "not run (1)"
    failed = [r for r in runs if "failed" in r]
    v = median_of(runs, key)
    if v is None:
        return f"failed {len(failed)} of {len(runs)}: {failed[0]['failed']}"
    return fmt(v) + (f" ({len(failed)} of {len(runs)} failed)" if failed else "")


def somaxconn():
    with open("/proc/sys/net/core/somaxconn") as f:
        return f"{int(f.read()):,}"


def write(args, counts, results):
    rows = [("connect → every client set a key and waits", "registered_s",
             lambda v: f"{v:,.2f} s"),
            ("one set → every client woken", "woken_s", lambda v: f"{v * 1000:,.0f} ms"),
            ("server CPU, connecting and registering", "cpu_registering_s",
             lambda v: f"{v:,.2f} s"),
            ("server CPU, waking", "cpu_waking_s", lambda v: f"{v * 1000:,.0f} ms"),
            ("server RSS above idle, holding them", "above_idle_kib",
             lambda v: f"{v / 1024:,.0f} MiB")]
    header = "| | " + " | ".join(f"{name}, {n:,}" for n in counts for _, name in KINDS) + " |"
    lines = [
        "## The store at rank scale", "",
        "`tests/bench/store_scale_bench.py`: N simulated ranks meet at one store, as a job's "
        "ranks do at its start. Every client connects at once (one `store_loadgen` process per "
        f"{PER_GENERATOR:,}, each from its own 127.0.0.x source address), sets a key of its "
        "own and waits on one shared key; then one more client sets it and every waiter must "
        "wake. crun's store (2.x dialect) against PyTorch 2.x's libuv store, a fresh server "
        f"each run, alternating; median of {args.rounds} run(s). Servers and generators get a "
        "descriptor limit of N + 4,096, at most the hard limit, "
        f"{hard_nofile():,} here; a private network namespace with only loopback "
        f"(somaxconn {somaxconn()}). " + args.measured_at, "",
        header, "|---|" + "---|" * (len(counts) * len(KINDS))]
    for title, key, fmt in rows:
        lines.append(f"| {title} | " + " | ".join(
            cell(results[(kind, n)], key, fmt) for n in counts for kind, _ in KINDS) + " |")
    if any(not_run(runs) for runs in results.values()):
        lines += ["", f"(1) One process may hold {hard_nofile():,} descriptors on this machine: "
                  "that is the hard RLIMIT_NOFILE, and the container lacks CAP_SYS_RESOURCE to "
                  "raise it, so neither store can hold that many connections here. Both serve "
                  "every connection from one process; on a host with the limit raised "
                  "(`ulimit -n`, LimitNOFILE=), the same command runs these columns."]
    lines += ["", "Reproduce: `python3 tests/bench/store_scale_bench.py --crun build/launcher/crun "
              "--loadgen build/tests/bench/store_loadgen --torch2-python "
              "\"$(bash scripts/setup-torch2.sh)\"`"]
    write_section(args.out, "store-scale-bench", lines)


if __name__ == "__main__":
    main()
