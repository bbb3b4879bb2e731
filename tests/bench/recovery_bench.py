#!/usr/bin/env python3
"""Recovery benchmark: what a user feels when a worker crashes, from the crash to every rank
training again, with stock PyTorch DDP workers (tests/bench/recovery_worker.py: gloo, CPU,
a small model), crun against torchrun 2.x in the same run, alternating. Writes its section
of docs/benchmarks.md (between the recovery-bench markers).

Rows, each for one node x 2 workers (--standalone) and for 2 agents x 2 workers on one host
(crun's rendezvous service; torchrun's c10d, the first agent is_host):
  * the first start: launch -> every rank's first step done;
  * a crash (global rank 1 exits 7 at step 3 of the first attempt, --max-restarts 1):
    crash -> every worker of the next attempt exec'd, -> imported torch, -> process group
    formed, -> first step done;
  * the same with a checkpoint of --ckpt-mb MiB that rank 0 saves every 2 steps and every
    rank loads at the restart (the data path users have);
  * the same with a snapshot of --ckpt-mb MiB per rank that every rank saves after every step
    into crun's node memory and loads at the restart (crun only: docs/checkpoints.md).
Each also says how many steps done before the crash the restart trained again.
With PyTorch 2.x (PyPI) and Debian's 1.13 (one node). A run whose restart failed (a launcher
that did not exit 0, or a rank that did not reach the last step) is a failure of that
launcher: it is counted in the table, never dropped.

Every figure is the median over --rounds runs; the launchers alternate within each round.
Everything runs in a private network namespace with only loopback (needs root).

With --imports, it writes instead where a worker's own start goes (its section
recovery-imports): `python -X importtime` of what the template imports, per PyTorch, the
median of --rounds runs on an otherwise idle machine.

Usage: recovery_bench.py --crun BIN --torch2-python PY [--torch1-python PY] [--rounds 3]
                         [--ckpt-mb 200] [--out FILE] [--smoke | --imports]
"""
import argparse
import glob
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from bench_support import in_private_netns, measured_at, write_section  # noqa: E402
from crun_testing import free_port, kill_all, whole_lines  # noqa: E402

WORKER = os.path.join(HERE, "recovery_worker.py")
LIMIT_S = 120  # one job, all its agents: a run takes about 10 s; a hung launcher is a failure
STEPS = 6
CRASH_STEP = 3
STAGES = ("exec", "imported", "group", "step")
ONE_NODE = "1 node × 2 workers"
FIRST_STEP = "crash → every rank's first step"
IMPORTED = "crash → every worker imported torch"


def launcher_cmds(args, launcher, python, nodes, port):
    """The command of each agent."""
    if nodes == 1:
        common = [["--standalone", "--nnodes", "1"]]
    else:
        common = [["--nnodes", str(nodes), "--rdzv-backend", "c10d", "--rdzv-endpoint",
                   f"127.0.0.1:{port}", "--rdzv-id", "recovery", "--rdzv-conf",
                   f"is_host={1 if i == 0 else 0}"] for i in range(nodes)]
    common = [c + ["--nproc-per-node", "2", "--max-restarts", "1"] for c in common]
    if launcher == "torchrun":
        return [[args.torch2_python, "-m", "torch.distributed.run", *c] for c in common]
    warm = ["--warm"] if launcher == "crun-warm" else []
    return [[args.crun, *warm, *c] for c in common]


