#!/usr/bin/env python3
"""The fault campaign (issue 77, docs/observability.md "Goodput"): one seeded trace of faults,
the same for every launcher, against a small job, measured from the workers' own step logs.

The job: stock PyTorch 2.x DDP over Gloo (tests/workers/goodput_worker.py), 2 nodes x 2 workers,
--state-mib MiB of state a rank, --step-s seconds a step; every node is a launcher of its own on
loopback in a private network namespace. The trace: Poisson arrivals, --per-minute faults a
minute on average over --minutes, after a first minute's quiet; the mix follows Llama 3's
interruption table (shared/reference/goodput-anchors.md): mostly hardware, modelled as a node
lost (its launcher and its workers SIGKILLed together) with its replacement started 5 s later
by the harness, for every launcher alike; then a worker's exception, a worker SIGKILLed, and a
hang (a rank stops before a collective). The node lost is always the one that does not host
the rendezvous (torchrun's and ft_launcher's store live in node a's agent: losing it ends their
job, which would not be a fair trace).

The launchers, alternating in one run:
  - torchrun 2.x as a careful user runs it: c10d, --max-restarts, torch.save every 25 steps
    (aside, renamed), resumed at start, collectives time out after 60 s so that hangs end;
  - NVIDIA's ft_launcher (nvidia-resiliency-ext 0.4.1, its own venv: scripts/setup-frameworks.sh
    nvrx), the same job plus its rank monitor's heartbeat after every step, with
    --ft-rank-heartbeat-timeout as crun's --hang-timeout;
  - crun --warm, crun_worker.save every step (with its copy on the next node), a spare node,
    --hang-timeout, its rendezvous daemon on loopback.

Measured independently: each rank logs every step it completes with its time. Goodput is the
job's useful steps (the newest step it reached) times the fault-free step time (measured in the
same run: a fault-free job under torchrun, first) over the wall time; each fault's lost seconds
run from the fault until the job is past the step it had reached then, less the steps done
since. crun's own ledger (the daemon's /goodput.json at the end) is compared with it.

Usage: goodput_bench.py --crun BIN --torch2-python PY [--nvrx-python PY] [--minutes 12]
                        [--per-minute 1] [--seed 7] [--state-mib 50] [--step-s 0.25]
                        [--short] [--out FILE] [--keep]
--short: the check.py form, about 3 minutes, three faults (a node lost, an exception, a hang).
"""
import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from bench_support import in_private_netns, measured_at, write_section  # noqa: E402
from crun_testing import free_port, kill_all, whole_lines  # noqa: E402
from recovery_bench import descendants  # noqa: E402

WORKER = os.path.join(HERE, "..", "workers", "goodput_worker.py")
MIX = (("node lost", 0.70), ("exception", 0.12), ("kill", 0.10), ("hang", 0.08))
KIND_OF = {"exception": "crash", "kill": "kill", "hang": "hang"}  # the worker's word
HANG_S = 10  # crun's --hang-timeout, ft_launcher's heartbeat timeout
REPLACE_S = 5
WORLD = 4


def trace(args):
    """[(seconds after launch, kind, global rank)]: the same for every launcher."""
    rng = random.Random(args.seed)
    if args.short:
        return [(40.0, "node lost", 2), (90.0, "exception", 1), (140.0, "hang", 3)]
    out, t = [], 60.0
    while True:
        t += rng.expovariate(args.per_minute / 60.0)
        if t > args.minutes * 60 - 30:
            return out
        r, kind = rng.random(), MIX[-1][0]
        for k, share in MIX:
            if r < share:
                kind = k
                break
            r -= share
        out.append((round(t, 1), kind, rng.randrange(WORLD)))


