"""Rendezvous benchmark: crun's rendezvous service and crun's etcd rendezvous (a 3-member etcd
on loopback, Debian's etcd-server) against torchrun's c10d rendezvous (PyTorch 2.x from PyPI),
same machine, same run. Writes its section of docs/benchmarks.md (between the rdzv-bench
markers).

  * launch -> all workers running, N real agents on loopback (N = 2, 4, 8, 16, 64): N launcher
    processes started together with `--nnodes N --nproc-per-node 1`, the first one hosting
    the rendezvous (is_host); each worker (restart_probe ... start; an argument torchrun cannot mistake for its own option) stamps its first instruction.
    Time: from just before the first launcher is started to the last worker's stamp.
  * failure -> every node's replacement workers running, 3 nodes x 2 workers: rank 0 fails
    once every worker runs; time from its stamp to the last replacement's.
  * the store's host lost (etcd only: with crun's hosted service or torchrun's c10d the job
    ends with it), 3 nodes x 1 worker (--nnodes 2:3): group rank 0's crun and worker are
    SIGKILLed; time to the two survivors' new workers running.
  * simulated agents (rdzv_loadgen) against one `crun rendezvous` daemon: 1,000 and 10,000
    agents forming a round, heartbeating, restarting after a failure, finishing; the
    daemon's CPU time and RSS.

Everything runs in a private network namespace with only loopback (needs root), like
store_bench.py.

Usage: rdzv_bench.py --crun BIN --probe BIN --loadgen BIN --torch2-python PY
                     [--rounds 5] [--torch-rounds 3] [--out FILE]
"""
import argparse
import collections
import glob
import json
import os
import re
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from bench_support import in_private_netns, measured_at, table_rows, write_section  # noqa: E402
from crun_testing import free_port, wait_for  # noqa: E402
from etcd_cluster import EtcdCluster, Loopback  # noqa: E402

AGENTS = (2, 4, 8, 16, 64)
SIMULATED = (1000, 10000, 30000, 100000)
ONE_RUN_FROM = 100000  # one run from here up (about 2 minutes each), else the median of 3
STEADY_MS = 3000
# The heartbeat rows that check.py reads (its BEATS_10K check).
BEAT_ROW = "daemon CPU per heartbeat (a datagram)"
STREAM_BEAT_ROW = "daemon CPU per heartbeat on its gRPC stream (--stream-beats)"
BARE_BEAT_ROW = "bare gRPC server CPU per message, the same beats on its streams"
ETCD_SIMULATED = (100, 1000, 3000, 10000)
ETCD_ONE_RUN_FROM = 3000  # one run from here up (10,000: minutes), else the median of 3
ETCD_PHASE_MS = 300_000  # a phase's limit through etcd (10,000 agents form in minutes here)
ETCD_FORM_ROW = "form a round (each agent: lease, node key with its join, its ranks/ key)"  # check.py
LIMIT_S = 300



def agent_cmd(args, launcher, n, i, port, nproc, max_restarts, nnodes=None):
    host = "1" if i == 0 else "0"
    if launcher == "etcd":
        # A run id of its own each run (port is unique per run): the last run's keys stay.
        return [args.crun, "--nnodes", nnodes or str(n), "--nproc-per-node", str(nproc),
                "--rdzv-backend", "etcd-v3", "--rdzv-endpoint", args.etcd.endpoints(),
                "--rdzv-id", f"bench{port}", "--max-restarts", str(max_restarts),
                "--rdzv-conf", f"node_id=n{i}"]
    common = ["--nnodes", str(n), "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "bench",
              "--max-restarts", str(max_restarts)]
    if launcher == "crun":
        return [args.crun, *common, "--rdzv-conf", f"is_host={host},node_id=n{i}"]
    return [args.torch2_python, "-m", "torch.distributed.run", *common,
            "--rdzv-conf", f"is_host={host}", "--monitor-interval", "0.1"]


def start_agents(args, launcher, n, nproc, probe_args, max_restarts=0, nnodes=None):
    """Starts n agents at once; returns (start time in ns, output dir, processes)."""
    out = tempfile.mkdtemp(prefix="crun-rdzv-bench-")
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", LOGLEVEL="WARNING")
    t0 = time.time_ns()
    procs = []
    try:
        for i in range(n):
            procs.append(subprocess.Popen(
                [*agent_cmd(args, launcher, n, i, port, nproc, max_restarts, nnodes),
                 "--no-python", args.probe, out, *probe_args],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env))
    except BaseException:
        kill_agents(procs)  # the agents started before one failed to start
        raise
    return t0, out, procs


