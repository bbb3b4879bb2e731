"""--hang-after-steps (docs/hangs.md, "Told from the steps"): its false alarms on a noisy job,
and how soon it tells a real hang, against --hang-timeout alone in the same run. Writes its
section of docs/benchmarks.md (between the hang-pace markers).

  * False alarms: the straggler work's noisy job (tests/workers/straggler_worker.py: 4 ranks,
    --steps steps of 20 ms, each +-30 %, one in a hundred 5 times as long), one crun for each K
    and one with --hang-timeout alone, all at once (they load the machine as a suite does),
    --hang-timeout 60 and restarts to spare: the job has no hang, so every hang declared is a
    false alarm; a job that restarts counts it and goes on.
  * A real hang: 2 ranks stepping every 0.25 s (+-30 %), rank 1 parked in a sleep after 40
    steps, rank 0 stepping on; the silence at which crun declared rank 1 hung, with
    --hang-timeout 10 alone and with each K, alternating, --rounds times.

Usage: hang_pace_bench.py --crun BIN [--steps 9000] [--ks 2,3,5] [--rounds 3] [--out FILE]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from bench_support import measured_at, write_section  # noqa: E402

NOISY = os.path.join(HERE, "..", "workers", "straggler_worker.py")
HUNG = re.compile(r"rank (\d+) \(local rank \d+, pid \d+\) on \S+ is hung: no progress for "
                  r"([\d.]+) s")
PARKED = """
import os, random, time
import crun_worker
rank = int(os.environ["RANK"])
rng = random.Random(rank)
for step in range(1000):
    if rank == 1 and step == 40:
        time.sleep(3600)  # the hang
    time.sleep(0.25 * rng.uniform(0.7, 1.3))
    crun_worker.step(step)
"""


def noisy_jobs(crun, steps, ks, d):
    """Every variant's noisy job at once: {label: hangs declared}."""
    env = dict(os.environ, STRAGGLER_JITTER="0.3", STRAGGLER_SPIKES="0.01",
               STRAGGLER_STEPS=str(steps), STRAGGLER_MS="20", PYTHON_EXEC=sys.executable)
    variants = {"--hang-timeout 60": []}
    for k in ks:
        variants[f"--hang-timeout 60 --hang-after-steps {k}"] = ["--hang-after-steps", str(k)]
    procs = {}
    for label, extra in variants.items():
        err = open(os.path.join(d, f"noisy-{len(procs)}.err"), "w+")
        procs[label] = (subprocess.Popen(
            [crun, "--standalone", "--nproc-per-node", "4", "--hang-timeout", "60",
             "--max-restarts", "100", "--max-restarts-without-progress", "0", *extra, NOISY],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err), err)
    out = {}
    for label, (p, err) in procs.items():
        p.wait(timeout=steps * 0.2 + 300)
        err.seek(0)
        text = err.read()
        err.close()
        if p.returncode != 0:
            sys.exit(f"{label}: crun exited {p.returncode}:\n{text[-3000:]}")
        out[label] = len(HUNG.findall(text))
    return out


def declared_after(crun, script, extra, d):
    """The silence (s) at which rank 1 was declared hung."""
    p = subprocess.run([crun, "--standalone", "--nproc-per-node", "2", "--hang-timeout", "10",
                        "--max-restarts", "0", *extra, script],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True, timeout=120, env=dict(os.environ, PYTHON_EXEC=sys.executable))
    hung = [(int(r), float(s)) for r, s in HUNG.findall(p.stderr)]
    if [r for r, _ in hung] != [1]:
        sys.exit(f"{extra}: expected rank 1 alone declared hung:\n{p.stderr[-3000:]}")
    return hung[0][1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--crun", required=True)
    ap.add_argument("--steps", type=int, default=9000)
    ap.add_argument("--ks", default="2,3,5")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "..", "..", "docs", "benchmarks.md"))
    a = ap.parse_args()
    ks = [int(k) for k in a.ks.split(",")]
    with tempfile.TemporaryDirectory(prefix="crun-hang-pace-") as d:
        script = os.path.join(d, "parked.py")
        with open(script, "w") as f:
            f.write(PARKED)
        variants = {"--hang-timeout 10": []}
        for k in ks:
            variants[f"--hang-timeout 10 --hang-after-steps {k}"] = ["--hang-after-steps", str(k)]
        seen = {label: [] for label in variants}
        for r in range(a.rounds):
            for label, extra in variants.items():
                seen[label].append(declared_after(a.crun, script, extra, d))
                print(f"round {r}: {label}: declared after {seen[label][-1]:.1f} s",
                      file=sys.stderr)
        alarms = noisy_jobs(a.crun, a.steps, ks, d)
    rows = [f"`python3 tests/bench/hang_pace_bench.py --crun build/launcher/crun --steps "
            f"{a.steps} --ks {a.ks} --rounds {a.rounds}`. {measured_at()}", "",
            "| watch | a real hang declared after (median of "
            f"{a.rounds}) | false alarms on the noisy job ({a.steps} steps x 4 ranks) |",
            "|---|---|---|"]
    for (label, times), (_, n) in zip(seen.items(), alarms.items()):
        rows.append(f"| {label.replace('--hang-timeout 10', '--hang-timeout')} | "
                    f"{statistics.median(times):.1f} s | {n} |")
    write_section(a.out, "hang-pace", rows)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