def run_once(args, launcher, python, nodes, scenario):
    """One job; returns {"first": ms, "exec": ms, ...} (from the crash) or {"failed": why}."""
    out = tempfile.mkdtemp(prefix="crun-recovery-")
    ckpt = os.path.join(out, "ckpt")
    os.makedirs(ckpt)
    worker_args = [WORKER, out, "--steps", str(STEPS), "--crash-step", str(CRASH_STEP)]
    if scenario == "ckpt":
        worker_args += ["--ckpt-mb", str(args.ckpt_mb), "--ckpt-dir", ckpt]
    if scenario == "snapshot":
        worker_args += ["--ckpt-mb", str(args.ckpt_mb), "--snapshot"]
    env = dict(os.environ, PYTHON_EXEC=python, OMP_NUM_THREADS="1", LOGLEVEL="WARNING")
    port = free_port()
    # Each agent's stderr into a file, not a pipe: a worker that outlived its launcher
    # (torchrun's do, ppid 1) would hold a pipe open, and reading it would wait for that worker.
    logs = [os.path.join(out, f"agent-{i}.err") for i in range(nodes)]
    t0 = time.time_ns()
    procs = []
    try:
        # Started inside the try: a node that fails to start ends the ones started before it.
        for cmd, log in zip(launcher_cmds(args, launcher, python, nodes, port), logs):
            with open(log, "w") as err:
                procs.append(subprocess.Popen([*cmd, *worker_args], stdout=subprocess.DEVNULL,
                                              stderr=err, env=env))
        deadline = time.monotonic() + LIMIT_S
        errors = []
        for i, (p, log) in enumerate(zip(procs, logs)):
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                errors.append(f"agent {i} still running after {LIMIT_S} s")
                continue
            if p.returncode != 0:
                with open(log) as f:
                    errors.append(f"agent {i} exited {p.returncode}: {f.read().strip()[-300:]}")
        return figures(out, t0, nodes * 2, errors)
    finally:
        kill_all(procs)
        left = end_leftovers(out)
        if left:
            # What a launcher left running after it ended is its failure, and is ended here
            # so that it cannot weigh on the runs after it.
            print(f"  {launcher}: {left} process(es) left running after the job; ended",
                  file=sys.stderr)
        shutil.rmtree(out, ignore_errors=True)


def end_leftovers(out):
    """SIGKILLs every live worker of this run (its command line names the worker and the run's
    directory); returns how many there were."""
    found = 0
    for stat in glob.glob("/proc/[0-9]*/stat"):
        pid = int(stat.split("/")[2])
        try:
            with open(stat) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            if b"recovery_worker.py" in cmdline and out.encode() in cmdline:
                os.kill(pid, signal.SIGKILL)
                found += 1
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
    return found


def figures(out, t0, world, errors):
    """The run's figures: {"first", "exec", "imported", "group", "step"} in ms. A failed run
    is {"failed": why} plus the figures of the stages every rank still reached (a restart that
    failed in its process group still exec'd and imported): the table shows those beside the
    count of failed runs, and never a figure a failed run did not reach."""
    events = [json.loads(line) for path in glob.glob(os.path.join(out, "*.jsonl"))
              for line in whole_lines(path) if line.strip()]
    crash = [e["t"] for e in events if e["stage"] == "crash"]
    last = {e["rank"] for e in events if e["stage"] == "step" and e["step"] == STEPS - 1}
    if not errors and (len(crash) != 1 or len(last) != world):
        errors.append(f"{len(crash)} crash(es), {len(last)} of {world} ranks reached the end")

    def every_rank(attempt, stage):
        """When the last rank of `attempt` reached `stage` (its first time); None if one did
        not."""
        firsts = {}
        for e in events:
            if e["attempt"] == attempt and e["stage"] == stage:
                firsts[e["rank"]] = min(firsts.get(e["rank"], e["t"]), e["t"])
        return max(firsts.values()) if len(firsts) == world else None

    result = {"failed": "; ".join(errors)} if errors else {}
    resumed = [e["step"] for e in events if e["attempt"] == 1 and e["stage"] == "step"]
    if resumed and len(crash) == 1:
        # Steps done before the crash that the restart trains again (the crashed step was
        # never done).
        result["redone"] = CRASH_STEP - min(resumed)
    first = every_rank(0, "step")
    if first is not None:
        result["first"] = (first - t0) / 1e6
    for stage in STAGES:
        t = every_rank(1, stage) if len(crash) == 1 else None
        if t is None:
            break
        result[stage] = (t - crash[0]) / 1e6
    return result


def descendants(pid):
    out = []
    for task in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(task) as f:
                children = [int(x) for x in f.read().split()]
        except FileNotFoundError:
            continue
        for c in children:
            out += [c, *descendants(c)]
    return out


