#!/usr/bin/env python3
"""Node-lost benchmark: a node of a running job is lost, a spare takes its ranks, and the job
trains again at the saved step. Stock PyTorch DDP workers (tests/bench/recovery_worker.py: gloo,
CPU, OMP_NUM_THREADS=1) with --ckpt-mb MiB of state a rank; crun against torchrun 2.x in the
same run, alternating. Writes its section of docs/benchmarks.md (the node-lost-bench markers).

Each run: nodes a and b (2 workers each) form the job, spare c waits; once every rank has done
--kill-after steps, b's launcher and its workers are lost. The ways:
  * crun --warm, peer copy: a `crun rendezvous` daemon; every rank saves after every step into
    crun's node memory, copied to the next node (docs/checkpoints.md, "On a peer"); b SIGKILLed
    with its workers, c loads b's ranks from a's copies. c is a hot spare: its warm template
    has imported torch before the loss, as a spare that waited would have;
  * crun --warm, host silent: the same, but b is stopped (SIGSTOP, its sockets open, as a host
    that hangs or drops off the network): the service notices by the missing heartbeats
    (heartbeat_timeout, 3 s by default), then b is SIGKILLed;
  * crun --warm, disk: the same job with --snapshot-replicas off and --checkpoint-dir (one
    directory that every node reaches, written every step in the background, 2 kept): c reads
    b's ranks from disk;
  * crun cold, peer copy: the peer copy without --warm (c's workers import torch after the
    loss, as torchrun's do);
  * torchrun 2.x, waiting agent: c10d (a hosts the store), a third agent waiting on its
    redundancy list; rank 0 torch.saves the state after every step (written aside and renamed)
    and every rank torch.loads it at its start; b SIGKILLed;
  * torchrun 2.x, agent started at the loss: the same, with c started right after b is lost,
    as a scheduler starts a node in a lost one's place (torchrun's own spare did not take over
    here: its round formed, and the survivor waited for the spare's worker ranks until it
    failed).
From the loss: the survivor's crun told, every rank of the next round exec'd, imported torch,
formed its process group, loaded the state, and did its first step (the slowest rank's time
each); and the steps lost (the newest step any rank finished before the loss, less the step the
job resumed from). A run that failed (a launcher that did not exit 0, a rank that did not train
after the loss) is counted, never dropped. Every figure is the median over --rounds runs; the
ways alternate. Everything runs in a private network namespace with only loopback (needs root).

Usage: node_lost_bench.py --crun BIN --torch2-python PY [--rounds 3] [--ckpt-mb 200]
                          [--out FILE] [--smoke]
"""
import argparse
import datetime
import glob
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from bench_support import in_private_netns, measured_at, write_section  # noqa: E402
from crun_testing import free_port, kill_all, whole_lines  # noqa: E402
from recovery_bench import descendants, end_leftovers, torch_version  # noqa: E402

WORKER = os.path.join(HERE, "recovery_worker.py")
LIMIT_S = 180  # one run; a launcher still running then is a failure
STEPS = 100000  # the run ends at the stop file, once every rank has trained after the loss
AFTER = 3  # steps every rank does after the loss before the run is stopped
WORLD = 4
FIRST_STEP = "**loss → every rank's first step**"
STAGES = (("exec", "loss → every worker exec'd"),
          ("imported", "loss → every worker imported torch"),
          ("group", "loss → process group formed"),
          ("loaded", "loss → every rank loaded the state"),
          ("step", FIRST_STEP))
WAYS = (("crun --warm, peer copy", "peer"), ("crun --warm, host silent", "silent"),
        ("crun --warm, disk", "disk"), ("crun cold, peer copy", "cold"),
        ("torchrun 2.x, waiting agent", "torchrun"),
        ("torchrun 2.x, agent started at the loss", "torchrun-new"))
TORCHRUN = ("torchrun", "torchrun-new")


