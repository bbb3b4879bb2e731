"""Hang benchmark: how soon crun has a hang's complete report (every rank's stacks), and what
watching for hangs costs a busy worker; torchrun 2.x in the same run as the anchor. Writes its
section of docs/benchmarks.md (between the hang-bench markers).

  * deadline -> complete report, for 2, 8 and 32 local ranks parked in a distinctive function:
    Python workers read through crun's faulthandler hook (nothing installed), Python workers
    read by py-spy, native workers (`sleep`) read by eu-stack; and 2 ranks on each of 2 hosts
    (network namespaces, tests/pylib/fabric.py; needs root), the other host's read through the
    rendezvous service. From the report's own timing (hang.json: declared after the deadline +
    every rank's stacks read).
  * a torchelastic file timer's expiry -> the launcher has exited, the same stock script under
    torchrun 2.x (its FileTimerServer SIGKILLs the worker, then its own process, the agent) and
    crun (stacks first, then the stop); and what each left running.
  * a busy worker (a line, or a heartbeat, per step) with and without --hang-timeout, and under
    torchrun: wall time of the whole run.

Usage: hang_bench.py --crun BIN --torch2-python PY [--rounds 3] [--out FILE]
"""
import argparse
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from bench_support import measured_at, timed_run, write_section  # noqa: E402
from crun_testing import proc_files, proc_state  # noqa: E402
from fabric import Fabric  # noqa: E402

PARKED = """
import os, time
def parked_in_a_distinctive_place():
    time.sleep(3600)
print("rank", os.environ["RANK"], "ready", flush=True)
parked_in_a_distinctive_place()
"""

TIMER = """
import os, sys, time
from torch.distributed.elastic import timer
if os.environ["RANK"] == "1":
    timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    with open(sys.argv[1], "w") as f:
        f.write(repr(time.time() + 1.0))
    with timer.expires(after=1.0):
        time.sleep(3600)
time.sleep(3600)
"""

BUSY = """
import os, sys
steps, how = int(sys.argv[1]), sys.argv[2]
# Without crun's heartbeat pipe the same write goes to /dev/null: the same work either way.
fd = int(os.environ.get("CRUN_HEARTBEAT_FD", "-1"))
if fd < 0:
    fd = os.open(os.devnull, os.O_WRONLY)
total = 0
for i in range(steps):
    total += i * i % 7
    if how == "print":
        print("step", i, "loss", total % 1000, flush=True)
    else:
        os.write(fd, b".")
"""


def write(d, name, text):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def report_timing(crun, cmd, env, timeout_s, d):
    """Runs crun until it has reported the hang (no restart: it then exits); the hang.json."""
    logs = tempfile.mkdtemp(dir=d)
    r = subprocess.run([crun, "--log-dir", logs, *cmd], env=env, capture_output=True,
                       text=True, timeout=300)
    found = glob.glob(f"{logs}/*/*/attempt_0/hang.json")
    if len(found) != 1:
        raise SystemExit(f"no hang report from {cmd}: exit {r.returncode}\n{r.stderr[-3000:]}")
    with open(found[0]) as f:
        h = json.load(f)
    tools = {s["tool"] for s in h["stacks"]}
    if "" in tools or len(h["stacks"]) == 0:
        raise SystemExit(f"a rank's stack was not read: {[s['error'] for s in h['stacks']]}")
    return h["timing"], tools


def stop(p, limit_s=30):
    """Ends `p` if it still runs: SIGTERM (crun then stops its workers), SIGKILL after
    `limit_s`."""
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=limit_s)


def end_session(p, script):
    """Kills what is left of `p`'s session (started with start_new_session) and every process
    still running `script`: however the run ended, nothing of it outlives it."""
    for kill, pid in [(os.killpg, p.pid)] + [(os.kill, q) for q in running_script(script)]:
        try:
            kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait(timeout=30)