def kill_agents(procs):
    """SIGKILLs and reaps the agents; their pipes are not read (a worker that outlived its
    agent may hold one open for as long as it runs)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait(timeout=30)


def run_agents(args, launcher, n, nproc, probe_args, max_restarts=0):
    """Starts n agents at once; returns (start time in ns, output dir) once all exit 0."""
    t0, out, procs = start_agents(args, launcher, n, nproc, probe_args, max_restarts)
    failed = []
    for i, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=LIMIT_S)
        except subprocess.TimeoutExpired:
            kill_agents(procs)
            raise RuntimeError(f"{launcher}: {n} agents did not finish within {LIMIT_S} s")
        if p.returncode != 0:
            failed.append(f"agent {i} exited {p.returncode}: {err[-400:]}")
    if failed:
        raise RuntimeError(f"{launcher} x{n}: " + "; ".join(failed[:2]))
    return t0, out


def stamps(out, prefix):
    values = []
    for path in glob.glob(os.path.join(out, prefix + "*")):
        with open(path) as f:
            values.append(int(f.read()))
    return values


def launch_to_running(args, launcher, n):
    t0, out = run_agents(args, launcher, n, 1, ["start"])
    starts = stamps(out, "start_")
    shutil.rmtree(out)
    if len(starts) != n:
        raise RuntimeError(f"{launcher} x{n}: {len(starts)} of {n} workers started")
    return (max(starts) - t0) / 1e6


def failure_to_restarted(args, launcher, nodes=3, nproc=2):
    _, out = run_agents(args, launcher, nodes, nproc, [], max_restarts=1)
    crash = stamps(out, "crash")
    starts = stamps(out, "start_")
    shutil.rmtree(out)
    if len(crash) != 1 or len(starts) != nodes * nproc:
        raise RuntimeError(f"{launcher}: {len(starts)} of {nodes * nproc} replacements started")
    return (max(starts) - crash[0]) / 1e6


def store_host_lost(args, nodes=3):
    """etcd only: group rank 0's machine lost (its crun and worker SIGKILLed) -> the survivors'
    new workers running."""
    _, out, procs = start_agents(args, "etcd", nodes, 1, ["hold"], nnodes=f"2:{nodes}")
    try:
        wait_for(lambda: len(glob.glob(os.path.join(out, "held_*"))) == nodes,
                 f"{nodes} workers running", limit=LIMIT_S)
        (rank0,) = glob.glob(os.path.join(out, "held_0_*"))
        open(os.path.join(out, "lost"), "w").close()
        lost = time.time_ns()
        procs[0].kill()  # node_id n0: group rank 0 (the same host name for all, then by id)
        os.kill(int(rank0.rsplit("_", 1)[1]), 9)
        procs[0].communicate(timeout=LIMIT_S)
        for i, p in enumerate(procs[1:], 1):
            _, err = p.communicate(timeout=LIMIT_S)
            if p.returncode != 0:
                raise RuntimeError(f"etcd store-host loss: agent {i} exited {p.returncode}: "
                                   f"{err[-400:]}")
        starts = stamps(out, "start_")
        if len(starts) != nodes - 1:
            raise RuntimeError(f"etcd store-host loss: {len(starts)} of {nodes - 1} started")
        return (max(starts) - lost) / 1e6
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
        shutil.rmtree(out, ignore_errors=True)


def start_daemon(crun):
    p = subprocess.Popen([crun, "rendezvous", "--host", "127.0.0.1", "--port", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready, _, _ = select.select([p.stdout], [], [], 30)
    line = p.stdout.readline() if ready else ""
    if "listening on" not in line:
        p.kill()
        p.communicate(timeout=30)
        raise RuntimeError(f"crun rendezvous did not start: {line!r}")
    return p, int(line.rsplit(":", 1)[1])


def simulated(args, agents, steady_ms=STEADY_MS, extra=()):
    daemon, port = start_daemon(args.crun)
    try:
        r = subprocess.run([args.loadgen, "--endpoint", f"127.0.0.1:{port}", "--agents",
                            str(agents), "--service-pid", str(daemon.pid), "--steady-ms",
                            str(steady_ms), *extra], capture_output=True, text=True,
                           timeout=LIMIT_S)
    finally:
        daemon.terminate()
        try:
            daemon.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.communicate(timeout=30)
    return loadgen_json(r, f"rdzv_loadgen x{agents}")


def bare_baseline(args, agents, steady_ms=STEADY_MS):
    """A bare gRPC server (bare_session_server.cc) holding `agents` sessions of the load
    generator's, which then beat on their streams for `steady_ms`: its RSS with the sessions
    open, in MiB (the floor under the daemon's memory), and its CPU per message, in µs (what any
    heartbeat on a stream costs)."""
    p = subprocess.Popen([args.bare_server, "--port", "0"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([p.stdout], [], [], 30)
        line = p.stdout.readline() if ready else ""
        if "listening on" not in line:
            raise RuntimeError(f"bare_session_server did not start: {line!r}")
        port = int(line.rsplit(":", 1)[1])
        r = subprocess.run([args.loadgen, "--endpoint", f"127.0.0.1:{port}", "--agents",
                            str(agents), "--service-pid", str(p.pid), "--open-only",
                            "--steady-ms", str(steady_ms)],
                           capture_output=True, text=True, timeout=LIMIT_S)
    finally:
        p.kill()
        p.communicate(timeout=30)
    got = loadgen_json(r, f"rdzv_loadgen --open-only x{agents}")
    return got["service_rss_connected_mib"], per_beat_micros(got) if steady_ms else None


def above_bare_kib(r):
    """The daemon's memory per agent above the bare server's, heartbeating, in KiB."""
    return (r["steady"]["service_rss_mib"] - r["bare_rss_mib"]) * 1024 / r["agents"]


def per_beat_micros(r):
    """The daemon's CPU per heartbeat while the agents heartbeat, in µs."""
    steady = r["steady"]
    return steady["service_cpu_percent"] / 100 * steady["s"] / steady["heartbeats"] * 1e6


