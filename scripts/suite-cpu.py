#!/usr/bin/env python3
"""Where the suite's CPU goes: each ctest entry's CPU-seconds and the most memory it held, its
whole process tree counted (orphans too), and what it left running.

  python3 scripts/suite-cpu.py [--out FILE.jsonl] [--top 25] -- bash scripts/test.sh [ARGS]

Runs the command. Every process that a ctest run starts (one ctest entry) is put, as soon as
it is seen (a poll every 10 ms), into a cpuacct group of its own (cgroup v1,
/sys/fs/cgroup/cpuacct: root only), with what it forked before; what it forks later stays
there, reparented or not; the same processes go into a memory group (cgroup v1,
/sys/fs/cgroup/memory), whose resident anonymous memory (total_rss: what the entry's processes
hold, not the page cache of what they read) is read every poll for its peak. When the entry
ends, its group's CPU time is read, and any process still in it is reported as left behind.
crun's own cgroups are cgroup2's, so these groups do not touch what the suites test. Entries
are named by their command line and environment (ctest --show-only=json-v1 of the build
folder), after the run. Writes one JSON line an entry to --out and prints the entries with the
most CPU and the sum; exits as the command did.

The suite on two cores is CPU-bound (docs/reliability.md): an entry's wall time is its share of
the cores, its CPU time what it costs."""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

ROOT = "/sys/fs/cgroup/cpuacct"
MEM_ROOT = "/sys/fs/cgroup/memory"
POLL_S = 0.01


def read(path):
    with open(path) as f:
        return f.read()


def children(pid):
    kids = []
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            kids += [int(x) for x in read(f"/proc/{pid}/task/{t}/children").split()]
    except OSError:
        pass
    return kids


def ctest_pids(below):
    """ctest processes in the tree under `below`."""
    found, todo = [], [below]
    while todo:
        p = todo.pop()
        try:
            if read(f"/proc/{p}/comm").strip() == "ctest":
                found.append(p)
                continue  # its children are entries, not more ctests
        except OSError:
            continue
        todo += children(p)
    return found


def build_dir_of(ctest):
    """The build folder a ctest process runs (it runs there, --test-dir or not)."""
    try:
        return os.readlink(f"/proc/{ctest}/cwd")
    except OSError:
        return ""


def entries(build_dir):
    """Every entry of build_dir: (name, command, environment it sets)."""
    try:
        r = subprocess.run(["ctest", "--test-dir", build_dir, "--show-only=json-v1"],
                           capture_output=True, text=True, timeout=120)
        tests = json.loads(r.stdout)["tests"]
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired):
        return []
    found = []
    for t in tests:
        if "command" not in t:
            continue
        env = {}
        for prop in t.get("properties", []):
            if prop["name"] == "ENVIRONMENT":
                env = dict(v.split("=", 1) for v in prop["value"] if "=" in v)
        found.append((t["name"], t["command"], env))
    return found


def name_of(known, cmd, env):
    """The entry whose command `cmd` runs and whose environment `env` has: the same command, or
    else one whose interpreter was resolved through a shim (then the arguments decide) or a
    script started through its #! line (its interpreter in front)."""
    def shim(command):
        return (len(command) == len(cmd) > 1 and command[1:] == cmd[1:]
                and os.path.basename(command[0]).startswith(os.path.basename(cmd[0])[:6]))
    for same in (lambda command: command == cmd,
                 lambda command: shim(command) or command == cmd[1:]):
        fits = [n for n, command, e in known if same(command)]
        if len(fits) > 1:
            fits = [n for n, command, e in known
                    if same(command) and all(env.get(k) == v for k, v in e.items())] or fits
        if len(fits) == 1:
            return fits[0]
    return " ".join(cmd)[:120]