class Run:
    """One job's processes and files."""

    def __init__(self, args, way):
        self.args, self.way = args, way
        self.dir = tempfile.mkdtemp(prefix="crun-node-lost-")
        self.out = os.path.join(self.dir, "out")
        self.ckpt = os.path.join(self.dir, "ckpt")
        os.makedirs(self.out)
        os.makedirs(self.ckpt)
        self.procs, self.logs = {}, {}
        self.env = dict(os.environ, PYTHON_EXEC=args.torch2_python, OMP_NUM_THREADS="1")
        self.env = {k: v for k, v in self.env.items() if not k.startswith(("CRUN_", "PET_"))}
        self.endpoint = ""

    def worker_args(self):
        args = [WORKER, self.out, "--steps", str(STEPS), "--ckpt-mb", str(self.args.ckpt_mb),
                "--round-prefix", "--stop-file", os.path.join(self.dir, "stop")]
        if self.way in TORCHRUN:
            return args + ["--ckpt-every", "1", "--ckpt-dir", self.ckpt]
        return args + ["--snapshot"]

    def start_service(self):
        if self.way in TORCHRUN:
            self.endpoint = f"127.0.0.1:{free_port()}"
            return
        daemon = subprocess.Popen([self.args.crun, "rendezvous", "--host", "127.0.0.1",
                                   "--port", "0"], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True, env=self.env)
        self.procs["daemon"] = daemon
        line = daemon.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"crun rendezvous said {line!r}")
        self.endpoint = "127.0.0.1:" + line.rsplit(":", 1)[1].strip()

    def node(self, tag):
        if self.way in TORCHRUN:
            cmd = [self.args.torch2_python, "-m", "torch.distributed.run", "--nnodes", "2",
                   "--rdzv-backend", "c10d", "--rdzv-endpoint", self.endpoint,
                   "--rdzv-conf", f"is_host={1 if tag == 'a' else 0}"]
        else:
            cmd = [self.args.crun, "--nnodes", "2", "--rdzv-endpoint", self.endpoint,
                   "--log-level", "info", "--rdzv-conf", f"node_id={tag}"]
            if self.way != "cold":
                cmd.append("--warm")  # a hot spare: its template imported torch already
            if self.way == "disk":
                # The default --checkpoint-keep (2): a node keeps the steps that a lagging
                # node's writer still needs (docs/checkpoints.md, "Kept").
                cmd += ["--snapshot-replicas", "off", "--checkpoint-dir", self.ckpt,
                        "--checkpoint-every", "1"]
        cmd += ["--nproc-per-node", "2", "--rdzv-id", "nodelost", "--max-restarts", "3"]
        self.logs[tag] = os.path.join(self.dir, f"{tag}.log")
        env = dict(self.env, LOGLEVEL="WARNING")
        with open(self.logs[tag], "w") as log:
            # Its own session: the node's launcher and every worker it starts are lost together.
            self.procs[tag] = subprocess.Popen([*cmd, *self.worker_args()], stdout=log,
                                               stderr=subprocess.STDOUT, env=env,
                                               start_new_session=True)

    def log(self, tag):
        return "\n".join(whole_lines(self.logs[tag]))

    def events(self):
        return [json.loads(line) for path in glob.glob(os.path.join(self.out, "*.jsonl"))
                for line in whole_lines(path) if line.strip()]

    def wait(self, what, check, deadline):
        while not check():
            for tag, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{tag} ended (exit {p.returncode}) while waiting for "
                                       f"{what}: {self.log(tag)[-600:] if tag in self.logs else ''}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} in {LIMIT_S} s")
            time.sleep(0.02)

    def lose_b(self):
        """b's launcher and every process under it, at once; returns the time of the loss."""
        b = self.procs["b"]
        pids = [b.pid, *descendants(b.pid)]
        sig = signal.SIGSTOP if self.way == "silent" else signal.SIGKILL
        t = time.time_ns()
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return t, pids

    def close(self):
        kill_all(list(self.procs.values()))
        left = end_leftovers(self.out)
        if left:
            print(f"  {self.way}: {left} worker(s) left running after the job; ended",
                  file=sys.stderr)
        if self.args.keep:
            print(f"  {self.way}: kept {self.dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


# Waits until torchrun's agent of pid PID is on the redundancy or wait list of the c10d
# rendezvous state (a pickled _RendezvousState, base64, under torch.rendezvous.<run id>).
TORCHRUN_WAITING = """
import base64, pickle, sys, time
from datetime import timedelta
import torch.distributed as dist
host, port, pid, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=limit))
deadline = time.monotonic() + limit
while time.monotonic() < deadline:
    state = pickle.loads(base64.b64decode(store.get("torch.rendezvous.nodelost")))
    if any(n.pid == pid for n in (*state.redundancy_list, *state.wait_list)):
        sys.exit(0)
    time.sleep(0.05)
sys.exit(1)
"""


def spare_waits(run, deadline):
    """c has joined and waits for a place."""
    if run.way == "torchrun":
        host, port = run.endpoint.rsplit(":", 1)
        left = max(1.0, deadline - time.monotonic())
        r = subprocess.run([run.args.torch2_python, "-c", TORCHRUN_WAITING, host, port,
                            str(run.procs["c"].pid), str(left)], capture_output=True, text=True,
                           timeout=left + 30)
        if r.returncode != 0:
            raise RuntimeError(f"torchrun's c is not waiting for a place: {r.stderr[-400:]}")
        return True
    # crun's service counts it as a spare (its crun says nothing until the next round).
    r = subprocess.run([run.args.crun, "status", "--rdzv-endpoint", run.endpoint, "--rdzv-id",
                        "nodelost", "--json"], capture_output=True, text=True, timeout=30)
    try:
        jobs = json.loads(r.stdout) if r.returncode == 0 else []
    except ValueError:
        return False
    return any(n["node_id"] == "c" and n["state"] == "spare"
               for job in jobs for n in job["nodes"])


def told_at(run):
    """When a's crun said that b was lost (its log's timestamp, ns), or None."""
    for line in run.log("a").splitlines():
        if "was lost" in line and line.startswith("[crun"):
            stamp = line.split("] ", 1)[1].split(" ", 1)[0]
            t = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f")
            return int(t.timestamp() * 1e9)
    return None


def run_once(args, way):
    """One job; {"exec": ms, ..., "lost": steps} from the loss, or with "failed": why."""
    run = Run(args, way)
    deadline = time.monotonic() + LIMIT_S
    result, errors = {}, []
    try:
        run.start_service()
        run.node("a")
        run.node("b")
        done = lambda r: max([e["step"] for e in run.events()
                              if e["rank"] == r and e["stage"] == "step"], default=-1)
        run.wait(f"every rank past step {args.kill_after}",
                 lambda: all(done(r) >= args.kill_after for r in range(WORLD)), deadline)
        if way != "torchrun-new":
            run.node("c")
            run.wait("the spare to wait", lambda: spare_waits(run, deadline), deadline)
        if way not in ("cold", *TORCHRUN):
            # A hot spare has waited long enough for its template to import torch.
            run.wait("the spare's warm template", lambda: ") ready: " in run.log("c"),
                     deadline)
        t_loss, b_pids = run.lose_b()
        b = run.procs.pop("b")
        if way == "torchrun-new":
            run.node("c")  # as a scheduler starts a node in the lost one's place
        if way == "silent":
            # b is lost once the service says so (a's crun tells it); then it is ended.
            run.wait("a's crun to hear b was lost", lambda: told_at(run) is not None, deadline)
            for pid in b_pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        b.wait(timeout=60)
        after_loss = lambda r: sum(1 for e in run.events() if e["rank"] == r
                                   and e["stage"] == "step" and e["t"] > t_loss)
        run.wait(f"every rank to train {AFTER} steps after the loss",
                 lambda: all(after_loss(r) >= AFTER for r in range(WORLD)), deadline)
        open(os.path.join(run.dir, "stop"), "w").close()
        for tag in ("a", "c"):
            try:
                code = run.procs[tag].wait(timeout=max(0.1, deadline - time.monotonic()))
                if code != 0:
                    errors.append(f"{tag} exited {code}: {run.log(tag)[-400:]}")
            except subprocess.TimeoutExpired:
                errors.append(f"{tag} still running after {LIMIT_S} s")
        events = run.events()
        before = [e["step"] for e in events if e["stage"] == "step" and e["t"] < t_loss]
        after = [e for e in events if e["t"] > t_loss]
        for key, _ in STAGES:
            firsts = {}
            for e in after:
                if e["stage"] == key:
                    firsts[e["rank"]] = min(firsts.get(e["rank"], e["t"]), e["t"])
            if len(firsts) != WORLD:
                break
            result[key] = (max(firsts.values()) - t_loss) / 1e6
        told = told_at(run) if way not in TORCHRUN else None
        if told is not None:
            result["told"] = max(0.0, (told - t_loss) / 1e6)
        loaded = {e["step"] for e in after if e["stage"] == "loaded"}
        if len(loaded) > 1 and not errors:
            errors.append(f"the ranks resumed at different steps: {sorted(loaded)}")
        if loaded and before:
            result["lost"] = max(before) - min(loaded)
        elif before and "loaded" not in result:
            result["lost"] = max(before) + 1  # started over
        if way in ("peer", "silent", "cold") and "resuming from a peer" not in run.log("c") \
                and not errors:
            errors.append("c did not say it resumed from a peer")
        if way == "disk" and "resuming from disk" not in run.log("c") and not errors:
            errors.append("c did not say it resumed from disk")
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        errors.append(str(e))
    finally:
        run.close()
    if errors:
        result["failed"] = "; ".join(errors)
    return result


def cell(runs, key):
    got = [r[key] for r in runs if key in r]
    failed = sum(1 for r in runs if "failed" in r)
    if not got:
        return f"failed {failed} of {len(runs)}" if failed else "—"
    text = f"{statistics.median(got):,.0f}" + ("" if key == "lost" else " ms")
    return text + (f" ({failed} of {len(runs)} failed)" if failed else "")


def table(results):
    names = [name for name, _ in WAYS]
    lines = ["| from the loss of node b | " + " | ".join(names) + " |",
             "|---|" + "---|" * len(names)]
    rows = (("told", "loss → the survivor's crun told"), *STAGES,
            ("lost", "steps lost (finished before the loss, trained again)"))
    for key, label in rows:
        # The survivor's crun telling is crun's log line: torchrun has none.
        lines.append(f"| {label} | " + " | ".join(
            "—" if key == "told" and w in TORCHRUN else cell(results[w], key) for _, w in WAYS)
            + " |")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--crun", required=True)
    ap.add_argument("--torch2-python", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ckpt-mb", type=int, default=200)
    ap.add_argument("--kill-after", type=int, default=4)
    ap.add_argument("--out", default=os.path.join(HERE, "..", "..", "docs", "benchmarks.md"))
    ap.add_argument("--smoke", action="store_true", help="one round of each way, no table")
    ap.add_argument("--ways", default=",".join(w for _, w in WAYS),
                    help="which ways, comma-separated (a table needs them all)")
    ap.add_argument("--keep", action="store_true", help="keep each run's files, and say where")
    args = ap.parse_args()
    if not os.environ.get("CRUN_BENCH_IN_NETNS"):
        return in_private_netns(sys.argv)
    if args.smoke:
        args.rounds = 1
    results = {way: [] for _, way in WAYS}
    ways = [(n, w) for n, w in WAYS if w in args.ways.split(",")]
    for r in range(args.rounds):
        for name, way in (ways if r % 2 == 0 else ways[::-1]):
            res = run_once(args, way)
            print(f"  round {r}, {name}: {res}", file=sys.stderr)
            results[way].append(res)
    lines = table(results)
    print("\n".join(lines))
    if args.smoke or len(ways) < len(WAYS):
        # crun's own ways must work; torchrun's failures are the anchor's, counted in a table.
        return 1 if any("failed" in r for w, runs in results.items() if w not in TORCHRUN
                        for r in runs) else 0
    command = ("python3 tests/bench/node_lost_bench.py --crun build/launcher/crun "
               "--torch2-python \"$(bash scripts/setup-torch2.sh)\"")
    intro = (
        f"`tests/bench/node_lost_bench.py`: nodes a and b, 2 stock PyTorch DDP workers each "
        f"(`tests/bench/recovery_worker.py`, gloo on the CPU, OMP_NUM_THREADS=1, PyTorch "
        f"{torch_version(args.torch2_python)}) holding {args.ckpt_mb} MiB of state a rank, "
        f"saved after every step; a spare c waits. Once every rank has done step "
        f"{args.kill_after}, node b (its launcher and workers) is lost and c takes its ranks. "
        f"crun: a `crun rendezvous` daemon, heartbeat_timeout 3 s (the default); \"peer copy\": "
        f"b SIGKILLed, c loads b's ranks from a's copies; \"host silent\": b SIGSTOPped (its "
        f"sockets stay open), so the service must notice the missing heartbeats; \"disk\": "
        f"`--snapshot-replicas off --checkpoint-dir` (every step, 2 kept, one directory every "
        f"node reaches); `--warm`: c is a hot spare whose template imported torch before the "
        f"loss. torchrun: c10d hosted by a (keep-alive 5 s × 3), c on its redundancy list "
        f"(\"waiting agent\") or started right after the loss, as a scheduler replaces a node; "
        f"rank 0 `torch.save`s after every step, every rank `torch.load`s at its start; b "
        f"SIGKILLed. Every figure is the slowest rank's, the median of {args.rounds} runs that "
        f"alternate the ways; a failed run is counted. {measured_at()}")
    write_section(args.out, "node-lost-bench",
                  [intro, "", *lines, "", f"Reproduce: `{command}`"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
