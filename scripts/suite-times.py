#!/usr/bin/env python3
"""Where the suite's time goes, from one full run's ctest output (what scripts/test.sh prints,
or build/Testing/Temporary/LastTest.log's summary lines):

  python3 scripts/suite-times.py CTEST_OUTPUT [--top 20] [--doc docs/reliability.md]

Prints the slowest entries and the total by area (unit, integration, matrix, soak, frameworks,
Slurm, etcd, Kubernetes, faults, benchmarks' smoke runs, fuzz replays, checks); with --doc, the
table replaces the one between the suite-times markers of that file. Each entry's seconds are
ctest's own, as it ran beside the others (ctest -j), so they add up to more than the run."""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "pylib"))
from bench_support import write_section  # noqa: E402

LINE = re.compile(r"^\s*\d+/(\d+) Test +#\d+: (\S+(?: \S+)*?) \.+\**\s*(Passed|Failed|Not Run|Skipped|"
                  r"\*\*\*Failed|\*\*\*Skipped|\*\*\*Timeout|Timeout)?.*?([\d.]+) sec")

# (area, does the entry's name belong to it): the first that matches.
AREAS = [
    ("unit", lambda n: n.split(":")[0].endswith("_tests")),
    ("Kubernetes", lambda n: "kubernetes" in n),
    ("Slurm", lambda n: "slurm" in n),
    ("etcd", lambda n: n.startswith("integration_etcd")),
    ("matrix", lambda n: "matrix" in n),
    ("soak", lambda n: "soak" in n),
    ("frameworks", lambda n: n.startswith("compat_") or "contract" in n),
    ("faults", lambda n: n == "faults"),
    ("benchmarks' smoke runs", lambda n: n.startswith("bench_")),
    ("fuzz replays", lambda n: n.startswith("fuzz_")),
    ("checks", lambda n: n in ("style", "layers") or n.startswith("suite_")),
    ("integration", lambda n: True),
]


def parse(text):
    """[(entry, seconds, status)] of each finished test in ctest's output: the lines of the run
    with the most entries (a suite's output may hold a ctest run of its own)."""
    found = []
    for line in text.splitlines():
        m = LINE.search(line)
        if m:
            status = (m.group(3) or "Passed").strip("*")
            found.append((int(m.group(1)), m.group(2), float(m.group(4)), status))
    total = max((t for t, *_ in found), default=0)
    return [(name, secs, status) for t, name, secs, status in found if t == total]


def area_of(name):
    return next(a for a, match in AREAS if match(name))


def tables(rows, top):
    lines = [f"| the {top} slowest entries | area | seconds |", "|---|---|---|"]
    for name, secs, status in sorted(rows, key=lambda r: -r[1])[:top]:
        lines.append(f"| {name}{'' if status == 'Passed' else f' ({status})'} | "
                     f"{area_of(name)} | {secs:.0f} |")
    by_area = {}
    for name, secs, _ in rows:
        n, s = by_area.get(area_of(name), (0, 0.0))
        by_area[area_of(name)] = (n + 1, s + secs)
    total = sum(s for _, s, _ in rows)
    lines += ["", "| area | entries | seconds | share |", "|---|---|---|---|"]
    for area, (n, secs) in sorted(by_area.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| {area} | {n} | {secs:.0f} | {100 * secs / total:.0f} % |")
    lines.append(f"| all | {len(rows)} | {total:.0f} | 100 % |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("output")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--doc")
    ap.add_argument("--heading", default="")
    a = ap.parse_args()
    with open(a.output, errors="replace") as f:
        rows = parse(f.read())
    if not rows:
        print(f"suite-times.py: no ctest result lines in {a.output}", file=sys.stderr)
        return 1
    text = tables(rows, a.top)
    print(text)
    if a.doc:
        lines = ([a.heading, ""] if a.heading else []) + text.split("\n")
        write_section(a.doc, "suite-times", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
