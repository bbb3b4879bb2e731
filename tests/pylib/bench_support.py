"""Helpers shared by the benchmark programs in tests/bench (stdlib only)."""
import os
import selectors
import signal
import subprocess
import sys
import time


NETNS_PREFIX = "crun-bench-"


def in_private_netns(argv):
    """Re-runs a script (argv[0]) inside a fresh network namespace that has only loopback, with
    CRUN_BENCH_IN_NETNS set; returns its exit code. Needs root. Keeps the host's resolver out of
    the numbers: PyTorch 2.x's stores reverse-resolve peers and stall where DNS does not answer.
    The namespace goes when the script ends, fails, or this process gets SIGTERM or SIGHUP (the
    script is killed first); one left by a run killed outright is swept by the next run."""
    sweep_stale_netns()
    ns = f"{NETNS_PREFIX}{os.getpid()}"

    def end(signum, _frame):
        raise SystemExit(128 + signum)  # subprocess.run kills the script, `finally` runs

    before = {sig: signal.signal(sig, end) for sig in (signal.SIGTERM, signal.SIGHUP)}
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"], check=True)
        env = dict(os.environ, CRUN_BENCH_IN_NETNS=ns)
        return subprocess.run(["ip", "netns", "exec", ns, sys.executable, *argv],
                              env=env).returncode
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
        for sig, handler in before.items():
            signal.signal(sig, handler)


def sweep_stale_netns(prefix=NETNS_PREFIX):
    """Deletes the namespaces named `prefix`PID (in_private_netns's) or `prefix`PID-N-HOST
    (tests/pylib/fabric.py's, prefix "crun") whose process PID is gone (SIGKILL, or ctest's
    TIMEOUT, runs no cleanup) and that hold no process; returns their names. Another run's,
    alive, is kept."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    swept = []
    for line in listed.splitlines():
        name = line.split(" ", 1)[0]
        pid = name[len(prefix):].split("-", 1)[0]
        if not name.startswith(prefix) or not pid.isdigit():
            continue
        if os.path.exists(f"/proc/{pid}"):
            continue
        inside = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
        if inside.stdout.strip():
            continue
        if subprocess.run(["ip", "netns", "del", name]).returncode == 0:
            swept.append(name)
    return swept


def timed_run(cmd, env=None, limit=600):
    """Runs `cmd` (stdout to /dev/null, stderr kept) and times it from the spawn to its exit;
    returns (seconds, returncode, stderr text), returncode None when it ran past `limit` s (then
    killed). The exit is seen through a pidfd, which wakes the wait the moment the process
    ends: subprocess.run's timeout path polls with sleeps of 1 ms and more, which added 1.2 ms
    to a 0.7 ms `/bin/true` and made the smallest figures depend on where a poll fell."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    pidfd = os.pidfd_open(p.pid)
    err = p.stderr.fileno()
    chunks = []
    exited = False
    with selectors.DefaultSelector() as sel:
        sel.register(pidfd, selectors.EVENT_READ)
        sel.register(err, selectors.EVENT_READ)
        while not exited:
            left = t0 + limit - time.perf_counter()
            if left <= 0:
                p.kill()
                break
            for key, _ in sel.select(left):
                if key.fd == pidfd:
                    exited = True
                elif data := os.read(err, 65536):
                    chunks.append(data)
                else:
                    sel.unregister(err)
    p.wait()  # it has ended (or was killed): reaped at once
    seconds = time.perf_counter() - t0
    os.close(pidfd)
    os.set_blocking(err, False)  # what it wrote before ending; a worker may hold the pipe on
    try:
        while data := os.read(err, 65536):
            chunks.append(data)
    except BlockingIOError:
        pass
    p.stderr.close()
    return seconds, p.returncode if exited else None, b"".join(chunks).decode(errors="replace")


def measured_at():
    """"Measured at commit abc1234 (2026-11-23), on <machine>": what a table must say about
    when it was true. A tree with uncommitted changes (but for docs/benchmarks.md) says so."""
    here = os.path.dirname(os.path.abspath(__file__))
    def git(*args):
        return subprocess.run(["git", "-C", here, *args], capture_output=True, text=True).stdout.strip()
    # A copy of the tree on another machine (scripts/gpu-check.sh on a GPU machine) does not
    # carry this history: its line is the one `prepare` wrote where the history was.
    if os.environ.get("CRUN_MEASURED_AT"):
        return os.environ["CRUN_MEASURED_AT"]
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    # The tables the benchmarks and suites write are not what they measure: a sequence of them,
    # each writing its own table, stays at one commit.
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ":/",
                  ":(exclude,top)docs/benchmarks.md", ":(exclude,top)docs/reliability.md")
    dirty = " plus uncommitted changes" if changed else ""
    date = git("show", "-s", "--format=%cs", "HEAD")
    cpus = os.cpu_count()
    return f"Measured at commit {commit}{dirty} ({date}), on this machine ({cpus} CPUs)."


def write_section(path, name, lines):
    """Puts `lines` between `<!-- NAME:begin -->` and `<!-- NAME:end -->` in the markdown file
    at `path` (appending the section when the markers are not there yet)."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    section = "\n".join([begin, "", *lines, "", end])
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    if begin in text and end in text:
        text = text[:text.index(begin)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    with open(path, "w") as f:
        f.write(text)
    print(f"wrote {path}", file=sys.stderr)


def table_rows(rows, results):
    """Markdown rows: for each (label, format) of `rows`, the label and format(r) of each of
    `results`, one column each."""
    return [f"| {label} | " + " | ".join(fmt(r) for r in results) + " |" for label, fmt in rows]


def human(nbytes):
    """A byte count as a table shows it: "4 KiB", "256 MiB", "1 GiB"."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes // size} {unit}"
    return f"{nbytes} B"