def smaps(pid):
    """(PSS, RSS) of a process in bytes, from /proc/PID/smaps_rollup."""
    got = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Pss", "Rss"):
                    got[key] = int(rest.split()[0]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return got.get("Pss", 0), got.get("Rss", 0)


def memory_once(args, launcher, python):
    """Every process of the node while its 2 workers hold after 3 steps: {"pss", "rss"} summed,
    and the warm template's own RSS."""
    out = tempfile.mkdtemp(prefix="crun-recovery-mem-")
    hold = os.path.join(out, "hold.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(hold)
    listener.listen(4)
    listener.settimeout(LIMIT_S)
    env = dict(os.environ, PYTHON_EXEC=python, OMP_NUM_THREADS="1", LOGLEVEL="WARNING")
    cmd = launcher_cmds(args, launcher, python, 1, free_port())[0]
    p = subprocess.Popen([*cmd, WORKER, out, "--steps", "3", "--hold", hold],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    conns = []
    try:
        conns = [listener.accept()[0] for _ in range(2)]
        result = {"pss": 0, "rss": 0, "template": 0}
        for pid in [p.pid, *descendants(p.pid)]:
            pss, rss = smaps(pid)
            result["pss"] += pss
            result["rss"] += rss
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"crun_warm.py" in f.read():
                        result["template"] += rss
            except FileNotFoundError:
                pass
        for c in conns:
            c.send(b"x")
        _, err = p.communicate(timeout=LIMIT_S)
        if p.returncode != 0:
            return {"failed": f"exited {p.returncode}: {err.strip()[-300:]}"}
        return result
    except (socket.timeout, subprocess.TimeoutExpired) as e:
        return {"failed": str(e)}
    finally:
        for c in conns:
            c.close()
        listener.close()
        kill_all([p])
        shutil.rmtree(out, ignore_errors=True)


def measure(args, case, launchers):
    """{launcher: [result per round]} for one case, the launchers alternating (crun's only for a
    snapshot: torchrun has none)."""
    if case["scenario"] == "snapshot":
        launchers = [(n, l) for n, l in launchers if l != "torchrun"]
    results = {name: [] for name, _ in launchers}
    for r in range(args.rounds):
        order = launchers if r % 2 == 0 else launchers[::-1]
        for name, launcher in order:
            res = run_once(args, launcher, case["python"], case["nodes"], case["scenario"])
            if "failed" in res:
                print(f"  {case['label']}, {name}: FAILED: {res['failed']}", file=sys.stderr)
            results[name].append(res)
    return results


def memory_table(args):
    """Memory while training, crun cold and warm and torchrun, alternating."""
    results = {name: [] for name, _ in LAUNCHERS}
    for r in range(args.rounds):
        for name, launcher in (LAUNCHERS if r % 2 == 0 else LAUNCHERS[::-1]):
            res = memory_once(args, launcher, args.torch2_python)
            if "failed" in res:
                print(f"  memory, {name}: FAILED: {res['failed']}", file=sys.stderr)
            results[name].append(res)
    names = [name for name, _ in LAUNCHERS]

    def mib(runs, key):
        good = [r[key] for r in runs if "failed" not in r]
        if not good:
            return f"failed {len(runs)} of {len(runs)}"
        return f"{statistics.median(good) / (1 << 20):,.0f} MiB"
    return ["| every process of 1 node × 2 workers, while training | " + " | ".join(names) + " |",
            "|---|" + "---|" * len(names),
            "| PSS, summed | " + " | ".join(mib(results[n], "pss") for n in names) + " |",
            "| RSS, summed | " + " | ".join(mib(results[n], "rss") for n in names) + " |",
            "| the warm template's RSS | " + " | ".join(
                mib(results[n], "template") if n == "crun --warm" else "—" for n in names)
            + " |"]


def cell(runs, key):
    """The median of the runs that reached `key`, and how many runs failed: a failed run's
    stages before its failure count, what it never reached does not. None: not measured."""
    if runs is None:
        return "—"
    got = [r[key] for r in runs if key in r]
    failed = sum(1 for r in runs if "failed" in r)
    if not got:
        return f"failed {failed} of {len(runs)}"
    text = f"{statistics.median(got):,.0f}" + ("" if key == "redone" else " ms")
    return text + (f" ({failed} of {len(runs)} failed)" if failed else "")


def cases(args):
    out = []
    for nodes, where in ((1, ONE_NODE), (2, "2 agents × 2 workers")):
        out.append({"label": f"{where}, crash", "nodes": nodes, "scenario": "crash",
                    "python": args.torch2_python, "torch": "2.x"})
        out.append({"label": f"{where}, crash, {args.ckpt_mb} MiB checkpoint", "nodes": nodes,
                    "scenario": "ckpt", "python": args.torch2_python, "torch": "2.x"})
        out.append({"label": f"{where}, crash, {args.ckpt_mb} MiB snapshot a rank", "nodes": nodes,
                    "scenario": "snapshot", "python": args.torch2_python, "torch": "2.x"})
    if args.torch1_python:
        out.append({"label": f"{ONE_NODE}, crash", "nodes": 1, "scenario": "crash",
                    "python": args.torch1_python, "torch": "1.13"})
    return out[:1] if args.smoke else out


def torch_version(python):
    return subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True, check=True).stdout.strip()


def table(args, measured):
    names = [name for name, _ in LAUNCHERS]
    lines = ["| case | torch | figure | " + " | ".join(names) + " |",
             "|---|---|---|" + "---|" * len(names)]
    rows = (("first", "launch → every rank's first step"),
            ("exec", "crash → every worker exec'd"),
            ("imported", IMPORTED),
            ("group", "crash → process group formed"),
            ("step", FIRST_STEP),
            ("redone", "steps lost (done before the crash, trained again)"))
    for case, results in measured:
        for key, label in rows:
            lines.append(f"| {case['label']} | {case['torch']} | {label} | "
                         + " | ".join(cell(results.get(n), key) for n in names) + " |")
    return lines


LAUNCHERS = (("crun cold", "crun"), ("crun --warm", "crun-warm"), ("torchrun 2.x", "torchrun"))
# --smoke's: crun --warm and torchrun 2.x run this same case (one node, a crash) through
# run_once in bench_check_smoke (check.py's recovery group: crun's must succeed whole).
SMOKE_LAUNCHERS = LAUNCHERS[:1]
# What the template imports (agent/warm/warm_template.cc, DefaultWarmModules), in its order.
TEMPLATE_IMPORTS = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo")


def import_times(python):
    """One `python -X importtime` of the template's imports: {"wall": ms of the whole command,
    "startup": ms of `python -c pass`, "<module>": cumulative ms of each top-level import,
    "torch/<child>": cumulative ms of each of torch's own direct imports}."""
    # As the template does: each where the interpreter has it (1.13 has no torch._dynamo).
    # It ends at once, as a worker goes on: an interpreter's own teardown with torch loaded
    # (about 0.6 s here) is no part of a start.
    code = "\n".join([f"try:\n    import {m}\nexcept ModuleNotFoundError:\n    pass"
                      for m in TEMPLATE_IMPORTS]
                     + ["import os, sys", "print(' '.join(sorted(sys.modules)), flush=True)",
                        "os._exit(0)"])
    t0 = time.monotonic()
    subprocess.run([python, "-c", "pass"], check=True)
    startup = (time.monotonic() - t0) * 1e3
    t0 = time.monotonic()
    r = subprocess.run([python, "-X", "importtime", "-c", code], capture_output=True, text=True,
                       check=True)
    out = {"wall": (time.monotonic() - t0) * 1e3, "startup": startup}
    loaded = set(r.stdout.split())
    # Lines "import time: self [us] | cumulative | imported package", a nested import indented
    # by two spaces a level and printed before the module that imported it.
    children = []
    for line in r.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line[len("import time:"):].split("|")
        depth = (len(name) - len(name.lstrip(" ")) - 1) // 2
        name, ms = name.strip(), int(cumulative) / 1e3
        if depth == 1:
            children.append((name, ms))
        elif depth == 0:
            if name in loaded:  # a module that failed still gets a line
                out[name] = ms
            if name == "torch":
                out.update({f"torch/{c}": t for c, t in children})
            children = []
    return out


def import_table(args):
    """Where a worker's own start goes, for each PyTorch: the template's imports, one by one."""
    pythons = [("2.x", args.torch2_python)] + ([("1.13", args.torch1_python)]
                                                if args.torch1_python else [])
    runs = {label: [import_times(py) for _ in range(args.rounds)] for label, py in pythons}

    def med(label, key):
        got = [r[key] for r in runs[label] if key in r]
        return statistics.median(got) if got else None

    lines = ["| PyTorch | " + " | ".join(label for label, _ in pythons) + " |",
             "|---|" + "---|" * len(pythons)]

    def add(title, key):
        cells = [med(label, key) for label, _ in pythons]
        if any(c is not None for c in cells):
            lines.append(f"| {title} | " + " | ".join(
                "—" if c is None else f"{c:,.0f} ms" for c in cells) + " |")
    add("the interpreter's own start (`python -c pass`)", "startup")
    for m in TEMPLATE_IMPORTS:
        add(f"`import {m}`, cumulative", m)
    add("**the start and all of it, wall clock**", "wall")
    # torch's heaviest direct imports, by the 2.x figures.
    first = pythons[0][0]
    heavy = sorted((k for k in runs[first][0] if k.startswith("torch/")),
                   key=lambda k: -(med(first, k) or 0))[:6]
    lines += ["", "The heaviest of `import torch`'s own imports (cumulative, PyTorch "
              f"{first}):", "", "| module | " + " | ".join(label for label, _ in pythons)
              + " |", "|---|" + "---|" * len(pythons)]
    for k in heavy:
        add(f"`{k[len('torch/'):]}`", k)
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--crun", required=True)
    ap.add_argument("--torch2-python", required=True)
    ap.add_argument("--torch1-python", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ckpt-mb", type=int, default=200)
    ap.add_argument("--out", default=os.path.join(HERE, "..", "..", "docs", "benchmarks.md"))
    ap.add_argument("--smoke", action="store_true", help="one case, one round, crun cold, no table")
    ap.add_argument("--imports", action="store_true",
                    help="only where a worker's own start goes (python -X importtime)")
    args = ap.parse_args()
    if not os.environ.get("CRUN_BENCH_IN_NETNS"):
        return in_private_netns(sys.argv)
    if args.imports:
        lines = import_table(args)
        print("\n".join(lines))
        command = ("python3 tests/bench/recovery_bench.py --imports --crun build/launcher/crun "
                   "--torch2-python \"$(bash scripts/setup-torch2.sh)\" "
                   "--torch1-python /usr/bin/python3")
        write_section(args.out, "recovery-imports",
                      [f"Median of {args.rounds} runs, one at a time, on an otherwise idle "
                       f"machine. {measured_at()}", "", *lines, "", f"Reproduce: `{command}`"])
        return 0
    if args.smoke:
        args.rounds = 1
    measured = []
    for case in cases(args):
        print(f"{case['label']} (torch {case['torch']})", file=sys.stderr)
        measured.append((case, measure(args, case,
                                       SMOKE_LAUNCHERS if args.smoke else LAUNCHERS)))
    lines = table(args, measured)
    if not args.smoke:
        lines += ["", *memory_table(args)]
    print("\n".join(lines))
    if args.smoke:
        # It runs and parses, and says which runs failed; it judges no launcher (PyTorch's own
        # restarts fail now and then: the table counts them) and records nothing.
        return 0
    versions = f"PyTorch {torch_version(args.torch2_python)} (PyPI)"
    if args.torch1_python:
        versions += f" and {torch_version(args.torch1_python)} (Debian)"
    command = ("python3 tests/bench/recovery_bench.py --crun build/launcher/crun "
               "--torch2-python \"$(bash scripts/setup-torch2.sh)\" "
               "--torch1-python /usr/bin/python3")
    intro = (f"`tests/bench/recovery_bench.py`: stock PyTorch DDP workers "
             f"(`tests/bench/recovery_worker.py`: gloo on the CPU, a small model, "
             f"OMP_NUM_THREADS=1), {versions}; torchrun is 2.x's, with its default monitor "
             f"interval (0.1 s). Global rank 1 exits 7 at step {CRASH_STEP} of the first "
             f"attempt (`--max-restarts 1`); every figure is the slowest rank's, the median "
             f"of {args.rounds} runs that alternate the launchers. A run whose restart failed "
             f"is counted as failed in every row (\"(2 of 3 failed)\"); the stages it "
             f"reached before it failed count in their rows, the ones it never reached do "
             f"not. {measured_at()}")
    write_section(args.out, "recovery-bench",
                  [intro, "", *lines, "", f"Reproduce: `{command}`"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
