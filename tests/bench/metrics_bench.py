#!/usr/bin/env python3
"""What a Prometheus scrape costs the rendezvous daemon (docs/observability.md).

A `crun rendezvous --metrics-port 0` daemon holds one job of N simulated agents
(tests/bench/rdzv_loadgen.cc: each a real crun.v1 session, heartbeating every second through
its steady phase). While they heartbeat, the daemon's CPU (user + system, /proc) is read over
a window without scrapes, then over --scrapes back-to-back scrapes on one keep-alive HTTP
connection: a scrape's CPU is the difference, divided by the scrapes. Also each scrape's
latency (request to last byte), the page's size and series, and the same on an idle daemon.
Every page is checked: it shows N agents connected.

There is no anchor run beside it: neither torchrun nor torchelastic serves metrics (the
latter's default handler is a null one). The reference is the scrape interval: Prometheus
asks every 15 s by default, 1 s at the most eager.

Usage: metrics_bench.py --crun BIN --loadgen BIN [--agents 10000] [--jobs 1000] [--scrapes 2000]
                        [--out docs/benchmarks.md]
"""
import argparse
import http.client
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from bench_support import measured_at, table_rows, write_section  # noqa: E402

LIMIT_S = 300
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def read_line(stream, needle):
    """Reads lines until one holds `needle`. Blocking reads end: the daemon prints its lines
    at once or exits, and the load generator ends each phase by its own deadline."""
    seen = []
    for line in stream:
        seen.append(line)
        if needle in line:
            return line
    raise RuntimeError(f"no line with {needle!r}: {''.join(seen)[-1500:]}")