def micros(v):
    """"12.3 µs", or "–" where the figure was not measured."""
    return "–" if v is None else f"{v:.1f} µs"


def loadgen_json(r, what):
    """rdzv_loadgen's figures from its stdout, or an error that shows what it wrote instead."""
    if r.returncode != 0:
        raise RuntimeError(f"{what}: {r.stderr[-600:]}")
    try:
        return json.loads(r.stdout)
    except ValueError as e:
        raise RuntimeError(f"{what} wrote no JSON ({e}): {r.stdout[:600]!r}; "
                           f"stderr: {r.stderr[-600:]}") from None


def etcd_simulated(args, agents, steady_ms=3000):
    """rdzv_loadgen --etcd against a fresh 3-member etcd on loopback (its members' CPU and RSS
    summed)."""
    ports = {h: (free_port(), free_port()) for h in ("e1", "e2", "e3")}
    root = tempfile.mkdtemp(prefix="crun-rdzv-bench-etcd-sim-")
    try:
        with EtcdCluster(Loopback(), ["e1", "e2", "e3"], root, ports=ports) as etcd:
            pids = [a for p in etcd.procs.values() for a in ("--service-pid", str(p.pid))]
            r = subprocess.run([args.loadgen, "--etcd", etcd.endpoints(), "--agents",
                                str(agents), "--steady-ms", str(steady_ms),
                                "--phase-timeout-ms", str(ETCD_PHASE_MS), *pids],
                               capture_output=True, text=True,
                               timeout=4 * ETCD_PHASE_MS / 1000 + LIMIT_S)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if r.returncode != 0 and agents >= ETCD_ONE_RUN_FROM:
        return etcd_failure(agents, r.stderr)
    return loadgen_json(r, f"rdzv_loadgen --etcd x{agents}")


def etcd_failure(agents, stderr):
    """A size tried through etcd that did not get through every phase, as a figure: the phase,
    how many agents reached it, and the agents' most common reason to give up."""
    m = re.search(r"phase '(\w+)': only (\d+) of (\d+) agents within (\d+) ms", stderr)
    if not m:
        raise RuntimeError(f"rdzv_loadgen --etcd x{agents}: {stderr[-600:]}")
    reasons = collections.Counter(
        re.sub(r"\d+(\.\d+)*(:\d+)?", "N", line.split(": the job ended: ", 1)[1])[:160]
        for line in stderr.splitlines() if ": the job ended: " in line)
    reason, count = reasons.most_common(1)[0] if reasons else ("none given", 0)
    print(f"  etcd x{agents}: {m.group(0)}; {count} agents ended: {reason}", file=sys.stderr)
    return {"agents": agents, "failed": {"phase": m.group(1), "reached": int(m.group(2)),
                                         "limit_s": int(m.group(4)) / 1000,
                                         "ended": sum(reasons.values()),
                                         "reason": reason, "reason_count": count}}


TIDY_RESTARTS = 500
TIDY_RETENTION_S = 5