def two_hosts_timing(crun, parked, env, d):
    """2 ranks on each of 2 hosts, all parked: both nodes declare the hang and read all 4
    ranks (the other host's through the service). The first complete report's timing (the
    other node may be stopped by it before its own request is answered)."""
    with Fabric(["a", "b"]) as fab:
        procs, logs = [], []
        try:
            for host in ("a", "b"):
                logs.append(tempfile.mkdtemp(dir=d))
                procs.append(fab.popen(host, [crun, "--nnodes", "2", "--nproc-per-node", "2",
                                              "--rdzv-endpoint", f"{fab.addr('a')}:29400",
                                              "--rdzv-id", "bench", "--hang-timeout", "3",
                                              "--log-dir", logs[-1], parked],
                                       env=env, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, text=True))
            errs = [p.communicate(timeout=300)[1] for p in procs]
        finally:
            # Deleting a namespace ends none of its processes: a node that did not end (or
            # one started before the other failed to start) is stopped here.
            for p in procs:
                stop(p)
    best = None
    for log, err in zip(logs, errs):
        found = glob.glob(f"{log}/*/*/attempt_0/hang.json")
        if len(found) != 1:
            continue  # stopped by the other's report before its own watch fired
        with open(found[0]) as f:
            h = json.load(f)
        if sorted(s["rank"] for s in h["stacks"]) != [0, 1, 2, 3] or \
                any(not s["tool"] for s in h["stacks"]):
            continue
        if best is None or h["timing"]["report_ms"] < best["report_ms"]:
            best = h["timing"]
    if best is None:
        raise SystemExit("no report holds every rank's stacks:\n" + "\n".join(errs)[-5000:])
    return best


