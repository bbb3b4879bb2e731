"""The configuration matrix in full and the restart soaks at full length: what every CI run
covers with pairwise covers, seeded samples and shorter soaks (tests/integration/test_matrix.py
--cover ci, SOAK_COUNTS=ci), this runs whole, and it writes its last run, with the commit it
ran at, into docs/reliability.md (between the matrix-bench markers).

  matrix-<family>   test_matrix.py --cover full --families <family>, one run a family: full
                    (120 cases), pairwise (40), snapshot, crashloop, health (16 each),
                    straggler (48)
  soak              test_restart_soak.py, SOAK_COUNTS=full: every case at its full count, the
                    cold DataLoader cases too; it rewrites its own table (the soak markers)
  soak-warm         the same suite's Python workers warm (tests/warm_variant.py), SOAK_COUNTS=full
                    (the soak-warm markers)
  stragglers-noisy  test_stragglers.py's noisy job at 9000 steps (3 minutes): the evidence
                    for the slow-rank detector's defaults, 800 steps in CI

Each part runs as a process group of its own with a tag in its environment, which everything
it starts inherits (crun, workers, etcd). However the part ends (passed, failed, past the
deadline, or this program stopped by SIGINT, SIGTERM or SIGHUP), it is asked to stop (SIGINT,
so that its suites' `finally` and `with` blocks run), then killed, and whatever still carries
the tag is stopped (crun with SIGTERM first, so that it removes its cgroups) and killed; the
network namespaces its suites made and the cgroups a killed crun left are removed, and its
temporary directory (TMPDIR) goes with it. A tagged process still there after a part passed
is a leak: the part's result says how many. The whole run has a deadline (--deadline-s): the
part running then is stopped, those after it do not start, and the table says so.

Usage: matrix_bench.py --crun BIN [--torch-python PY] [--parts P,...] [--deadline-s S]
                       [--doc FILE | --no-doc] [--log-dir DIR]
Exit status 0 when every part passed, 1 when one did not, 128 + N when stopped by signal N."""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from bench_support import measured_at, write_section  # noqa: E402
from crun_testing import alive, proc_files  # noqa: E402

INTEGRATION = os.path.join(ROOT, "tests", "integration")
MATRIX = os.path.join(INTEGRATION, "test_matrix.py")
SOAK = os.path.join(INTEGRATION, "test_restart_soak.py")
STRAGGLERS = os.path.join(INTEGRATION, "test_stragglers.py")
SNAPSHOTS = os.path.join(INTEGRATION, "test_snapshots.py")
WARM_VARIANT = os.path.join(ROOT, "tests", "warm_variant.py")
FAMILIES = ("full", "pairwise", "snapshot", "crashloop", "health", "straggler")
TAG_VARIABLE = "CRUN_MATRIX_BENCH_TAG"
SECTION = "matrix-bench"
INTERRUPT_GRACE_S = 20  # a part's suite, after SIGINT, to stop its cruns and leave
CRUN_GRACE_S = 10  # a tagged crun, after SIGTERM, to stop its workers and remove its cgroups
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Part:
    def __init__(self, name, what, command, env=None):
        self.name, self.what, self.command, self.env = name, what, command, env or {}


def parts(torch_python, doc, crun=""):
    """Every part, in the order they run."""
    py = sys.executable
    # The SDK's snapshot worker, built beside crun (build/tests/integration/).
    build = os.path.dirname(os.path.dirname(os.path.abspath(crun))) if crun else ""
    snapshot_worker = os.path.join(build, "tests", "integration", "snapshot_worker")
    soak_env = {"SOAK_COUNTS": "full", "SOAK_SCALE": "1", "PYTHON_EXEC": torch_python}
    if doc:
        soak_env["CRUN_SOAK_DOC"] = doc
    # -k: the family's cases, not the covers' self-check (CI runs that).
    out = [Part(f"matrix-{f}", f"test_matrix.py --cover full --families {f}",
                [py, MATRIX, "--cover", "full", "--families", f, "-k", f"test_{f}_"],
                {"PYTHON_EXEC": torch_python}) for f in FAMILIES]
    out.append(Part("soak", "test_restart_soak.py, SOAK_COUNTS=full, DataLoader cases too",
                    [py, SOAK], soak_env))
    out.append(Part("soak-warm", "the same, Python workers warm (warm_variant.py)",
                    [py, WARM_VARIANT, "--", py, SOAK, "-k", "multiprocessing", "-k",
                     "dataloader"], soak_env))
    out.append(Part("stragglers-noisy", "test_stragglers.py -k noisy, 9000 steps",
                    [py, STRAGGLERS, "-k", "noisy"], {"STRAGGLER_NOISY_STEPS": "9000"}))
    out.append(Part("snapshot-kills", "test_snapshots.py's two kill soaks, 200 kills each",
                    [py, SNAPSHOTS, "-k", "test_soak_kill_in_the_middle_of_a_save", "-k",
                     "test_disk_writes_survive_crun_sigkilled"],
                    {"SNAPSHOT_WORKER": snapshot_worker, "SNAPSHOT_SOAK_KILLS": "200",
                     "SNAPSHOT_DISK_KILLS": "200", "TORCH_PYTHONS": torch_python}))
    return out