def parent_of(pid):
    try:
        return int(read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def descendants(pid):
    found, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found


class Watcher(threading.Thread):
    """Polls every POLL_S: a new child of a ctest goes into a group of its own, with whatever it
    forked before it was seen; an entry ends when its process is gone or no longer ctest's.
    Processes forked and ended within one poll before their entry was moved are not counted
    (a few milliseconds of a start). Errors are counted and reported, never the end of it."""

    def __init__(self, top_pid, group, mem_group):
        super().__init__(daemon=True)
        self.top, self.group, self.mem_group = top_pid, group, mem_group
        self.done = threading.Event()
        self.ended = []  # finished entries, named at the end (ctest --show-only is slow)
        self.errors = []
        self.seq = 0

    def finish(self, e):
        g = e["group"]
        stat = dict(line.split() for line in read(f"{g}/cpuacct.stat").splitlines())
        hz = os.sysconf("SC_CLK_TCK")
        left = []
        for p in read(f"{g}/cgroup.procs").split():
            try:
                left.append(f"{p} {read(f'/proc/{p}/cmdline').replace(chr(0), ' ')[:100]}")
            except OSError:
                pass
        self.sample(e)
        e.update(wall_s=round(time.time() - e["start"], 1),
                 cpu_s=round(int(read(f"{g}/cpuacct.usage")) / 1e9, 1),
                 user_s=round(int(stat["user"]) / hz, 1),
                 sys_s=round(int(stat["system"]) / hz, 1), left=left,
                 rss_mib=round(e["rss_peak"] / 2**20))
        self.ended.append(e)
        if not left:
            os.rmdir(g)
            try:
                os.rmdir(e["mem"])
            except OSError:  # a process in it has not been reaped yet: removed with the top
                pass

    @staticmethod
    def sample(e):
        """The entry's resident anonymous memory now, its peak kept."""
        try:
            for line in read(f"{e['mem']}/memory.stat").splitlines():
                if line.startswith("total_rss "):
                    e["rss_peak"] = max(e["rss_peak"], int(line.split()[1]))
                    break
        except OSError:
            pass

    def adopt(self, k, ctest, live):
        self.seq += 1
        g = f"{self.group}/{self.seq}-{k}"  # pids wrap: a sequence number keeps groups apart
        m = f"{self.mem_group}/{self.seq}-{k}"
        os.makedirs(g)
        os.makedirs(m)
        for pid in [k] + descendants(k):
            for group in (g, m):
                try:
                    with open(f"{group}/cgroup.procs", "w") as f:
                        f.write(str(pid))
                except OSError:  # gone already
                    pass
        live[k] = {"start": time.time(), "group": g, "mem": m, "rss_peak": 0, "cmd": None,
                   "build": build_dir_of(ctest), "env": None, "ctest": ctest}

    def run(self):
        live = {}
        while not (self.done.is_set() and not live):
            try:
                for c in ctest_pids(self.top):
                    for k in children(c):
                        if k not in live:
                            self.adopt(k, c, live)
                for k, e in list(live.items()):
                    try:
                        cmd = read(f"/proc/{k}/cmdline").split("\0")[:-1]
                        if cmd and os.path.basename(cmd[0]) != "ctest":  # exec'd
                            e["cmd"] = cmd
                            if e["env"] is None:
                                e["env"] = dict(v.split("=", 1) for v in
                                                read(f"/proc/{k}/environ").split("\0")
                                                if "=" in v)
                    except OSError:
                        pass
                    if parent_of(k) != e["ctest"]:  # gone, or not ctest's any more
                        del live[k]
                        self.finish(e)
                    else:
                        self.sample(e)
            except (OSError, ValueError, KeyError) as err:
                self.errors.append(repr(err))
            time.sleep(POLL_S)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.devnull)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        ap.error("no command: suite-cpu.py -- bash scripts/test.sh")
    for root in (ROOT, MEM_ROOT):
        if not os.access(root, os.W_OK):
            sys.exit(f"suite-cpu.py: {root} is not writable (cgroup v1, root): cannot count")
    if "cpu," in os.path.realpath(ROOT):
        print(f"suite-cpu.py: {ROOT} is mounted with the cpu controller: each entry becomes a "
              "scheduling group of its own, which changes its wall time", file=sys.stderr)
    group = f"{ROOT}/crun-suite-cpu-{os.getpid()}"
    mem_group = f"{MEM_ROOT}/crun-suite-cpu-{os.getpid()}"
    os.makedirs(group)
    os.makedirs(mem_group)
    proc = subprocess.Popen(command)
    # Signals that would stop this script go to the command, which ends as it ends on them.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _: proc.send_signal(s))
    w = Watcher(proc.pid, group, mem_group)
    w.start()
    rc = proc.wait()
    w.done.set()
    w.join(timeout=60)
    known = {}
    rows = []
    for e in list(w.ended):
        if e["build"] not in known:
            known[e["build"]] = entries(e["build"])
        rows.append({"name": name_of(known[e["build"]], e["cmd"] or [], e["env"] or {}),
                     "command": e["cmd"],
                     **{k: e[k] for k in ("wall_s", "cpu_s", "user_s", "sys_s", "rss_mib",
                                          "left")}})
    with open(a.out, "a") as out:
        for r in rows:
            out.write(json.dumps(r) + "\n")
    rows.sort(key=lambda r: -r["cpu_s"])
    total = sum(r["cpu_s"] for r in rows)
    print(f"\n{'entry':45} {'cpu s':>8} {'wall s':>8} {'MiB':>6}")
    for r in rows[:a.top]:
        print(f"{r['name'][:45]:45} {r['cpu_s']:8.1f} {r['wall_s']:8.1f} {r['rss_mib']:6d}")
    print(f"{'all ' + str(len(rows)) + ' entries':45} {total:8.1f} "
          f"{sum(r['wall_s'] for r in rows):8.1f}")
    for r in rows:
        for p in r["left"]:
            print(f"suite-cpu.py: {r['name']} left running: {p}")
    for err in w.errors[:10]:
        print(f"suite-cpu.py: while counting: {err}", file=sys.stderr)
    if w.is_alive():
        print("suite-cpu.py: the counting did not end within 60 s of the command", file=sys.stderr)
    for g in [e["mem"] for e in w.ended] + [group, mem_group]:
        try:
            os.rmdir(g)
        except OSError:
            pass
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main())