def etcd_tidy(args):
    """One real agent through the bench's etcd: TIDY_RESTARTS restarts, then the keys under the
    run's prefix when the job has ended and how long after its end etcd_retention removed
    them."""
    run_id = f"tidy-{os.getpid()}"
    prefix = f"/crun/rdzv/{run_id}/"
    worker = f'test "$TORCHELASTIC_RESTART_COUNT" = {TIDY_RESTARTS}'
    r = subprocess.run(
        [args.crun, "--nnodes", "1", "--nproc-per-node", "1", "--rdzv-backend", "etcd-v3",
         "--rdzv-endpoint", args.etcd.endpoints(), "--rdzv-id", run_id, "--rdzv-conf",
         f"etcd_retention={TIDY_RETENTION_S}", "--max-restarts", str(TIDY_RESTARTS),
         "--max-restarts-without-progress", "0", "--monitor-interval", "0.1", "--no-python",
         "/bin/sh", "-c", worker], capture_output=True, text=True, timeout=LIMIT_S)
    ended = time.monotonic()
    if r.returncode != 0:
        raise RuntimeError(f"etcd tidy run exited {r.returncode}: {r.stderr[-600:]}")

    def keys():
        return args.etcd.etcdctl("get", "--prefix", "--keys-only", prefix).stdout.split()
    after = keys()
    wait_for(lambda: keys() == [], "the run's keys to go after etcd_retention",
             limit=TIDY_RETENTION_S + 60)
    gone_s = time.monotonic() - ended
    rounds = len([k for k in after if k.startswith(prefix + "rounds/")])
    stores = len([k for k in after if k.startswith(prefix + "a/stores/")])
    print(f"  etcd tidy: {len(after)} keys after {TIDY_RESTARTS} restarts, gone in "
          f"{gone_s:.1f} s", file=sys.stderr)
    return {"keys": len(after), "rounds": rounds, "stores": stores, "gone_s": gone_s}