# ---- stopping what a part started ------------------------------------------------------------

def tagged(tag):
    """The live processes whose environment carries the part's tag."""
    needle = f"{TAG_VARIABLE}={tag}".encode()
    return sorted(pid for pid, env in proc_files("environ")
                  if needle in env.split(b"\0") and alive(pid))


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def cgroup_dir_of(pid):
    """Where crun `pid` keeps its cgroups (crun-<pid>, agent/supervise/worker_cgroup.cc), or
    None without cgroup2."""
    try:
        with open("/proc/self/mountinfo") as f:
            mount = next((m[4] for m in map(str.split, f) if m[m.index("-") + 1] == "cgroup2"),
                         None)
        with open(f"/proc/{pid}/cgroup") as f:
            path = next((line[3:].strip() for line in f if line.startswith("0::")), None)
    except (OSError, ValueError):
        return None
    if mount is None or path is None:
        return None
    own = f"crun-{pid}"
    parts_ = path.strip("/").split("/") if path != "/" else []
    base = parts_[:parts_.index(own)] if own in parts_ else parts_
    return os.path.join(mount, *base, own)


def remove_cgroup(path):
    """rmdir of a cgroup directory and those below it, deepest first: a cgroup with processes
    stays (rmdir refuses), an empty one goes."""
    if not path or not os.path.isdir(path):
        return
    for root, dirs, _ in os.walk(path, topdown=False):
        for d in dirs:
            try:
                os.rmdir(os.path.join(root, d))
            except OSError:
                pass
    try:
        os.rmdir(path)
    except OSError:
        pass