class Job:
    """One launcher's run of the job under the trace."""

    def __init__(self, args, launcher):
        self.args, self.launcher = args, launcher
        self.dir = tempfile.mkdtemp(prefix=f"crun-goodput-{launcher}-")
        self.faults = os.path.join(self.dir, "faults")
        os.makedirs(self.faults)
        self.procs, self.nodes = {}, []
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("CRUN_", "PET_"))}
        self.env.update(OMP_NUM_THREADS="1", STATE_MIB=str(args.state_mib), CKPT_EVERY="25",
                        LOGLEVEL="WARNING")
        self.endpoint = ""
        self.run_id = "campaign"
        self.daemon_metrics = None

    def start_rendezvous(self):
        if self.launcher != "crun":
            self.endpoint = f"127.0.0.1:{free_port()}"
            return
        self.daemon_metrics = free_port()
        d = subprocess.Popen([self.args.crun, "rendezvous", "--host", "127.0.0.1", "--port", "0",
                              "--metrics-port", str(self.daemon_metrics)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             env=self.env)
        self.procs["daemon"] = d
        line = d.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"crun rendezvous said {line!r}")
        self.endpoint = "127.0.0.1:" + line.rsplit(":", 1)[1].strip()

    def node(self, tag):
        host = 1 if tag == "a" else 0
        worker = [WORKER, self.dir, "1000000", str(self.args.step_s), f"node={tag}",
                  f"faults={self.faults}"]
        if self.launcher == "torchrun":
            cmd = [self.args.torch2_python, "-m", "torch.distributed.run", "--rdzv-backend",
                   "c10d", "--rdzv-conf", f"is_host={host}"]
        elif self.launcher == "ft_launcher":
            cmd = [self.args.nvrx_python, "-m", "nvidia_resiliency_ext.fault_tolerance.launcher",
                   "--rdzv-backend", "c10d", "--rdzv-conf", f"is_host={host}",
                   "--ft-rank-heartbeat-timeout", str(HANG_S),
                   "--ft-initial-rank-heartbeat-timeout", "120",
                   "--ft-enable-nic-monitor", "false"]
            worker.append("ft")
        else:
            cmd = [self.args.crun, "--rdzv-conf", f"node_id={tag}", "--warm", "--hang-timeout",
                   str(HANG_S), "--log-dir", os.path.join(self.dir, f"logs-{tag}")]
            if self.args.hang_after_steps:
                cmd += ["--hang-after-steps", str(self.args.hang_after_steps)]
            worker.append("snapshot")
        cmd += ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint", self.endpoint,
                "--rdzv-id", self.run_id, "--max-restarts", "1000"]
        log = open(os.path.join(self.dir, f"{tag}.log"), "w")
        # Its own session: the node's launcher and every worker it starts are lost together.
        # torchrun's agents (ft_launcher's too) start workers with PYTHON_EXEC, as crun does.
        python = self.args.nvrx_python if self.launcher == "ft_launcher" else self.args.torch2_python
        self.procs[tag] = subprocess.Popen([*cmd, *worker], stdout=log, stderr=subprocess.STDOUT,
                                           env=dict(self.env, PYTHON_EXEC=python),
                                           start_new_session=True)
        self.nodes.append(tag)

    def members(self):
        """The nodes running ranks now: crun says; the others have a and their latest b."""
        if self.launcher != "crun":
            return ["a", [n for n in self.nodes if n != "a"][-1]]
        r = subprocess.run([self.args.crun, "status", "--rdzv-endpoint", self.endpoint,
                            "--rdzv-id", self.run_id, "--json"], capture_output=True, text=True,
                           timeout=30, env=self.env)
        try:
            job = json.loads(r.stdout)[0]
            return [n["node_id"] for n in job["nodes"] if n["state"] == "member"]
        except (ValueError, IndexError, KeyError):
            return ["a"]

    def lose(self):
        """The member node that is not a: its launcher and everything under it, at once."""
        victims = [n for n in self.members() if n != "a" and n in self.procs]
        if not victims:
            return None
        tag = victims[0]
        p = self.procs.pop(tag)
        for pid in [p.pid, *descendants(p.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait(timeout=60)
        return tag

    def steps(self):
        """(time, step) of every step rank 0 completed, in time order."""
        out = []
        for name in os.listdir(self.dir):
            if name.startswith("steps-") and name.endswith("-0.log"):
                for line in whole_lines(os.path.join(self.dir, name)):
                    step, t, _ = line.split()
                    out.append((float(t), int(step)))
        return sorted(out)

    def ledger(self):
        if self.launcher != "crun":
            return None
        url = f"http://127.0.0.1:{self.daemon_metrics}/goodput.json?run_id={self.run_id}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.loads(r.read())
        except (OSError, ValueError):
            return None

    def close(self):
        kill_all(list(self.procs.values()))
        for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if self.dir.encode() in f.read():
                        os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass
        if self.args.keep:
            print(f"  {self.launcher}: kept {self.dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def run_job(args, launcher, events, minutes):
    """Runs one launcher under `events` for `minutes`; its step log, faults and ledger."""
    job = Job(args, launcher)
    fired = []
    try:
        job.start_rendezvous()
        launched = time.time()
        job.node("a")
        job.node("b")
        if launcher == "crun":
            job.node("c")  # the spare
        replacements = []  # (when, tag)
        seq = 0
        pending = list(events)
        end = launched + minutes * 60
        while time.time() < end:
            now = time.time() - launched
            while pending and pending[0][0] <= now:
                t, kind, rank = pending.pop(0)
                seq += 1
                done = job.steps()
                at_step = done[-1][1] if done else 0
                if kind == "node lost":
                    tag = job.lose()
                    if tag is not None:
                        replacements.append((time.time() + REPLACE_S, f"n{seq}"))
                else:
                    path = os.path.join(job.faults, f"{seq:04d}")
                    with open(path + ".tmp", "w") as f:
                        f.write(f"{KIND_OF[kind]} {rank}\n")
                    os.replace(path + ".tmp", path)
                fired.append({"t": time.time(), "kind": kind, "step": at_step})
            while replacements and replacements[0][0] <= time.time():
                job.node(replacements.pop(0)[1])
            time.sleep(0.05)
        ledger = job.ledger()
        wall = time.time() - launched
        return {"steps": job.steps(), "faults": fired, "ledger": ledger, "wall": wall,
                "launched": launched}
    finally:
        job.close()


def fault_free_step(args):
    """The job's step time without faults or checkpoints: torchrun, one node, 40 steps."""
    d = tempfile.mkdtemp(prefix="crun-goodput-ff-")
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CRUN_", "PET_"))}
        env.update(OMP_NUM_THREADS="1", STATE_MIB="0", CKPT_EVERY="1000000")
        subprocess.run([args.torch2_python, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", str(WORLD), WORKER, d, "40", str(args.step_s),
                        "node=ff"], env=env, capture_output=True, timeout=300, check=True)
        times = [float(line.split()[1]) for line in whole_lines(os.path.join(d, "steps-ff-0.log"))]
        return statistics.median(b - a for a, b in zip(times[5:], times[6:]))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def judge(result, t_ff):
    """Goodput and lost seconds, from rank 0's step log alone. Goodput: the newest step reached
    times the fault-free step time, over the wall time. Lost: the rest, split into windows: a
    fault's runs from it to the next fault (or the end), and loses its time less the fault-free
    time of the new steps done in it; the window before the first fault is "steady". Where the
    launcher's own steps are slower than the fault-free step (its steady median), that part of
    each window is its per-step overhead, counted apart from the fault's cost."""
    steps, wall, t0 = result["steps"], result["wall"], result["launched"]
    useful = max((s for _, s in steps), default=0)
    goodput = useful * t_ff / wall if wall > 0 else 0.0
    faults = sorted(result["faults"], key=lambda f: f["t"])
    bounds = [t0] + [f["t"] for f in faults] + [t0 + wall]
    names = ["steady"] + [f["kind"] for f in faults]
    first = [t for t, _ in steps if t < bounds[1]]
    gaps = [b - a for a, b in zip(first[5:], first[6:])]
    own = statistics.median(gaps) if len(gaps) >= 5 else t_ff
    overhead_per_step = max(0.0, own - t_ff)
    by_kind, overhead = {}, 0.0
    for name, start, end in zip(names, bounds, bounds[1:]):
        before = max((s for t, s in steps if t <= start), default=0)
        after = max((s for t, s in steps if t <= end), default=0)
        gained = max(0, after - before)
        extra = gained * overhead_per_step
        overhead += extra
        by_kind[name] = by_kind.get(name, 0.0) + max(0.0, end - start - gained * t_ff - extra)
    return {"goodput": goodput, "lost": wall * (1 - goodput), "by_kind": by_kind,
            "useful": useful, "own_step": own, "overhead": overhead}


def ledger_goodput(ledger):
    if not ledger:
        return None
    totals = ledger["job"]["totals_ms"]
    wall = sum(totals.values())
    return totals["training"] / wall if wall else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--crun", required=True)
    ap.add_argument("--torch2-python", required=True)
    ap.add_argument("--nvrx-python", default="")
    ap.add_argument("--minutes", type=float, default=12)
    ap.add_argument("--per-minute", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--state-mib", type=int, default=50)
    ap.add_argument("--step-s", type=float, default=0.25)
    ap.add_argument("--short", action="store_true")
    ap.add_argument("--hang-after-steps", type=int, default=0,
                    help="crun's --hang-after-steps (0: --hang-timeout alone)")
    ap.add_argument("--out", default=os.path.join(HERE, "..", "..", "docs", "benchmarks.md"))
    ap.add_argument("--json", default="", help="also write the figures here")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--launchers", default="torchrun,ft_launcher,crun",
                    help="which, in this order (ft_launcher needs --nvrx-python)")
    args = ap.parse_args()
    if not os.environ.get("CRUN_BENCH_IN_NETNS"):
        return in_private_netns(sys.argv)
    if args.short:
        args.minutes = 3
    events = trace(args)
    print(f"trace (seed {args.seed}): " + ", ".join(f"{k}@{t:.0f}s" for t, k, _ in events),
          file=sys.stderr, flush=True)
    t_ff = fault_free_step(args)
    print(f"fault-free step: {t_ff * 1000:.0f} ms", file=sys.stderr, flush=True)
    launchers = [n for n in args.launchers.split(",") if n != "ft_launcher" or args.nvrx_python]
    results = {}
    for launcher in launchers:
        print(f"{launcher}: {args.minutes:g} minutes ...", file=sys.stderr, flush=True)
        r = run_job(args, launcher, events, args.minutes)
        results[launcher] = {**judge(r, t_ff), "ledger": ledger_goodput(r["ledger"]),
                             "ledger_json": r["ledger"],
                             "ledger_summary": (r["ledger"] or {}).get("summary"),
                             "ledger_totals": (r["ledger"] or {}).get("job", {}).get("seconds")}
        j = results[launcher]
        print(f"  goodput {j['goodput'] * 100:.1f} %, lost {j['lost']:.0f} s (its steps "
              f"{j['own_step'] * 1000:.0f} ms: {j['overhead']:.0f} s of overhead), by window "
              + ", ".join(f"{k} {v:.1f} s" for k, v in j["by_kind"].items())
              + (f"; its ledger {j['ledger'] * 100:.1f} %" if j["ledger"] is not None else ""),
              file=sys.stderr, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"t_ff": t_ff, "events": events, "results": results}, f, indent=2)
    if args.short:
        return 0
    lines = [f"{measured_at()} `tests/bench/goodput_bench.py --minutes {args.minutes:g} "
             f"--seed {args.seed} --state-mib {args.state_mib} --step-s {args.step_s}`: one "
             f"run, the launchers in turn under the same trace ({len(events)} faults: "
             + ", ".join(f"{k} at {t:.0f} s" for t, k, _ in events)
             + f"); fault-free step {t_ff * 1000:.0f} ms.", "",
             "| launcher | goodput (step logs) | lost | " +
             " | ".join(f"lost to {k}" for k, _ in MIX) + " | crun's own ledger |",
             "|---|---|---|" + "---|" * len(MIX) + "---|"]
    for launcher in launchers:
        j = results[launcher]
        lines.append(f"| {launcher} | {j['goodput'] * 100:.1f} % | {j['lost']:.0f} s | " +
                     " | ".join(f"{j['by_kind'].get(k, 0):.1f} s" for k, _ in MIX) + " | " +
                     (f"{j['ledger'] * 100:.1f} %" if j["ledger"] is not None else "–") + " |")
    crun = results["crun"]
    if crun["ledger_summary"]:
        lines += ["", f"crun's line: `crun: {crun['ledger_summary']}`"]
    write_section(args.out, "goodput-campaign", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