def median_run(fn, agents, what, one_run_from=ONE_RUN_FROM):
    runs = [fn(agents) for _ in range(1 if agents >= one_run_from else 3)]
    if "failed" in runs[0]:
        return runs[0]
    runs.sort(key=lambda r: r["form"]["ms"])
    median = runs[len(runs) // 2]  # the run with the median formation time
    print(f"  {what} x{agents}: form {median['form']['ms']:.0f} ms", file=sys.stderr)
    return median


def measure(fn, rounds, what):
    values = []
    for _ in range(rounds):
        values.append(fn())
        print(f"  {what}: {values[-1]:,.1f} ms", file=sys.stderr)
    return statistics.median(values)


def main():
    if "CRUN_BENCH_IN_NETNS" not in os.environ:
        sys.exit(in_private_netns([os.path.abspath(__file__), *sys.argv[1:]]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--crun", required=True)
    ap.add_argument("--probe", required=True, help="the restart_probe binary")
    ap.add_argument("--loadgen", required=True, help="the rdzv_loadgen binary")
    ap.add_argument("--bare-server", help="the bare_session_server binary (the memory "
                    "baseline; default: beside the load generator)")
    ap.add_argument("--torch2-python", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--torch-rounds", type=int, default=3)
    ap.add_argument("--torch-max-agents", type=int, default=16,
                    help="largest N to try with torchrun (64 Python agents with torch "
                         "imported did not finish within 300 s on 2 cores and 24 GiB)")
    ap.add_argument("--out", default="docs/benchmarks.md")
    args = ap.parse_args()
    args.measured_at = measured_at()  # before the run: the tree may change while it runs
    args.crun, args.probe, args.loadgen = (os.path.abspath(p) for p in
                                           (args.crun, args.probe, args.loadgen))
    args.bare_server = os.path.abspath(
        args.bare_server or os.path.join(os.path.dirname(args.loadgen), "bare_session_server"))

    ports = {h: (free_port(), free_port()) for h in ("e1", "e2", "e3")}
    etcd_dir = tempfile.mkdtemp(prefix="crun-rdzv-bench-etcd-")
    with EtcdCluster(Loopback(), ["e1", "e2", "e3"], etcd_dir, ports=ports) as etcd:
        args.etcd = etcd
        run_all(args)
    shutil.rmtree(etcd_dir, ignore_errors=True)


def run_all(args):
    launch = {}
    for n in AGENTS:
        launch[("crun", n)] = measure(lambda: launch_to_running(args, "crun", n), args.rounds,
                                      f"crun x{n}")
        launch[("etcd", n)] = measure(lambda: launch_to_running(args, "etcd", n), args.rounds,
                                      f"crun etcd x{n}")
        if n <= args.torch_max_agents:
            try:
                launch[("torchrun", n)] = measure(
                    lambda: launch_to_running(args, "torchrun", n), args.torch_rounds,
                    f"torchrun x{n}")
            except RuntimeError as e:
                print(f"torchrun x{n}: {e}", file=sys.stderr)
                launch[("torchrun", n)] = str(e)
    restart = {
        "crun": measure(lambda: failure_to_restarted(args, "crun"), args.rounds, "crun restart"),
        "etcd": measure(lambda: failure_to_restarted(args, "etcd"), args.rounds,
                        "crun etcd restart"),
        "lost": measure(lambda: store_host_lost(args), args.rounds, "crun etcd store host lost"),
        "torchrun": measure(lambda: failure_to_restarted(args, "torchrun"), args.torch_rounds,
                            "torchrun restart"),
    }
    sims = {a: median_run(lambda n: simulated(args, n), a, "simulated") for a in SIMULATED}
    for a in SIMULATED:
        # From ONE_RUN_FROM up, the generator cannot put a beat a second on every stream (the
        # streams' flow control holds them back), so a figure per stream message would say
        # nothing: memory only there.
        streams = a < ONE_RUN_FROM
        sims[a]["bare_rss_mib"], bare_us = bare_baseline(args, a, STEADY_MS if streams else 0)
        sims[a]["bare_beat_us"] = bare_us
        sims[a]["stream_beat_us"] = per_beat_micros(
            simulated(args, a, extra=("--stream-beats",))) if streams else None
        print(f"bare gRPC server x{a}: {sims[a]['bare_rss_mib']:,.0f} MiB, "
              f"{micros(bare_us)} a message; crun's stream beats "
              f"{micros(sims[a]['stream_beat_us'])}", file=sys.stderr)
    etcd_sims = {a: median_run(lambda n: etcd_simulated(args, n), a, "simulated through etcd",
                               ETCD_ONE_RUN_FROM)
                 for a in ETCD_SIMULATED}
    tidy = etcd_tidy(args)
    write(args, launch, restart, sims, etcd_sims, tidy, connections(args), many_jobs(args))


# The agents' keepalive pings, which the simulated table leaves out: CONNECTIONS connections
# (the load generator's most), each pinging every second as an agent's channel does at the
# default heartbeat interval, carrying 10,000 agents' beats.
CONNECTIONS = 4096
CONNECTION_WAYS = (("datagrams", ()), ("on the streams", ("--stream-beats",)),
                   ("pings alone (no beats)", ("--heartbeat-ms", "600000")))


def connections(args):
    """{way: daemon CPU %} for 10,000 agents on CONNECTIONS connections pinging each second."""
    got = {}
    for way, extra in CONNECTION_WAYS:
        r = simulated(args, 10000, extra=("--channels", str(CONNECTIONS), "--keepalive-ms",
                                          "1000", *extra))
        got[way] = r["steady"]["service_cpu_percent"]
        print(f"10,000 agents on {CONNECTIONS} connections, {way}: {got[way]:.1f} %",
              file=sys.stderr)
    return got


# Many jobs on one daemon, forming at once: (jobs, agents each).
JOBS = ((10, 1000), (100, 1000))


def many_jobs(args):
    """{jobs: rdzv_loadgen's figures} for JOBS, one run each, no heartbeats."""
    got = {}
    for jobs, each in JOBS:
        got[jobs] = simulated(args, jobs * each, steady_ms=0, extra=("--jobs", str(jobs)))
        j = got[jobs]["jobs"]
        print(f"{jobs} jobs of {each:,}: all formed in {got[jobs]['form']['ms']:,.0f} ms, each "
              f"{j['form_ms_min']:,.0f} / {j['form_ms_median']:,.0f} / {j['form_ms_max']:,.0f} "
              "ms (min / median / max)", file=sys.stderr)
    return got


def cell(v):
    return f"{v:,.1f} ms" if isinstance(v, float) else "failed"


def write(args, launch, restart, sims, etcd_sims, tidy, conns, jobs):
    lines = [
        "## Rendezvous: forming, restarting, scale", "",
        f"`tests/bench/rdzv_bench.py`, on the same machine, in a private network namespace "
        f"(loopback). Real agents: median of {args.rounds} runs for crun and "
        f"{args.torch_rounds} for torchrun 2.x (`--rdzv-backend c10d`, the first agent "
        "`is_host`; `--monitor-interval 0.1`). Workers are `tests/workers/restart_probe.cc`, "
        "whose first instruction takes the time. " + args.measured_at, "",
        "| launch → all workers running | crun (service) | crun (etcd-v3) | "
        "torchrun 2.x (c10d) | torchrun / crun (service) |",
        "|---|---|---|---|---|"]
    for n in AGENTS:
        c, e = launch[("crun", n)], launch[("etcd", n)]
        t = launch.get(("torchrun", n), "not run")
        ratio = f"{t / c:,.0f}×" if isinstance(t, float) else "–"
        shown = cell(t) if t != "not run" else "not run (1)"
        lines.append(f"| {n} agents × 1 worker | {cell(c)} | {cell(e)} | {shown} | {ratio} |")
    lines.append(f"| failure → every node's replacements running, 3 agents × 2 workers | "
                 f"{cell(restart['crun'])} | {cell(restart['etcd'])} | "
                 f"{cell(restart['torchrun'])} | {restart['torchrun'] / restart['crun']:,.0f}× |")
    lines.append(f"| the store's host lost → survivors' new workers running, 3 agents × 1 "
                 f"worker (2) | the job ends | {cell(restart['lost'])} | the job ends | – |")
    if any(("torchrun", n) not in launch for n in AGENTS):
        lines += ["", f"(1) Not run above {args.torch_max_agents} agents "
                  "(`--torch-max-agents`): each torchrun agent is a Python process that imports "
                  "torch, and 64 of them did not finish within 300 s on this 2-core, 24 GiB "
                  "machine (18 GiB in use, load average 55)."]
    lines += ["", "(2) With crun's service hosted by a node, or torchrun's c10d store on it, that "
              "node's loss ends the job everywhere. With etcd, its lease runs out after "
              "heartbeat_timeout (3 s by default, --rdzv-conf heartbeat_timeout), the survivors "
              "re-form and another node serves the next round's store: the figure is that TTL "
              "plus the re-forming. etcd here: 3 members on loopback (Debian's etcd-server "
              "3.4), each on this machine's disk (every write is fsynced)."]
    lines += [
        "", "Simulated agents (`tests/bench/rdzv_loadgen.cc`: each a real crun.v1 session, "
        "spread over one process per 3,125 agents, up to 32, and 16 HTTP/2 connections or one "
        "a process) against one `crun rendezvous` daemon; the run with the "
        f"median formation time of 3 (one run at {ONE_RUN_FROM:,}), a fresh daemon each. "
        "*form*: from the first Join sent to the last assignment received (min = max = N, 8 "
        "workers each). *failure*: one agent reports a failed worker; every agent is told to "
        "stop, re-joins at once and holds the next round. CPU is the daemon's (user + system, "
        "/proc), the load generator shares the two cores: where the daemon's CPU is well below "
        "the wall time, the generator is what limits the figure. *Heartbeats*: each agent beats "
        "once a second, as crun's agent does, as a datagram (docs/rendezvous.md, "
        "\"Heartbeats\"), reading the daemon's acks and beating on its stream too when they "
        "are missing; the first second is not measured (every agent beats once and its acks "
        "start coming), then 3 s are. The same beats on the gRPC streams "
        "(`--stream-beats`, one run) and on the streams of a bare gRPC server that reads and "
        "drops them (`bare_session_server.cc`, one run) are the comparison: the second is what "
        "any heartbeat on a stream costs with this gRPC. Not at "
        f"{ONE_RUN_FROM:,}: the generator cannot put a beat a second on that many streams, "
        "whose flow control holds them back. The agents' own keepalive pings are not "
        "modelled (16 connections carry them all): see \"Heartbeats over UDP\" below.", "",
        "| | " + " | ".join(f"{a:,} agents" for a in SIMULATED) + " |",
        "|---|" + "---|" * len(SIMULATED)]
    rows = [
        ("form a round", lambda r: f"{r['form']['ms']:,.0f} ms"),
        ("daemon CPU while forming", lambda r: f"{r['form']['service_cpu_s'] * 1000:,.0f} ms"),
        ("failure → every agent told", lambda r: f"{r['told']['ms']:,.0f} ms"),
        ("failure → every agent in the next round", lambda r: f"{r['reformed']['ms']:,.0f} ms"),
        ("success reports → every agent has the outcome",
         lambda r: f"{r['finish']['ms']:,.0f} ms"),
        ("daemon CPU, every agent heartbeating each 1 s (datagrams)",
         lambda r: f"{r['steady']['service_cpu_percent']:.1f} % of a core"),
        (f"heartbeats the generator sent in {STEADY_MS // 1000} s, of those due",
         lambda r: f"{r['steady']['heartbeats']:,} of {r['agents'] * STEADY_MS // 1000:,}"),
        ("agents whose datagrams the daemon acked",
         lambda r: f"{r['steady']['heard_over_udp']:,}"),
        ("of the beats sent, also on the stream (acks missing)",
         lambda r: f"{r['steady']['streamed_too']:,}"),
        (BEAT_ROW, lambda r: f"{per_beat_micros(r):.1f} µs"),
        (STREAM_BEAT_ROW, lambda r: micros(r["stream_beat_us"])),
        (BARE_BEAT_ROW, lambda r: micros(r["bare_beat_us"])),
        ("daemon RSS idle → sessions open → peak",
         lambda r: f"{r['service_idle_rss_mib']:,.0f} → {r['service_rss_connected_mib']:,.0f} → "
                   f"{r['service_hwm_mib']:,.0f} MiB"),
        ("bare gRPC server RSS, the same sessions open",
         lambda r: f"{r['bare_rss_mib']:,.0f} MiB"),
        ("daemon memory per agent above it, every agent heartbeating",
         lambda r: f"{above_bare_kib(r):.1f} KiB"),
    ]
    lines += table_rows(rows, [sims[a] for a in SIMULATED])
    lines += [
        "", f"**Heartbeats over UDP, with the agents' pings.** 10,000 agents on {CONNECTIONS:,} "
        "HTTP/2 connections (one an agent, as far as the load generator goes), each pinging "
        "every second, as an agent's channel does at the default heartbeat interval; one run "
        "each, 3 s measured:", "",
        "| every agent beating each 1 s | daemon CPU |", "|---|---|"]
    lines += [f"| {way} | {conns[way]:.1f} % of a core |" for way, _ in CONNECTION_WAYS]
    one = sims[1000]
    lines += [
        "", "**Many jobs on one daemon.** The simulated agents as jobs of 1,000 (run ids "
        "`bench-0` …, agent i in job i mod J), every job forming at once on one daemon; one run "
        "each. A job's time is its last agent's assignment, from the first Join sent; one job "
        "of 1,000 alone is the 1,000 column above, from the same run.", "",
        "| | one job of 1,000 | " + " | ".join(f"{j} jobs of {e:,}" for j, e in JOBS) + " |",
        "|---|---|" + "---|" * len(JOBS),
        "| each job formed: min · median · max | "
        f"{one['form']['ms']:,.0f} ms | " + " | ".join(
            f"{jobs[j]['jobs']['form_ms_min']:,.0f} · {jobs[j]['jobs']['form_ms_median']:,.0f} · "
            f"{jobs[j]['jobs']['form_ms_max']:,.0f} ms" for j, _ in JOBS) + " |",
        "| daemon CPU while forming, per job | "
        f"{one['form']['service_cpu_s'] * 1000:,.0f} ms | " + " | ".join(
            f"{jobs[j]['form']['service_cpu_s'] * 1000 / j:,.0f} ms" for j, _ in JOBS) + " |",
        "| success reports → every agent of every job has the outcome | "
        f"{one['finish']['ms']:,.0f} ms | " + " | ".join(
            f"{jobs[j]['finish']['ms']:,.0f} ms" for j, _ in JOBS) + " |",
        "| daemon RSS, peak | "
        f"{one['service_hwm_mib']:,.0f} MiB | " + " | ".join(
            f"{jobs[j]['service_hwm_mib']:,.0f} MiB" for j, _ in JOBS) + " |"]
    lines += [
        "", "Through etcd (`rdzv_loadgen --etcd`): each simulated agent is the agent's own etcd "
        "rendezvous (`agent/rendezvous/etcd_rendezvous.cc`: its lease, node key, watch and client), in "
        "the load generator's shards (3,125 agents a process), against a fresh 3-member etcd on "
        "loopback each run (Debian's etcd-server 3.4, every write fsynced to this machine's "
        f"disk); the run with the median formation time of 3 (one run from "
        f"{ETCD_ONE_RUN_FROM:,}). Same phases; heartbeats are the leases' keep-alives (TTL 30 s, "
        "one each 10 s). CPU and RSS are the three members' together; etcd and every agent "
        "share the two cores.", "",
        "| | " + " | ".join(f"{a:,} agents" for a in ETCD_SIMULATED) + " |",
        "|---|" + "---|" * len(ETCD_SIMULATED)]
    def tried(fmt):
        return lambda r: "—" if "failed" in r else fmt(r)

    def formed(r):
        if "failed" not in r:
            return f"{r['form']['ms']:,.0f} ms"
        f = r["failed"]
        return (f"not within {f['limit_s']:,.0f} s ('{f['phase']}': {f['reached']:,} of "
                f"{r['agents']:,})")

    etcd_rows = [(ETCD_FORM_ROW, formed)] + [(label, tried(fmt)) for label, fmt in [
        ("etcd CPU while forming", lambda r: f"{r['form']['service_cpu_s'] * 1000:,.0f} ms"),
        ("the agents' CPU while forming (all on this machine)",
         lambda r: f"{r['form']['agents_cpu_s'] * 1000:,.0f} ms"),
        ("failure → every agent told", lambda r: f"{r['told']['ms']:,.0f} ms"),
        ("failure → every agent in the next round", lambda r: f"{r['reformed']['ms']:,.0f} ms"),
        ("success reports → every agent has the outcome",
         lambda r: f"{r['finish']['ms']:,.0f} ms"),
        ("etcd CPU, leases kept alive",
         lambda r: f"{r['steady']['service_cpu_percent']:.0f} % of a core"),
        ("a/job writes (the whole run) · largest",
         lambda r: f"{r['job_writes']} · {r['job_max_bytes']:,} bytes"),
        ("a/job bytes delivered to watchers",
         lambda r: f"{r['job_bytes_to_watchers'] / 2**20:,.1f} MiB"),
        ("etcd RSS idle → peak (3 members)",
         lambda r: f"{r['service_idle_rss_mib']:.0f} → {r['service_hwm_mib']:.0f} MiB"),
        ("load generator RSS (every agent's client and watch)",
         lambda r: f"{r['loadgen_rss_mib']:.0f} MiB"),
    ]]
    lines += table_rows(etcd_rows, [etcd_sims[a] for a in ETCD_SIMULATED])
    big = [etcd_sims[a] for a in ETCD_SIMULATED if "failed" not in etcd_sims[a]][-1]
    cpu = big["form"]["service_cpu_s"] + big["form"]["agents_cpu_s"]
    lines += ["", f"What limits it: each agent costs etcd one read (the layout and a/), a lease, "
              f"one write (its node key and join) and a watch, and reads its own ranks/ key "
              f"once the round is announced; a/job, which every agent watches, no longer lists "
              f"the members (only with `--contract`), so a change delivers "
              f"{big['job_max_bytes']:,} bytes to each agent (crun before ade2dfb: 66 KiB, "
              f"195 MiB a run at 1,000 agents). Forming {big['agents']:,} agents here took "
              f"{cpu:.1f} s of CPU on the two cores, about half etcd's "
              f"({big['form']['service_cpu_s']:.1f} s) and half the agents' "
              f"({big['form']['agents_cpu_s']:.1f} s), which a real job spreads over its "
              "machines. Joins, reports and lost leases reach the decider alone (it alone "
              "watches the whole prefix). Before 3,000 agents formed here (at all: none did in "
              "5 minutes), each etcd client gave a connection 2 s to come up; thousands of "
              "agents' handshakes in one busy process took longer, were cut off and dialled "
              "again, and none ever came up. A connection now gets gRPC's own 20 s (the calls' "
              "deadlines still pass a silent member over), a call that timed out is tried again "
              "with twice the time (to 16 s), each agent starts at a member of its own (a hash "
              "of its node id) instead of all at the first, and a registration whose answer "
              "was lost recognises its own key (by its lease) when the client sends it again."]
    for r in (etcd_sims[a] for a in ETCD_SIMULATED if "failed" in etcd_sims[a]):
        f = r["failed"]
        gave_up = (f"{f['ended']:,} agents gave up, {f['reason_count']:,} of them with: "
                   f"`{f['reason']}`" if f["ended"] else
                   "none gave up (each was still trying when the limit came)")
        lines += ["", f"{r['agents']:,} agents were tried and did not get through '{f['phase']}' "
                  f"within {f['limit_s']:,.0f} s ({f['reached']:,} reached it); {gave_up}. etcd "
                  "and every simulated agent share two cores here."]
    lines += ["", f"etcd's keys for one job (one real agent, the 3 members above, "
              f"`--max-restarts {TIDY_RESTARTS}`, `--rdzv-conf etcd_retention="
              f"{TIDY_RETENTION_S}`): after {TIDY_RESTARTS} restarts the job's prefix holds "
              f"{tidy['keys']} keys ({tidy['rounds']} under rounds/, the last kept, and "
              f"{tidy['stores']} under a/stores/: its host has left), where crun before 579098e "
              f"kept one rounds/ and one a/stores/ key for every round; all were gone "
              f"{tidy['gone_s']:.1f} s after the job ended (the retention lease's TTL, then etcd's "
              "lease expiry check)."]
    lines += ["", "Reproduce: `python3 tests/bench/rdzv_bench.py --crun build/launcher/crun "
              "--probe build/tests/bench/restart_probe --loadgen build/tests/bench/rdzv_loadgen "
              "--torch2-python \"$(bash scripts/setup-torch2.sh)\"`"]
    write_section(args.out, "rdzv-bench", lines)


if __name__ == "__main__":
    main()