def start_daemon(crun, keep_jobs):
    p = subprocess.Popen([crun, "rendezvous", "--host", "127.0.0.1", "--port", "0",
                          "--metrics-port", "0", "--log-level", "warn", "--keep-finished-jobs",
                          str(keep_jobs)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = int(read_line(p.stdout, "listening on").rsplit(":", 1)[1])
        url = read_line(p.stdout, "metrics on").split("metrics on ", 1)[1].strip()
        host_port = url.split("//", 1)[1].split("/", 1)[0]
        return p, port, int(host_port.rsplit(":", 1)[1])
    except Exception:
        p.kill()  # a daemon that did not say where it listens is not left running
        p.communicate(timeout=60)
        raise


def scrape_window(pid, metrics_port, scrapes, agents, jobs):
    """Back-to-back scrapes on one connection: (latencies in ms, CPU s, wall s, last page)."""
    conn = http.client.HTTPConnection("127.0.0.1", metrics_port, timeout=30)
    latencies, page = [], ""
    c0, t0 = cpu_s(pid), time.monotonic()
    for _ in range(scrapes):
        s = time.perf_counter()
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        page = r.read().decode()
        latencies.append((time.perf_counter() - s) * 1000)
        if r.status != 200:
            raise RuntimeError(f"scrape answered {r.status}")
    wall, cpu = time.monotonic() - t0, cpu_s(pid) - c0
    conn.close()
    for want in (f"crun_rendezvous_agents_connected {agents}",
                 f'crun_rendezvous_jobs{{phase="succeeded"}} {jobs}'):
        if want not in page.splitlines():
            raise RuntimeError(f"the page does not show {want}")
    return latencies, cpu, wall, page


def quiet_window(pid, seconds):
    """The daemon's CPU rate (s per s) over `seconds` without scrapes (a deadline, not a
    synchronisation: the load it measures runs meanwhile)."""
    c0, t0 = cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_s(pid) - c0) / (time.monotonic() - t0)


def measure(args, agents, jobs=0):
    """`agents` heartbeating in one job, or `jobs` ended jobs of one agent each, kept."""
    daemon, port, metrics_port = start_daemon(args.crun, max(jobs, 64))
    loadgen = None
    try:
        for i in range(jobs):  # each runs its phases to the end: a succeeded job, kept
            r = subprocess.run([args.loadgen, "--endpoint", f"127.0.0.1:{port}", "--agents",
                                "1", "--channels", "1", "--steady-ms", "0", "--run-id",
                                f"job-{i}"], capture_output=True, text=True, timeout=LIMIT_S)
            if r.returncode != 0:
                raise RuntimeError(f"rdzv_loadgen job-{i}: {r.stderr[-600:]}")
        if agents:
            # A steady phase long enough for both windows; the loadgen says when its measured
            # part begins: every agent has beaten once and beats as datagrams from then on.
            loadgen = subprocess.Popen(
                [args.loadgen, "--endpoint", f"127.0.0.1:{port}", "--agents", str(agents),
                 "--steady-ms", str(int(args.window_s * 2000 + 30000))],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            read_line(loadgen.stderr, "rdzv_loadgen: steady   measured from now")
        base = quiet_window(daemon.pid, args.window_s)
        latencies, cpu, wall, page = scrape_window(daemon.pid, metrics_port, args.scrapes,
                                                   agents, jobs)
        per_scrape = max(0.0, cpu - base * wall) / args.scrapes
        series = sum(1 for x in page.splitlines() if x and not x.startswith("#"))
        latencies.sort()
        result = {
            "agents": agents,
            "jobs": jobs,
            "latency_median_ms": statistics.median(latencies),
            "latency_p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
            "cpu_per_scrape_ms": per_scrape * 1000,
            "base_cpu_percent": base * 100,
            "page_bytes": len(page.encode()),
            "series": series,
        }
        print(f"  {agents} agents, {jobs} jobs: scrape {result['latency_median_ms']:.2f} ms median, "
              f"{result['cpu_per_scrape_ms']:.3f} ms CPU, {series} series", file=sys.stderr)
        return result
    finally:
        # Each is ended on its own: one that ignores SIGTERM is killed, and does not keep the
        # other running.
        for p in (loadgen, daemon):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.communicate(timeout=60)


def scenario(r):
    if r["agents"]:
        return f"{r['agents']:,} agents in one job"
    if r["jobs"]:
        return f"{r['jobs']:,} ended jobs kept"
    return "idle daemon"


def write(args, results):
    lines = [
        "## Metrics scrape", "",
        "`tests/bench/metrics_bench.py`: what one Prometheus scrape of `crun rendezvous "
        "--metrics-port` costs while the daemon holds one job of simulated agents "
        "(`rdzv_loadgen`, real crun.v1 sessions) that heartbeat every second. *CPU per "
        "scrape*: the daemon's CPU (user + system, /proc) over "
        f"{args.scrapes} back-to-back scrapes on one keep-alive connection, less its rate "
        f"over {args.window_s:g} s without scrapes (the heartbeats' share), divided by the "
        "scrapes. *Latency*: request to last byte. No anchor runs beside it: neither torchrun "
        "nor torchelastic serves metrics; the reference is the scrape interval (15 s by "
        "default). " + args.measured_at, "",
        "| | " + " | ".join(scenario(r) for r in results) + " |",
        "|---|" + "---|" * len(results)]
    rows = [
        ("scrape latency, median · p99",
         lambda r: f"{r['latency_median_ms']:.2f} · {r['latency_p99_ms']:.2f} ms"),
        ("daemon CPU per scrape", lambda r: f"{r['cpu_per_scrape_ms']:.2f} ms"),
        ("… at one scrape each 15 s", lambda r: f"{r['cpu_per_scrape_ms'] / 150:.4f} % of a core"),
        ("daemon CPU without scrapes (heartbeats)",
         lambda r: f"{r['base_cpu_percent']:.1f} % of a core"),
        ("page: series · bytes", lambda r: f"{r['series']:,} · {r['page_bytes']:,} B"),
    ]
    lines += table_rows(rows, results)
    lines += ["", "The page does not grow with the agents: the daemon's series are per job "
              "(`run_id`), never per node or host (docs/observability.md, Label cardinality), "
              "so a scrape reads counters and walks the jobs, not the sessions. It grows with "
              "the jobs held (`--keep-finished-jobs`, 64 by default): the last column keeps "
              f"{results[-1]['jobs']:,}.", "",
              "Reproduce: `python3 tests/bench/metrics_bench.py --crun build/launcher/crun "
              "--loadgen build/tests/bench/rdzv_loadgen`"]
    write_section(args.out, "metrics-bench", lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--crun", required=True)
    ap.add_argument("--loadgen", required=True, help="the rdzv_loadgen binary")
    ap.add_argument("--agents", type=int, default=10000)
    ap.add_argument("--jobs", type=int, default=1000, help="ended jobs kept, the third case")
    ap.add_argument("--scrapes", type=int, default=2000)
    ap.add_argument("--window-s", type=float, default=3.0,
                    help="seconds of the window without scrapes")
    ap.add_argument("--out", default=os.path.join(HERE, "..", "..", "docs", "benchmarks.md"))
    args = ap.parse_args()
    args.measured_at = measured_at()
    results = [measure(args, 0), measure(args, args.agents), measure(args, 0, args.jobs)]
    write(args, results)


if __name__ == "__main__":
    main()
