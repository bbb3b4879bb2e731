"""--hang-after-steps (docs/hangs.md, "Told from the steps"): its false alarms on a noisy job,
and how soon it tells a real hang, against --hang-timeout alone in the same run. Writes its
section of docs/benchmarks.md (between the hang-pace markers).

  * False alarms: the straggler work's noisy job (tests/workers/straggler_worker.py: 4 ranks,
    steps of 20 ms, each +-30 %, one in a hundred 5 times as long; --seconds long), and the same
    with the campaign's 250 ms steps, one crun for each K and one with --hang-timeout alone,
    all at once (they load the machine as a suite does), --hang-timeout 60 and restarts to
    spare: the jobs have no hang, so every hang declared is a false alarm; a job that restarts
    counts it and goes on.
  * A real hang: 2 ranks stepping every 0.25 s (+-30 %), rank 1 parked in a sleep after 40
    steps, rank 0 stepping on; the silence at which crun declared rank 1 hung, with
    --hang-timeout 10 alone and with each K, alternating, --rounds times.

Usage: hang_pace_bench.py --crun BIN [--seconds 180] [--ks 2,3,5] [--rounds 3] [--out FILE]
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


STEP_MS = (20, 250)


def noisy_jobs(crun, seconds, ks, d):
    """Every variant's noisy jobs at once: {(label, step ms): hangs declared}."""
    variants = {"--hang-timeout 60": []}
    for k in ks:
        variants[f"--hang-timeout 60 --hang-after-steps {k}"] = ["--hang-after-steps", str(k)]
    procs = {}
    for ms in STEP_MS:
        env = dict(os.environ, STRAGGLER_JITTER="0.3", STRAGGLER_SPIKES="0.01",
                   STRAGGLER_STEPS=str(seconds * 1000 // ms), STRAGGLER_MS=str(ms),
                   PYTHON_EXEC=sys.executable)
        for label, extra in variants.items():
            err = open(os.path.join(d, f"noisy-{len(procs)}.err"), "w+")
            procs[(label, ms)] = (subprocess.Popen(
                [crun, "--standalone", "--nproc-per-node", "4", "--hang-timeout", "60",
                 "--max-restarts", "100", "--max-restarts-without-progress", "0", *extra,
                 NOISY], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=err), err)
    out = {}
    for label, (p, err) in procs.items():
        p.wait(timeout=seconds * 3 + 300)
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
    ap.add_argument("--seconds", type=int, default=180, help="each noisy job's steps, in time")
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
        alarms = noisy_jobs(a.crun, a.seconds, ks, d)
    rows = [f"`python3 tests/bench/hang_pace_bench.py --crun build/launcher/crun --seconds "
            f"{a.seconds} --ks {a.ks} --rounds {a.rounds}`. {measured_at()}", "",
            f"| watch | a real hang declared after (median of {a.rounds}) | " +
            " | ".join(f"false alarms, {a.seconds} s of {ms} ms steps x 4 ranks"
                       for ms in STEP_MS) + " |",
            "|---|---|" + "---|" * len(STEP_MS)]
    for label, times in seen.items():
        noisy = label.replace("--hang-timeout 10", "--hang-timeout 60")
        rows.append(f"| {label.replace('--hang-timeout 10', '--hang-timeout')} | "
                    f"{statistics.median(times):.1f} s | " +
                    " | ".join(str(alarms[(noisy, ms)]) for ms in STEP_MS) + " |")
    write_section(a.out, "hang-pace", rows)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
