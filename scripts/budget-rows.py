#!/usr/bin/env python3
"""Rewrites tests/budget.txt's figures from runs of the suite that scripts/suite-cpu.py
counted: what each entry took alone, what it used, and what it took beside the others.

  python3 scripts/budget-rows.py --alone A.jsonl[,A2.jsonl] [--beside B.jsonl[,B2.jsonl]]

  --alone    runs of `CRUN_TEST_JOBS=1 scripts/test.sh` (each entry alone on the machine),
             oldest first: an entry's figures are those of the last run that has it (a run of
             the entries a change touched follows the full one). measured is its wall time,
             cpu its CPU-seconds over that time (percent of a core, up to the next 10), mem
             the most resident memory it held (MiB, up to the next 64)
  --beside   full runs of scripts/test.sh (ctest's resources shared): beside is the largest
             wall time; without any, beside is measured
Each row's TIMEOUT becomes max(10 s, twice measured, 1.25 times beside), the least that
tests/budget_check.py accepts. The names, locks, labels and reasons stay as they are; an
entry without a figure keeps its row and is named. Prints the TIMEOUTs' sum against the
budget."""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import budget_check  # noqa: E402  (the rules the rows must keep)

ROOT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def load(paths):
    """[{entry: record}] a run each."""
    runs = []
    for path in filter(None, (paths or "").split(",")):
        with open(path) as f:
            runs.append({r["name"]: r for r in map(json.loads, filter(str.strip, f))})
    return runs


def up(value, step):
    return max(step, int(math.ceil(value / step)) * step)


def figures(name, alone, beside):
    """(measured, beside, cpu, mem) of `name`, or None where no alone run has it."""
    mine = [run[name] for run in alone if name in run]
    if not mine:
        return None
    last = mine[-1]
    measured = max(1, math.ceil(last["wall_s"]))
    cpu = up(100 * last["cpu_s"] / max(last["wall_s"], 0.1), 10)
    mem = up(last.get("rss_mib", 0), 64)
    took = [run[name]["wall_s"] for run in beside if name in run]
    return measured, max(1, math.ceil(max(took))) if took else measured, cpu, mem


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--alone", required=True)
    ap.add_argument("--beside", default="")
    ap.add_argument("--table", default=os.path.join(ROOT, "tests", "budget.txt"))
    a = ap.parse_args()
    alone, beside = load(a.alone), load(a.beside)
    out, total, missing = [], 0, []
    with open(a.table) as f:
        lines = f.read().split("\n")
    for line in lines:
        if not line.strip() or line.startswith("#"):
            out.append(line)
            continue
        w = line.split(None, 8)
        name, locks, labels = w[0], w[6], w[7]
        why = w[8].strip() if len(w) == 9 else ""
        got = figures(name, alone, beside)
        if got is None:
            missing.append(name)
            out.append(line)
            timeout = float(w[3])
        else:
            measured, took, cpu, mem = got
            timeout = max(budget_check.FLOOR_S, 2 * measured, math.ceil(budget_check.ROOM * took))
            head = (f"{name:40} {measured:6d} {took:6d} {timeout:6d} {cpu:4d} {mem:5d}  "
                    f"{locks:9} {labels}")
            out.append(f"{head:88} {why}".rstrip() if why else head.rstrip())
        if budget_check.QUICK_ONLY not in labels:
            total += timeout
    with open(a.table, "w") as f:
        f.write("\n".join(out))
    print(f"TIMEOUTs: {total:.0f} s, {100 * total / budget_check.BUDGET_S:.0f} % of the budget")
    for name in missing:
        print(f"budget-rows.py: no figure for {name}: its row is as it was", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