def remove_namespaces(pids):
    """The network namespaces tests/pylib/fabric.py made for one of `pids` (crun<pid>-<host>)
    whose process is gone."""
    if shutil.which("ip") is None:
        return
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        name = line.split(" ", 1)[0]
        m = re.match(r"crun(\d+)-", name)
        if m and int(m.group(1)) in pids and not alive(int(m.group(1))):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def kill(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def kill_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def wait_gone(pids, seconds):
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def stop_part(p, tag):
    """Stops the part `p` and everything it started; returns the tagged processes that were
    still there once `p` itself had ended (besides those it stopped on its own)."""
    suites = set(tagged(tag)) | {p.pid}  # Fabric names its namespaces for its suite's pid
    if p.poll() is None:  # not reaped: its process group's id is still its own
        kill_group(p.pid, signal.SIGINT)
        try:
            p.wait(timeout=INTERRUPT_GRACE_S)
        except subprocess.TimeoutExpired:
            kill_group(p.pid, signal.SIGKILL)
            p.wait()
    left = tagged(tag)
    if left:
        cruns = {pid: cgroup_dir_of(pid) for pid in left if comm(pid) == "crun"}
        for pid in cruns:
            kill(pid, signal.SIGTERM)
        wait_gone(cruns, CRUN_GRACE_S)
        for _ in range(200):
            now = tagged(tag)
            if not now:
                break
            for pid in now:
                kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        for path in cruns.values():
            remove_cgroup(path)
    remove_namespaces(suites)
    return left


# ---- one part ---------------------------------------------------------------------------------

def unittest_counts(text):
    """(run, failed, skipped) from unittest's last summary in `text`, or None without one."""
    ran = re.findall(r"^Ran (\d+) tests? in ", text, re.M)
    verdict = re.findall(r"^(OK|FAILED)(?: \(([^)]*)\))?\s*$", text, re.M)
    if not ran or not verdict:
        return None
    fields = dict((k.strip(), int(v)) for k, v in re.findall(r"([a-z ]+)=(\d+)",
                                                             verdict[-1][1] or ""))
    failed = fields.get("failures", 0) + fields.get("errors", 0) + \
        fields.get("unexpected successes", 0)
    return int(ran[-1]), failed, fields.get("skipped", 0)


def run_part(part, base_env, deadline, log_path, scratch):
    """Runs `part` until it ends or `deadline`; stops everything it started either way. Its
    result: a dict of tests, passed, failed, skipped, seconds and outcome."""
    tag = uuid.uuid4().hex
    tmp = tempfile.mkdtemp(prefix=f"{part.name}-", dir=scratch)
    env = dict(base_env, **part.env, TMPDIR=tmp, PYTHONUNBUFFERED="1")
    env[TAG_VARIABLE] = tag
    t0 = time.monotonic()
    timed_out = False
    with open(log_path, "w") as log:
        p = subprocess.Popen(part.command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
        finally:
            left = stop_part(p, tag)
            shutil.rmtree(tmp, ignore_errors=True)
    seconds = time.monotonic() - t0
    with open(log_path, errors="replace") as f:
        counts = unittest_counts(f.read())
    tests, failed, skipped = counts or (0, 0, 0)
    if timed_out:
        outcome = "stopped at the deadline"
    elif p.returncode != 0:
        outcome = f"failed (exit {p.returncode})"
    elif counts is None:
        outcome = "failed (no unittest summary)"
    elif left:
        outcome = f"failed: {len(left)} process(es) left running"
    else:
        outcome = "passed"
    return {"tests": tests, "passed": max(0, tests - failed - skipped), "failed": failed,
            "skipped": skipped, "seconds": seconds, "outcome": outcome}


def tail(path, lines=60):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def table(results, measured, command):
    rows = [f"`{command}`. {measured}", "",
            "| part | what it runs | tests | passed | failed | skipped | time | result |",
            "|---|---|---|---|---|---|---|---|"]
    total = {"tests": 0, "passed": 0, "failed": 0, "skipped": 0, "seconds": 0.0}
    for part, r in results:
        if r is None:
            rows.append(f"| {part.name} | {part.what} | | | | | | not run (deadline) |")
            continue
        for k in total:
            total[k] += r[k]
        rows.append(f"| {part.name} | {part.what} | {r['tests']} | {r['passed']} | "
                    f"{r['failed']} | {r['skipped']} | {r['seconds']:.0f} s | {r['outcome']} |")
    ok = all(r is not None and r["outcome"] == "passed" for _, r in results)
    rows.append(f"| all | | {total['tests']} | {total['passed']} | {total['failed']} | "
                f"{total['skipped']} | {total['seconds']:.0f} s | "
                f"{'passed' if ok else 'NOT all passed'} |")
    return rows, ok


def main():
    names = [p.name for p in parts("", "")]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--crun", required=True, help="the crun binary")
    ap.add_argument("--torch-python", default="/usr/bin/python3",
                    help="PYTHON_EXEC of the matrix and the soak: a Python with PyTorch 1.13 "
                         "(ctest's CRUN_TORCH1_PYTHON)")
    ap.add_argument("--parts", default=",".join(names),
                    help="comma-separated, of: " + ", ".join(names))
    ap.add_argument("--deadline-s", type=float, default=7200,
                    help="the whole run's limit; the part running then is stopped")
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "reliability.md"),
                    help="where the run is recorded (and the soaks' tables)")
    ap.add_argument("--no-doc", action="store_true", help="record nothing")
    ap.add_argument("--log-dir", help="keep each part's output here (else only a failed "
                                      "part's last lines are shown)")
    args = ap.parse_args()
    chosen = args.parts.split(",")
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        ap.error(f"--parts: no part {', '.join(unknown)} (there are {', '.join(names)})")
    doc = None if args.no_doc else os.path.abspath(args.doc)
    todo = [p for p in parts(args.torch_python, doc, args.crun) if p.name in chosen]
    crun = os.path.abspath(args.crun)
    if not os.access(crun, os.X_OK):
        ap.error(f"--crun {args.crun}: not an executable file")

    measured = measured_at()  # the commit measured, before any table is written
    deadline = time.monotonic() + args.deadline_s
    base_env = dict(os.environ, CRUN_BIN=crun)
    for name in ("PET_WARM", "SOAK_SKIP_COLD", "SOAK_COUNTS", "SOAK_SCALE", "CRUN_SOAK_DOC",
                 "CRUN_MATRIX_SEED", "STRAGGLER_NOISY_STEPS"):
        base_env.pop(name, None)  # the parts say what they want

    def stop(signum, _frame):
        for sig in STOPPING:  # once: the part's stopping is not to be cut short
            signal.signal(sig, signal.SIG_IGN)
        print(f"matrix_bench.py: signal {signum}: stopping the part running; nothing is "
              "recorded", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)  # run_part's `finally` stops the part running

    for sig in STOPPING:
        signal.signal(sig, stop)
    scratch = tempfile.mkdtemp(prefix="crun-mb-")
    log_dir = args.log_dir or scratch
    os.makedirs(log_dir, exist_ok=True)
    results = []
    try:
        for part in todo:
            if time.monotonic() >= deadline:
                results.append((part, None))
                print(f"{part.name}: not run (the deadline passed)", flush=True)
                continue
            print(f"{part.name}: {part.what} ...", flush=True)
            log = os.path.join(log_dir, f"{part.name}.log")
            r = run_part(part, base_env, deadline, log, scratch)
            results.append((part, r))
            print(f"{part.name}: {r['tests']} tests, {r['passed']} passed, {r['failed']} failed, "
                  f"{r['skipped']} skipped in {r['seconds']:.0f} s: {r['outcome']}", flush=True)
            if r["outcome"] != "passed":
                print(f"--- the end of {part.name}'s output ({log}):\n{tail(log)}",
                      file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    command = "python3 tests/bench/matrix_bench.py --crun CRUN --torch-python " + \
        args.torch_python
    if set(chosen) != set(names):
        command += f" --parts {','.join(p.name for p in todo)}"
    rows, ok = table(results, measured, command)
    print("\n".join(rows))
    if doc:
        write_section(doc, SECTION, rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