def running_script(path):
    """Live processes whose command line names `path` (a worker script the launcher left)."""
    return [pid for pid, cmd in proc_files("cmdline")
            if path.encode() in cmd.split(b"\0") and proc_state(pid) not in (None, "Z")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--crun", required=True)
    ap.add_argument("--torch2-python", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "..", "..", "docs", "benchmarks.md"))
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="crun-hang-bench-")
    parked = write(d, "parked.py", PARKED)
    timer_script = write(d, "timer.py", TIMER)
    busy = write(d, "busy.py", BUSY)
    torch_bin = os.path.dirname(a.torch2_python)
    base = dict(os.environ, PATH="/usr/bin:/bin", OMP_NUM_THREADS="1")

    rows = []
    variants = [
        ("Python, crun's hook", dict(base, PYTHON_EXEC="/usr/bin/python3"), [parked]),
        ("Python, py-spy", dict(base, PYTHON_EXEC=a.torch2_python), [parked]),
        ("native (`sleep`), eu-stack", base, ["--no-python", "sleep", "3600"]),
    ]
    for name, env, cmd in variants:
        cells = []
        for n in (2, 8, 32):
            late, stacks, total, tools = [], [], [], set()
            for _ in range(a.rounds):
                t, used = report_timing(a.crun, ["--nproc-per-node", str(n), "--hang-timeout",
                                                 "3", *cmd], env, 3, d)
                late.append(t["declared_late_ms"])
                stacks.append(t["stacks_ms"])
                total.append(t["report_ms"])
                tools |= used
            m = statistics.median(total)
            cells.append(f"{m:,.0f} ms ({statistics.median(late):,.0f} + "
                         f"{statistics.median(stacks):,.0f})")
            print(f"{name} x{n}: {m:.0f} ms by {sorted(tools)}", file=sys.stderr)
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    late, stacks, total = [], [], []
    for _ in range(a.rounds):
        t = two_hosts_timing(a.crun, parked, dict(base, PYTHON_EXEC="/usr/bin/python3"), d)
        late.append(t["declared_late_ms"])
        stacks.append(t["stacks_ms"])
        total.append(t["report_ms"])
    two_hosts = (f"{statistics.median(total):,.0f} ms ({statistics.median(late):,.0f} + "
                 f"{statistics.median(stacks):,.0f})")
    print(f"2 hosts x 2: {two_hosts}", file=sys.stderr)

    # A file timer's expiry -> the launcher gone, crun against torchrun; and what it left.
    expiry, ended_by, left = {}, {}, {}
    for who in ("crun", "torchrun 2.x"):
        times, left[who] = [], 0
        for _ in range(a.rounds):
            stamp = os.path.join(d, "deadline")
            env = dict(base, TORCHELASTIC_ENABLE_FILE_TIMER="1", PYTHON_EXEC=a.torch2_python)
            if who == "crun":
                cmd = [a.crun, "--nproc-per-node", "2", "--log-dir", tempfile.mkdtemp(dir=d),
                       timer_script, stamp]
            else:
                cmd = [os.path.join(torch_bin, "torchrun"), "--standalone", "--nproc-per-node",
                       "2", "--monitor-interval", "0.1", timer_script, stamp]
            # Its own session, so that what it leaves behind can be found (and then killed).
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
            try:
                try:
                    code = p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    raise SystemExit(f"{who} did not end within 60 s of the timer's expiry")
                ended = time.time()
                if code == 0:
                    raise SystemExit(f"{who}: the job did not fail on the expired timer")
                ended_by[who] = (f"killed by {signal.Signals(-code).name}" if code < 0
                                 else f"exit {code}")
                left[who] = max(left[who], len(running_script(timer_script)))
            finally:
                end_session(p, timer_script)  # what it left is counted above, ended here
            with open(stamp) as f:
                times.append(1000 * (ended - float(f.read())))
        expiry[who] = statistics.median(times)
        print(f"{who} expiry -> exit: {expiry[who]:.0f} ms ({ended_by[who]}), left running: "
              f"{left[who]}", file=sys.stderr)

    # A busy worker: 2 ranks, a line (or a heartbeat) per step.
    steps = "200000"
    busy_rows = []
    for how in ("print", "beat"):
        cells = {}
        runs = {
            "crun": [a.crun, "--nproc-per-node", "2", busy, steps, how],
            "crun --hang-timeout 60": [a.crun, "--nproc-per-node", "2", "--hang-timeout", "60",
                                       busy, steps, how],
            "torchrun 2.x": [os.path.join(torch_bin, "torchrun"), "--standalone",
                             "--nproc-per-node", "2", busy, steps, how],
        }
        for name, cmd in runs.items():
            env = dict(base, PYTHON_EXEC=a.torch2_python)
            times = []
            for _ in range(a.rounds):
                t, code, err = timed_run(cmd, env)
                if code != 0:
                    raise SystemExit(f"{name}: exit {code}\n{err[-2000:]}")
                times.append(t)
            cells[name] = statistics.median(times)
            print(f"busy {how} {name}: {cells[name]:.2f} s", file=sys.stderr)
        # Per step and rank: both ranks run at once on the 2 CPUs.
        over = 1e6 * (cells["crun --hang-timeout 60"] - cells["crun"]) / int(steps)
        label = "a line per step (stdout)" if how == "print" else "a heartbeat per step"
        busy_rows.append(f"| {label} | {cells['crun']:.2f} s | {cells['crun --hang-timeout 60']:.2f}"
                         f" s | {over:+.1f} µs | {cells['torchrun 2.x']:.2f} s |")

    lines = [
        "## Hangs: detection, stacks, overhead",
        "",
        f"`tests/bench/hang_bench.py`, median of {a.rounds} runs each. {measured_at()}",
        "",
        "Deadline → complete hang report (every rank's stacks read), `--hang-timeout 3`, ranks "
        "parked in one function on this node; in parentheses: declared after the deadline "
        "(the watch looks ten times per timeout) + reading every rank's stacks, all at once:",
        "",
        "| workers | 2 ranks | 8 ranks | 32 ranks |",
        "|---|---|---|---|",
        *rows,
        "",
        "Across 2 hosts (network namespaces), 2 ranks each, crun's hook: both nodes declare the "
        "hang (every rank is silent) and each asks for all 4 ranks, the other host's through "
        "the rendezvous service; deadline → the first report holding all 4: "
        f"{two_hosts}.",
        "",
        "A torchelastic file timer's expiry (`expires(after=1)` on rank 1 of 2, the same stock "
        "script) → the launcher has exited. torchrun 2.x's FileTimerServer SIGKILLs the worker, "
        "then its own process, the agent (PyTorch's file_based_local_timer.py: \"Terminating the "
        "server process because of expired timers\"), so nothing stops rank 0: it is left "
        "running, orphaned (the bench kills it). crun reads both ranks' stacks (py-spy), prints "
        "the report, then stops the group and exits.",
        "",
        "| | crun | torchrun 2.x |",
        "|---|---|---|",
        f"| expiry → launcher exited | {expiry['crun']:,.0f} ms ({ended_by['crun']}, with stacks) | "
        f"{expiry['torchrun 2.x']:,.0f} ms ({ended_by['torchrun 2.x']}, no stacks) |",
        f"| workers left running | {left['crun']} | {left['torchrun 2.x']} |",
        "",
        f"A busy worker: 2 ranks of Python, {int(steps):,} steps each as fast as they go (a "
        "million lines a second between them), wall time of the whole run (start-up included; "
        "stdout to /dev/null; without a heartbeat pipe the beat goes to /dev/null, the same "
        "work). Watched, each line and beat goes through a pipe crun reads instead of straight "
        "to /dev/null: the cost is the pipe's, paid per step, so at a training step of 10 ms it "
        "is below 0.01 %:",
        "",
        "| per step | crun | crun --hang-timeout 60 | overhead per step | torchrun 2.x |",
        "|---|---|---|---|---|",
        *busy_rows,
        "",
        "Reproduce: `python3 tests/bench/hang_bench.py --crun build/launcher/crun "
        "--torch2-python \"$(bash scripts/setup-torch2.sh)\"`",
    ]
    write_section(a.out, "hang-bench", lines)


if __name__ == "__main__":
    main()
