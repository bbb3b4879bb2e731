"""The suite's time budget (tests/budget.txt): every ctest entry has a TIMEOUT of about twice
its measured time (the entry alone on the 2-core machine, nothing beside it), and the TIMEOUTs
together stay within 40 minutes. Each TIMEOUT also leaves room above what the entry took in a
full run of scripts/test.sh, beside the others (ctest sharing the machine's cores and memory
out by each entry's cpu and mem), so that a loaded machine does not end a test that works.
This is a budget, not a timing: it reads the TIMEOUT each entry was given, never how long
anything took here, so it does not depend on the machine's speed. Later work spends from it;
its closing note says how much. Until the suite is within the 40 minutes, the limit is the
ceiling the table's first line sets (`# ceiling: N s`), which comes down towards the target
with every cut; it rises only when a full run measured entries beyond their rows (the commit
names them), never for a new test, which spends from it: the suite cannot grow while it is
cut. Entries labelled quick-only (scripts/test.sh --quick's smoke tests, which the full run
leaves out) need a TIMEOUT but are not counted.

  budget_check.py --ctest CTEST --build-dir DIR --table tests/budget.txt

Fails (exit 1), naming what is wrong, when:
  - an entry ctest knows has no TIMEOUT (it has no row in the table, nor one of its own);
  - the TIMEOUTs add up to more than the ceiling (the largest are named);
  - the ceiling is above the budget while the sum is within it (lower the ceiling);
  - a row's TIMEOUT is not about twice its measured time (1.5x to 2.5x, at least 6 s, and up
    to 12 s for an entry of seconds), or, where 1.25 times what it took beside the others is
    more, not that;
  - a row's TIMEOUT is less than 1.25 times what it took beside the others;
  - a row measured over 60 s does not say why it needs that long."""
import argparse
import json
import math
import subprocess
import sys

import re

BUDGET_S = 40 * 60
LONG_S = 60  # a test measured longer than this says why in its row
FLOOR_S = 6  # the smallest TIMEOUT a row may have: process start-up under a loaded machine
SHORT_CAP_S = 2 * FLOOR_S  # what an entry of seconds may have, whatever twice its time
ROOM = 1.25  # a TIMEOUT's least room above what the entry took beside the others
QUICK_ONLY = "quick-only"


def parse_ceiling(text):
    """The ceiling the table's `# ceiling: N s` line sets; the budget when there is none."""
    m = re.search(r"^# ceiling: (\d+) s", text, re.M)
    return int(m.group(1)) if m else BUDGET_S


def parse_table(text):
    """Rows of the table: {name: (measured, beside, timeout, cpu, mem, locks, labels, why)}.
    Raises ValueError naming the line of a malformed row."""
    rows = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        words = line.split(None, 8)
        if len(words) < 8:
            raise ValueError(f"line {n}: '{line}' has {len(words)} columns, not 8 or 9 "
                             "(name measured beside timeout cpu mem locks labels [why])")
        name, measured, beside, timeout, cpu, mem, locks, labels = words[:8]
        why = words[8].strip() if len(words) == 9 else ""
        try:
            row = (float(measured), float(beside), float(timeout), int(cpu), int(mem))
        except ValueError:
            raise ValueError(f"line {n}: '{line}': measured, beside and timeout are seconds, "
                             "cpu (percent of a core) and mem (MiB) whole numbers") from None
        if row[3] < 1 or row[4] < 0:
            raise ValueError(f"line {n}: '{line}': cpu is at least 1 (percent of a core), "
                             "mem at least 0 (MiB)")
        if name in rows:
            raise ValueError(f"line {n}: '{name}' has a row already")
        rows[name] = (*row, locks, labels, why)
    return rows


def row_problems(rows):
    """What is wrong with the rows themselves, one message each."""
    out = []
    for name, (measured, beside, timeout, _, _, _, _, why) in rows.items():
        low = max(FLOOR_S, 1.5 * measured)
        # Where the room above beside needs more than 2.5x, exactly that: what the machine's
        # load costs the budget shows in the sum.
        high = max(SHORT_CAP_S, 2.5 * measured, math.ceil(ROOM * beside))
        if not low <= timeout <= high:
            out.append(f"{name}: TIMEOUT {timeout:g} s is not about twice its measured "
                       f"{measured:g} s (from {low:g} to {high:g} s)")
        if timeout < ROOM * beside:
            out.append(f"{name}: TIMEOUT {timeout:g} s leaves too little room above the "
                       f"{beside:g} s it took beside the others (at least {ROOM:g}x: "
                       f"{ROOM * beside:g} s); give it more of the machine (cpu), or less work")
        if measured > LONG_S and not why:
            out.append(f"{name}: measured {measured:g} s, over {LONG_S} s, without saying why")
    return out


def budget_problems(entries, ceiling_s=BUDGET_S):
    """`entries`: {name: (TIMEOUT or None, labels)}. The entries without a TIMEOUT, and the sum
    (quick-only entries left out) over the ceiling with the largest named. Returns (problems,
    the sum)."""
    out = [f"{name}: no TIMEOUT (give it a row in tests/budget.txt)"
           for name, (t, _) in sorted(entries.items()) if t is None]
    counted = {n: t for n, (t, labels) in entries.items() if t and QUICK_ONLY not in labels}
    total = sum(counted.values())
    if total > ceiling_s:
        largest = sorted(((t, n) for n, t in counted.items()), reverse=True)[:5]
        out.append(f"the TIMEOUTs add up to {total:.0f} s, over the limit of {ceiling_s} s "
                   f"({ceiling_s / 60:.0f} min); the largest: " +
                   ", ".join(f"{n} {t:g} s" for t, n in largest))
    elif ceiling_s > BUDGET_S and total <= BUDGET_S:
        out.append(f"the TIMEOUTs add up to {total:.0f} s, within the budget of {BUDGET_S} s: "
                   f"take the ceiling of {ceiling_s} s out of tests/budget.txt")
    return out, total


def ctest_timeouts(ctest, build_dir):
    """{entry: (its TIMEOUT property or None, its labels)}, as ctest itself lists them."""
    listing = subprocess.run([ctest, "--test-dir", build_dir, "--show-only=json-v1"],
                             capture_output=True, text=True, timeout=120, check=True)
    out = {}
    for test in json.loads(listing.stdout)["tests"]:
        props = {p["name"]: p["value"] for p in test.get("properties", [])}
        timeout = float(props["TIMEOUT"]) if "TIMEOUT" in props else None
        out[test["name"]] = (timeout, props.get("LABELS", []))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ctest", required=True)
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--table", required=True)
    a = ap.parse_args()
    with open(a.table) as f:
        text = f.read()
    rows, ceiling = parse_table(text), parse_ceiling(text)
    problems = row_problems(rows)
    entries = ctest_timeouts(a.ctest, a.build_dir)
    more, total = budget_problems(entries, ceiling)
    problems += more
    print(f"{len(entries)} ctest entries; their TIMEOUTs add up to {total:.0f} s: "
          f"{100 * total / BUDGET_S:.0f} % of the budget of {BUDGET_S} s, under a ceiling of "
          f"{ceiling} s")
    for p in problems:
        print("budget: " + p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
