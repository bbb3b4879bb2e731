#!/usr/bin/env python3
"""The performance regression guard: short versions of the launch, store and rendezvous
benchmarks, each crun figure beside its anchor in the same run, compared with the ratio that
docs/benchmarks.md records (and the commit it names).

A ratio is "how many times better than the anchor" (anchor time / crun time, crun's
throughput / the anchor's): it is what the tables promise, and a slower or faster machine
moves both sides of it. Every check runs in rounds that measure crun and its anchor in turns,
one pair ratio a round; its figure is the pairs' median and its noise band the ± of a 90 %
confidence interval of that median (the sign-test interval: see "the noise band" below), at
least 10 % and at least how far the ratio moved between whole runs (BAND_FLOORS). A check
whose band is wider than ±20 %, or that has too few pairs for the interval, is reported and
not judged; a check that can be judged gets more rounds while its band is wider, up to a cap
and within the run's time budget (--budget-s, 300 s). A judged ratio that fell below the
recorded one by more than its band is reported as a regression and makes the exit status 1;
one that rose is reported too (the tables are then out of date in crun's favour). Not part of
ctest: timing is not a test. Its smoke test (tests/bench/CMakeLists.txt) checks that it runs
and parses the tables; its unit test (check_test.py) the band, the verdicts and the rounds.
--smoke judges nothing, so its groups run in two lanes at once (SMOKE_LANES).

Runs in a private network namespace (needs root), as store_bench.py and rdzv_bench.py do:
PyTorch's stores stall where reverse DNS does not answer.

Usage: check.py --crun BIN --store-loadgen BIN --probe BIN --limit BIN --rdzv-loadgen BIN
                --torch2-python PY
                [--docs docs/benchmarks.md] [--smoke] [--budget-s 300]
"""
import argparse
import collections
import contextlib
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from bench_support import in_private_netns  # noqa: E402
import launch_bench  # noqa: E402
import node_lost_bench  # noqa: E402
import rdzv_bench  # noqa: E402
import recovery_bench  # noqa: E402
import snapshot_bench  # noqa: E402
import store_bench  # noqa: E402

# The narrowest band: the recorded ratio is itself one run's median.
MIN_BAND = 0.10
LAUNCH_TORCH = "launch, 2 workers: torchrun 2.x / crun"
LAUNCH_LIMIT = "launch, 2 workers: limit / crun"
RESTART_TORCH = "restart, 2 workers: torchrun 2.x / crun"
RESTART_LIMIT = "restart, 2 workers: limit / crun"
# The health gate's cost on the restart path (docs/health.md): crun's plain restart against its
# gated one, both crun's: the ratio falls as the gate's share grows.
RESTART_GATED = "restart, 2 workers: crun / crun with a health gate"
STORE_SET = "store set, 64 clients: crun / libuv"
STORM = "storm, 20,000 connections: libuv / crun"
RDZV = "rendezvous, 2 agents: torchrun c10d / crun"
# How the service's times grow with its agents (rdzv_bench's simulated table): 1.0 is linear
# (ten times the agents in ten times the time), less grows faster. crun against crun.
SCALE = (1000, 10000, 30000)
FORM_10K = "rendezvous form, 1,000 → 10,000 agents: linear / crun"
FORM_30K = "rendezvous form, 10,000 → 30,000 agents: linear / crun"
TOLD_30K = "failure → every agent told, 10,000 → 30,000 agents: linear / crun"
# A heartbeat's cost at 10,000 agents beating each second: what a bare gRPC server pays for one
# stream message (any heartbeat on a stream) against the daemon's per datagram.
BEATS_10K = "heartbeat, 10,000 agents: bare gRPC message / crun datagram"
# How forming through etcd grows (rdzv_bench's etcd table): each agent reading its own ranks/
# key keeps a round O(agents); a/job listing every member again would fall well below 1.0.
ETCD_SCALE = rdzv_bench.ETCD_SIMULATED[:2]  # 100 and 1,000: the table's first two columns
ETCD_FORM = "etcd form, 100 → 1,000 agents: linear / crun"
RECOVERY = "recovery, crash → imported, 1 node: torchrun 2.x / crun --warm"
SNAPSHOT = "save 200 MiB a rank, 2 workers: torch.save /dev/shm / crun_worker.save"
# torchrun's spare did not take over in any run (docs/benchmarks.md, "Node lost"): the node-lost
# ratio is against crun's own disk path, which a job without copies to peers takes.
NODE_LOST = "node lost, 200 MiB a rank, loss → first step: crun disk / crun peer copy"
# Floors of a check's band: how far its ratio moved between whole runs of this script on one
# machine and one build, which the spread of one run's rounds does not show. Runs at a79fa0d,
# ff8881d and 7b73122 (2026-11-26; the last two build the same crun):
#   torchrun 2.x / crun, launch   417-557        rendezvous, torchrun c10d / crun  231-360
#   torchrun 2.x / crun, restart   58-204        recovery, torchrun 2.x / --warm 16.5-26.2
#   store set, crun / libuv      0.96-1.44       storm, libuv / crun              4.5-16.0
# Python's and PyTorch's side (importing torch, libuv's SYN retries: 1, 2 then 4 s apart) is
# what moves. The limit's ratios held within 0.22-0.28, so crun's own launch and restart are
# judged against the limit, measured in the same rounds (the limit is spawn_limit starting
# the same 2 workers: the floor of a restart's start of new workers too); the anchors' ratios
# catch only a large regression. The torchrun restart ratio moves too far to judge at all.
# The save's anchor, torch.save to /dev/shm, took 151-228 ms in whole runs of
# snapshot_bench.py at 75394e5-1af4586 against crun's 27-38 ms: its ratio moved 4.1-6.1.
# The scale ratios: the load generator shares the two cores with the daemon; 30,000 agents
# formed in 1.37-1.67 s and were told in 0.75-0.99 s across runs of one build at ea4b53c.
# The etcd form's linearity read 1.42, 1.39 and 1.19 in three runs of one build at 08fc9ff
# (etcd's fsync and the loader share the two cores).
# A floor above TARGET_BAND leaves its check reported and not judged: no number of rounds in
# one run narrows what moves between runs.
BAND_FLOORS = {LAUNCH_TORCH: 0.30, RDZV: 0.45, RECOVERY: 0.45, STORE_SET: 0.45, STORM: 0.65,
               SNAPSHOT: 0.45, NODE_LOST: 0.30, FORM_10K: 0.30, FORM_30K: 0.30, TOLD_30K: 0.30,
               BEATS_10K: 0.30, ETCD_FORM: 0.30}
NOT_JUDGED = {RESTART_TORCH}


# ---- what docs/benchmarks.md records --------------------------------------------------------

def section(text, begin, end):
    """The text between two markers (or headings) of the file."""
    a = text.index(begin)
    b = text.index(end, a)
    return text[a:b]


def row(text, label):
    """The cells of the table row whose first cell is `label`."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == label:
            return cells
    raise ValueError(f"no table row '{label}'")


def number(cell):
    """12.3 from "12.3 ms", "1,652.1 ms", "382×", "1.07×", "0.45 s"."""
    m = re.search(r"[-\d,.]+", cell)
    if not m:
        raise ValueError(f"no number in '{cell}'")
    return float(m.group(0).replace(",", ""))


def commit_of(text):
    m = re.search(r"Measured at commit (\w+)", text)
    return m.group(1) if m else "?"


def recorded(docs):
    """{check: (ratio, commit)} from the tables."""
    with open(docs) as f:
        text = f.read()
    store = text[:text.index("<!-- Analysis:")]
    launch = section(text, "<!-- launch-bench:begin -->", "<!-- launch-bench:end -->")
    rdzv = section(text, "<!-- rdzv-bench:begin -->", "<!-- rdzv-bench:end -->")
    recovery = section(text, "<!-- recovery-bench:begin -->", "<!-- recovery-bench:end -->")
    crash = row_with(recovery, [f"{recovery_bench.ONE_NODE}, crash", "2.x",
                                recovery_bench.IMPORTED])
    two = row(launch, "launch → exit, 2 workers")
    storm = section(store, "## Connection storm", "## How to reproduce")
    wire = section(store, "### 2.x wire dialect", "### 1.13 wire dialect")
    restart = row(launch, "restart, 2 workers")
    snapshots = section(text, "<!-- snapshot-bench:begin -->", "<!-- snapshot-bench:end -->")
    lost = section(text, "<!-- node-lost-bench:begin -->", "<!-- node-lost-bench:end -->")
    # Cells: figure, then the ways in node_lost_bench.WAYS' order.
    first = row(lost, node_lost_bench.FIRST_STEP)
    ways = [w for _, w in node_lost_bench.WAYS]
    # The row of PyTorch 2.x (its version is the first cell).
    snap = next([c.strip() for c in line.strip().strip("|").split("|")]
                for line in snapshots.splitlines() if line.startswith("| 2."))
    # Cells: figure, then one a simulated agent count (rdzv_bench.SIMULATED's order).
    form = scale_cells(row(rdzv, "form a round"))
    told = scale_cells(row(rdzv, "failure → every agent told"))
    ten_k = 1 + rdzv_bench.SIMULATED.index(SCALE[1])  # the heartbeat rows' cell at 10,000
    etcd_cells = row(rdzv, rdzv_bench.ETCD_FORM_ROW)
    etcd_form = {n: number(etcd_cells[1 + i]) for i, n in enumerate(ETCD_SCALE)}
    # Cells: case, crun, limit, crun / limit, torchrun 2.x, torchrun 1.13, torchrun / crun.
    return {
        LAUNCH_TORCH: (number(two[-1]), commit_of(launch)),
        LAUNCH_LIMIT: (1 / number(two[3]), commit_of(launch)),
        RESTART_TORCH: (number(restart[-1]), commit_of(launch)),
        RESTART_LIMIT: (number(two[2]) / number(restart[1]), commit_of(launch)),
        RESTART_GATED: (number(restart[1]) / number(row(launch, launch_bench.GATED_ROW)[1]),
                        commit_of(launch)),
        STORE_SET: (number(row_with(wire, ["set", "64"])[-1]), commit_of(store)),
        STORM:
            (number(row(storm, "PyTorch 2.x libuv")[4]) /
             number(row(storm, "crun (2.x dialect)")[4]), commit_of(store)),
        RDZV: (number(row(rdzv, "2 agents × 1 worker")[-1]), commit_of(rdzv)),
        FORM_10K: (linearity(form, SCALE[0], SCALE[1]), commit_of(rdzv)),
        FORM_30K: (linearity(form, SCALE[1], SCALE[2]), commit_of(rdzv)),
        TOLD_30K: (linearity(told, SCALE[1], SCALE[2]), commit_of(rdzv)),
        ETCD_FORM: (linearity(etcd_form, *ETCD_SCALE), commit_of(rdzv)),
        BEATS_10K: (number(row(rdzv, rdzv_bench.BARE_BEAT_ROW)[ten_k]) /
                    number(row(rdzv, rdzv_bench.BEAT_ROW)[ten_k]), commit_of(rdzv)),
        # Cells: case, torch, figure, crun cold, crun --warm, torchrun 2.x.
        RECOVERY: (number(crash[5]) / number(crash[4]), commit_of(recovery)),
        # Cells: PyTorch, crun_worker.save, torch.save /dev/shm, torch.save disk, load, goal.
        SNAPSHOT: (number(snap[2]) / number(snap[1]), commit_of(snapshots)),
        NODE_LOST: (number(first[1 + ways.index("disk")]) / number(first[1 + ways.index("peer")]),
                    commit_of(lost)),
    }


def scale_cells(cells):
    """{agents: ms} from a row of the simulated table."""
    return {n: number(cells[1 + i]) for i, n in enumerate(rdzv_bench.SIMULATED)}


def linearity(ms, small, large):
    """1.0 when `large` agents took large/small times as long as `small` did; less is worse."""
    return large / small * ms[small] / ms[large]


def row_with(text, first_cells):
    """The cells of the row whose first cells are `first_cells`."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[:len(first_cells)] == first_cells:
            return cells
    raise ValueError(f"no table row {first_cells}")


# ---- the noise band and the rounds: decided here, without timing anything -----------------------
#
# The figure and its band. Each round of a check measures crun and its anchor in turns, so a
# round gives one pair ratio, and the machine's drift over the run moves both sides of a pair
# alike. The figure is the median of the pair ratios; the band is how closely this run pins
# that median down: a distribution-free confidence interval of the median (the sign-test
# interval: the order statistics [x(k), x(n+1-k)] of the n sorted ratios, k the largest for
# which it holds the true median with probability CONFIDENCE or more, the count of ratios below
# that median being binomial(n, 1/2)), written as ± its wider side about the median. Why this
# one:
#   * it assumes nothing about how the ratios are distributed. They are skewed and have
#     outliers (an anchor's start tried again, libuv's clients stepping by SYN retries): one
#     outlier pulls a mean ± t·s and its band, while it moves an order statistic by one place;
#   * it bounds the figure that is judged (the median), where the spread of single pairs (their
#     range, or their interquartile range) describes one pair's noise: that does not shrink as
#     rounds are added, so no number of rounds could bring a noisy check within the target.
#     This interval narrows as rounds are added, in steps (k grows with n: [x(1), x(5)] of 5,
#     [x(2), x(7)] of 8, [x(3), x(10)] of 12), which is what makes adding rounds worth it;
#   * below MIN_PAIRS pairs (5 at 90 %) no interval reaches the confidence ([min, max] of 4
#     covers 87.5 %): such a check is reported and not judged, whatever its spread.
# The band is at least MIN_BAND (the recorded ratio is itself one run's median) and at least
# the check's floor in BAND_FLOORS (how far its ratio moved between whole runs, which one
# run's pairs cannot show).
TARGET_BAND = 0.20  # judged only within ±20 %: a wider band passes a regression as large
CONFIDENCE = 0.90
# Rounds: every check gets START_ROUNDS (the storm 2: its rounds are long; one with --smoke);
# a check that can be judged (no floor above the target, not in NOT_JUDGED) gets more while its
# band is wider than the target or it has fewer than MIN_PAIRS, up to ROUNDS_CAP. No round
# starts past the run's budget (--budget-s) unless it is a group's first; the rounds beyond
# START_ROUNDS share EXTRA_SHARE of the budget, spent in the order the groups run.
START_ROUNDS = 3
ROUNDS_CAP = 12
BUDGET_S = 300.0
EXTRA_SHARE = 0.2

Rounds = collections.namedtuple("Rounds", "first cap")
Row = collections.namedtuple("Row", "check recorded commit now band pairs verdict judged")


def median_rank(n, confidence=CONFIDENCE):
    """The largest k for which [x(k), x(n+1-k)] of n sorted values covers their population
    median with at least `confidence`, or None when not even [min, max] does. The count B of
    values below the median is binomial(n, 1/2); the interval misses the median when fewer
    than k fall on one side of it: coverage = 1 - 2 P(B <= k-1)."""
    best = None
    for k in range(1, n // 2 + 1):
        below = sum(math.comb(n, i) for i in range(k)) / 2 ** n
        if 1 - 2 * below < confidence:
            break
        best = k
    return best


MIN_PAIRS = next(n for n in range(1, 64) if median_rank(n))


def noise_band(ratios, floor=0.0):
    """(figure, band, whether the floor set the band) of one check's pair ratios: their median,
    and the ± (the wider side) of its confidence interval, at least MIN_BAND and `floor`. With
    fewer than MIN_PAIRS pairs the interval is [min, max], below the confidence."""
    xs = sorted(ratios)
    now = statistics.median(xs)
    k = median_rank(len(xs)) or 1
    lo, hi = xs[k - 1], xs[len(xs) - k]
    spread = max(hi / now - 1, 1 - lo / now) if now > 0 else math.inf
    return now, max(MIN_BAND, floor, spread), floor > max(MIN_BAND, spread)


def pct(band):
    return f"±{band * 100:.0f} %"


def judge(measured, recorded_ratios, floors=None, target=TARGET_BAND):
    """Rows (Row), one a check, and whether a judged ratio fell beyond its band. A check is
    judged only with a band of at most `target` over MIN_PAIRS pairs or more; every other is
    reported with why it is not judged (a band too wide first: more pairs cannot narrow a
    floor)."""
    floors = BAND_FLOORS if floors is None else floors
    rows, regressed = [], False
    for name, ratios in measured.items():
        now, band, floored = noise_band(ratios, floors.get(name, 0.0))
        was, commit = recorded_ratios[name]
        judged = False
        if name in NOT_JUDGED:
            verdict = "reported, never judged: its ratio moves too far between runs"
        elif band > target:
            verdict = (f"band {pct(band)}{' (its between-run floor)' if floored else ''}: "
                       f"reported, not judged")
        elif len(ratios) < MIN_PAIRS:
            verdict = (f"{len(ratios)} pair{'' if len(ratios) == 1 else 's'}, fewer than the "
                       f"{MIN_PAIRS} a {CONFIDENCE * 100:.0f} % interval needs: reported, "
                       f"not judged")
        else:
            judged = True
            if now < was * (1 - band):
                verdict = "REGRESSION"
                regressed = True
            elif now > was * (1 + band):
                verdict = "better than recorded"
            else:
                verdict = "ok"
        rows.append(Row(name, was, commit, now, band, len(ratios), verdict, judged))
    return rows, regressed


def wants_a_round(name, ratios, rounds, floors=None, target=TARGET_BAND):
    """Whether another round is worth `name`'s while: it has fewer than its first rounds, or it
    can be judged at all (not in NOT_JUDGED, no floor above `target`: more rounds cannot lower
    a floor) and is not yet (too few pairs, or a band wider than `target`), below the cap."""
    floors = BAND_FLOORS if floors is None else floors
    n, floor = len(ratios), floors.get(name, 0.0)
    if n < rounds.first:
        return True
    if n >= rounds.cap or name in NOT_JUDGED or floor > target:
        return False
    return n < MIN_PAIRS or noise_band(ratios, floor)[1] > target


def plan_round(pairs, rounds, last_round_s, time_left_s, extra_left_s, floors=None,
               target=TARGET_BAND):
    """The checks a group's next round measures (empty: the group is done), from the pairs it
    has ({check: [ratio]}). Its first round always runs: every check reports a figure. A later
    one runs only if a round as long as the last (rounds only get cheaper: checks drop out)
    fits in the time left; one that only adds to checks past their first rounds must also fit
    in what the extra rounds have left."""
    want = frozenset(c for c, r in pairs.items() if wants_a_round(c, r, rounds, floors, target))
    if not want or not any(pairs.values()):
        return want
    if last_round_s > time_left_s:
        return frozenset()
    if all(len(pairs[c]) >= rounds.first for c in want) and last_round_s > extra_left_s:
        return frozenset()
    return want


class Budget:
    """The run's time on an injected clock: the deadline no round starts past (but a group's
    first), and the seconds the extra rounds may still spend."""

    def __init__(self, total_s, extra_s, clock=time.monotonic):
        self.clock = clock
        self.deadline = clock() + total_s
        self.extra_left_s = extra_s

    def time_left_s(self):
        return self.deadline - self.clock()


def run_group(measure, checks, rounds, budget, floors=None):
    """Rounds of `measure(want, r)` (r: the round's index; it returns {check: ratio} for at
    least the checks in `want`) for as long as plan_round asks for one; {check: [ratio]}."""
    pairs = {c: [] for c in checks}
    last_s, r = 0.0, 0
    while True:
        want = plan_round(pairs, rounds, last_s, budget.time_left_s(), budget.extra_left_s,
                          floors)
        if not want:
            return pairs
        extra = r > 0 and all(len(pairs[c]) >= rounds.first for c in want)
        t = budget.clock()
        got = measure(want, r)
        last_s = budget.clock() - t
        if extra:
            budget.extra_left_s -= last_s
        for c in want:
            pairs[c].append(got[c])
        r += 1


# ---- this run: one round of each group ----------------------------------------------------------

def anchor(run, what):
    """One measurement of an anchor, tried again once when it fails: PyTorch's launchers and
    stores fail now and then on their own (torchrun's c10d agent once could not reach its own
    store). crun's side gets no second chance."""
    try:
        return run()
    except RuntimeError as e:
        print(f"  {what} failed, trying again: {str(e)[-300:]}", file=sys.stderr)
        return run()


def alternating(first, second, n, first_leads):
    """The medians of n samples each of two measurements taken in turns, `first` leading when
    `first_leads` (the lead swaps from round to round: neither side always runs second)."""
    a, b = [], []
    order = ((first, a), (second, b)) if first_leads else ((second, b), (first, a))
    for _ in range(n):
        for measure, samples in order:
            samples.append(measure())
    return statistics.median(a), statistics.median(b)


def launch_round(args, want, r, _):
    """crun's launch and restarts against the limit and torchrun. crun's launch is the median of
    5 taking turns with the limit's (milliseconds: more samples), its restart the median of 3
    taking turns with the gated one's; each torchrun anchor runs once, and only in the rounds
    that want it (the extra rounds are for the checks judged against the limit)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmds = launch_bench.launchers(args)
    crun = [*cmds["crun"], "--nproc_per_node", "2", "--no_python", "true"]
    torch = [*cmds["torchrun 2.x"], "--nproc_per_node", "2", "--no_python", "true"]
    limit = [args.limit, "2", "true"]
    crun_leads = r % 2 == 0
    c, lim = alternating(lambda: launch_bench.timed(crun, env),
                         lambda: launch_bench.timed(limit, env), 5, crun_leads)
    got = {LAUNCH_LIMIT: lim / c}
    if LAUNCH_TORCH in want:
        got[LAUNCH_TORCH] = anchor(lambda: launch_bench.timed(torch, env),
                                   "torchrun 2.x launch") / c
    if want & {RESTART_TORCH, RESTART_LIMIT, RESTART_GATED}:
        def plain():
            return launch_bench.restart_latency(cmds["crun"], 2, args.probe)

        def gated():
            return launch_bench.restart_latency([*cmds["crun"], *launch_bench.GATE], 2,
                                                args.probe)
        if RESTART_GATED in want:
            cr, cg = alternating(plain, gated, 3, crun_leads)
            got[RESTART_GATED] = cr / cg
        else:
            cr = statistics.median(plain() for _ in range(3))
        got[RESTART_LIMIT] = lim * 1000 / cr  # s against ms
        if RESTART_TORCH in want:
            got[RESTART_TORCH] = anchor(
                lambda: launch_bench.restart_latency(cmds["torchrun 2.x"], 2, args.probe),
                "torchrun 2.x restart") / cr
    return got


def rdzv_round(args, want, r, _):
    c = statistics.median(rdzv_bench.launch_to_running(args, "crun", 2) for _ in range(3))
    t = anchor(lambda: rdzv_bench.launch_to_running(args, "torchrun", 2),
               "torchrun c10d rendezvous")
    return {RDZV: t / c}


def simulation(args):
    sim = argparse.Namespace(**vars(args))
    sim.loadgen = args.rdzv_loadgen
    sim.bare_server = os.path.join(os.path.dirname(args.rdzv_loadgen), "bare_session_server")
    return sim


def scale_round(args, want, r, _):
    """The simulated agents of rdzv_bench at 1,000, 10,000 and 30,000 (a tenth of each with
    --smoke), a fresh daemon each, no steady phase."""
    sizes = tuple(n // 10 for n in SCALE) if args.smoke else SCALE
    runs = {n: rdzv_bench.simulated(simulation(args), n, steady_ms=0) for n in sizes}
    form = {n: x["form"]["ms"] for n, x in runs.items()}
    told = {n: x["told"]["ms"] for n, x in runs.items()}
    return {FORM_10K: linearity(form, sizes[0], sizes[1]),
            FORM_30K: linearity(form, sizes[1], sizes[2]),
            TOLD_30K: linearity(told, sizes[1], sizes[2])}


def etcd_round(args, want, r, _):
    """rdzv_bench's simulated agents through a fresh 3-member etcd at 100 and 1,000 (10 and 100
    with --smoke)."""
    sizes = tuple(n // 10 for n in ETCD_SCALE) if args.smoke else ETCD_SCALE
    form = {n: rdzv_bench.etcd_simulated(simulation(args), n, steady_ms=0)["form"]["ms"]
            for n in sizes}
    return {ETCD_FORM: linearity(form, *sizes)}


def beat_round(args, want, r, _):
    """10,000 agents beating each second (a tenth with --smoke), 3 s measured (1 s with
    --smoke): the daemon's CPU per datagram against a bare gRPC server's per stream message, a
    fresh server each."""
    sim = simulation(args)
    n = SCALE[1] // 10 if args.smoke else SCALE[1]
    steady_ms = 1000 if args.smoke else rdzv_bench.STEADY_MS
    crun = rdzv_bench.per_beat_micros(rdzv_bench.simulated(sim, n, steady_ms))
    _, bare = rdzv_bench.bare_baseline(sim, n, steady_ms)
    # /proc counts CPU in ticks of 10 ms: a tenth of the agents may show none in 3 s.
    return {BEATS_10K: bare / max(crun, 0.1)}


def recovery_round(args, want, r, _):
    """One node x 2 stock DDP workers, rank 1 crashing: crash -> every worker of the next
    attempt imported torch, crun --warm and torchrun 2.x taking turns. torchrun's restarts
    often fail later, in gloo (docs/benchmarks.md): its figure counts when its workers got that
    far. crun's side must succeed whole; the anchor gets its second chance."""
    def imported(launcher, whole):
        res = recovery_bench.run_once(args, launcher, args.torch2_python, 1, "crash")
        if "imported" not in res or (whole and "failed" in res):
            raise RuntimeError(f"{launcher}: {res.get('failed', 'no figure')}")
        return res["imported"]

    warm = imported("crun-warm", True)
    return {RECOVERY: anchor(lambda: imported("torchrun", False), "torchrun 2.x restart") / warm}


def snapshot_round(args, want, r, _):
    """A save of 200 MiB a rank into crun's memory against torch.save to /dev/shm, two workers
    saving at once, alternating within each run (snapshot_bench.py)."""
    args.mib, args.rounds = (8, 1) if args.smoke else (200, 3)
    got = snapshot_bench.run_saves(args, args.torch2_python)
    return {SNAPSHOT: statistics.median(got["torch.save /dev/shm"])
            / statistics.median(got["crun_worker.save"])}


def node_lost_round(args, want, r, _):
    """A node lost, a spare taking its ranks from a peer's copy against the same job resuming
    from disk, alternating (node_lost_bench.py). Both must succeed."""
    run_args = argparse.Namespace(crun=args.crun, torch2_python=args.torch2_python,
                                  ckpt_mb=8 if args.smoke else 200, kill_after=4, keep=False)

    def first_step(way):
        res = node_lost_bench.run_once(run_args, way)
        if "failed" in res or "step" not in res:
            raise RuntimeError(f"node lost, {way}: {res.get('failed', 'no figure')}")
        return res["step"]

    ways = ("peer", "disk") if r % 2 == 0 else ("disk", "peer")
    got = {way: first_step(way) for way in ways}
    return {NODE_LOST: got["disk"] / got["peer"]}


STORE_KINDS = ("crun-2x", "torch2-libuv")


@contextlib.contextmanager
def store_servers(args):
    """crun's store and libuv's, started once for every `set` round and stopped however the
    rounds end (store_bench.running_servers)."""
    args.warmup_ms, args.duration_ms = (100, 300) if args.smoke else (200, 700)
    with store_bench.running_servers(STORE_KINDS, args) as servers:
        yield servers


def store_set_round(args, want, r, servers):
    """set at 64 clients (8 with --smoke), crun and libuv taking turns."""
    order = STORE_KINDS if r % 2 == 0 else STORE_KINDS[::-1]
    got = {k: store_bench.loadgen(args, servers[k], "set", 8 if args.smoke else 64)
           for k in order}
    for k, v in got.items():
        if "error" in v:
            raise RuntimeError(f"store {k}: {v['error']}")
    return {STORE_SET: got["crun-2x"]["ops_per_s"] / got["torch2-libuv"]["ops_per_s"]}


def storm_round(args, want, r, _):
    """20,000 connections at once (400 with --smoke), a fresh server each, taking turns."""
    args.storm_timeout_ms = 60000
    total = 400 if args.smoke else 20000
    seconds = {}
    for k in (STORE_KINDS if r % 2 == 0 else STORE_KINDS[::-1]):
        with store_bench.start_server(k, args) as server:
            s = store_bench.storm(args, server, total, 4)
        if s["pending"] or not s["seconds"]:
            raise RuntimeError(f"storm {k}: {s}")
        seconds[k] = s["seconds"]
    return {STORM: seconds["torch2-libuv"] / seconds["crun-2x"]}


def no_session(args):
    return contextlib.nullcontext()


Group = collections.namedtuple("Group", "name checks measure first session",
                               defaults=(START_ROUNDS, no_session))
# In the order they run. The storm last: it leaves 40,000 closed connections in TIME_WAIT.
GROUPS = (
    Group("launch", (LAUNCH_TORCH, LAUNCH_LIMIT, RESTART_TORCH, RESTART_LIMIT, RESTART_GATED),
          launch_round),
    Group("rendezvous", (RDZV,), rdzv_round),
    Group("scale", (FORM_10K, FORM_30K, TOLD_30K), scale_round),
    Group("etcd", (ETCD_FORM,), etcd_round),
    Group("heartbeats", (BEATS_10K,), beat_round),
    Group("recovery", (RECOVERY,), recovery_round),
    Group("snapshot", (SNAPSHOT,), snapshot_round),
    Group("node lost", (NODE_LOST,), node_lost_round),
    Group("store set", (STORE_SET,), store_set_round, START_ROUNDS, store_servers),
    Group("storm", (STORM,), storm_round, 2),
)


# --smoke's lanes: each lane's groups in turn, the two lanes at once. Nothing is timed against
# anything in a smoke run, and no two groups share a port (the kernel's or free_port's), a
# folder or a process. The groups whose jobs are several PyTorch workers (recovery, snapshot,
# node lost) share a lane, so that one of them at a time holds its memory; the two lanes take
# about as long.
SMOKE_LANES = (("recovery", "snapshot", "node lost"),
               ("launch", "rendezvous", "scale", "etcd", "heartbeats", "store set", "storm"))
SMOKE_LIMIT_S = 600  # both lanes ended by then, or the run fails


def measure_group(args, group, budget):
    """One group's rounds; {check: [pair ratio]}."""
    rounds = Rounds(1, 1) if args.smoke else Rounds(group.first, ROUNDS_CAP)
    t = budget.clock()
    with group.session(args) as state:
        pairs = run_group(lambda want, r: group.measure(args, want, r, state), group.checks,
                          rounds, budget)
    counts = [len(v) for v in pairs.values()]
    # One write: the other lane's lines do not cut into it.
    print(f"{group.name}: {max(counts)} rounds in {budget.clock() - t:.0f} s (pairs: "
          f"{', '.join(map(str, counts))})"
          f"{'; cut short by the run budget' if min(counts) < rounds.first else ''}\n",
          end="", file=sys.stderr)
    return pairs


def measure_all(args, budget):
    """Every group's rounds, one group after another; {check: [pair ratio]}."""
    measured = {}
    for group in GROUPS:
        measured.update(measure_group(args, group, budget))
    return measured


def measure_lanes(args, budget, groups=GROUPS, lanes=SMOKE_LANES, limit_s=SMOKE_LIMIT_S):
    """Every group's rounds, the lanes at once (a thread each: a group waits on its processes),
    each group with its own copy of `args` (a group sets its sizes there); {check: [pair
    ratio]} in `groups`' order. A group that fails fails the run once both lanes have ended; a
    lane still running after `limit_s` fails it then."""
    by_name = {g.name: g for g in groups}
    measured, failed = {}, []

    def lane(names):
        try:
            for name in names:
                measured.update(measure_group(argparse.Namespace(**vars(args)), by_name[name],
                                              budget))
        except Exception as e:  # raised again below, in the main thread
            failed.append(e)

    threads = [threading.Thread(target=lane, args=(names,), daemon=True) for names in lanes]
    deadline = time.monotonic() + limit_s
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        raise RuntimeError(f"a lane of groups still ran after {limit_s} s")
    if failed:
        raise failed[0]
    return {c: measured[c] for g in groups for c in g.checks}


def main():
    if "CRUN_BENCH_IN_NETNS" not in os.environ:
        # What the checks write (crun's default log folders, the benchmarks' own temporary
        # folders) goes into one folder of this run, removed with it.
        tmp = tempfile.mkdtemp(prefix="crun-check-")
        os.environ["TMPDIR"] = tmp
        try:
            rc = in_private_netns([os.path.abspath(__file__), *sys.argv[1:]])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        sys.exit(rc)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--crun", required=True)
    ap.add_argument("--store-loadgen", required=True, help="the store_loadgen binary")
    ap.add_argument("--probe", required=True, help="the restart_probe binary")
    ap.add_argument("--limit", required=True, help="the spawn_limit binary")
    ap.add_argument("--rdzv-loadgen", required=True, help="the rdzv_loadgen binary")
    ap.add_argument("--torch2-python", required=True)
    ap.add_argument("--docs", default=os.path.join(HERE, "..", "..", "docs", "benchmarks.md"))
    ap.add_argument("--smoke", action="store_true",
                    help="one short round each: checks that it runs and parses, judges nothing")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S,
                    help=f"no round starts past this many seconds but a group's first; "
                         f"{EXTRA_SHARE:.0%} of it for rounds beyond the first "
                         f"{START_ROUNDS} (default {BUDGET_S:.0f})")
    args = ap.parse_args()
    args.loadgen = args.store_loadgen
    budget = Budget(args.budget_s, 0.0 if args.smoke else args.budget_s * EXTRA_SHARE)
    t0 = budget.clock()
    was = recorded(args.docs)
    try:
        # Before anything starts: the store checks need it, and they run last.
        store_bench.require_use_libuv(args.torch2_python)
    except store_bench.UnsupportedPython as e:
        print(f"check.py: {e}", file=sys.stderr)
        sys.exit(2)
    print("recorded in docs/benchmarks.md:", file=sys.stderr)
    for name, (ratio, commit) in was.items():
        print(f"  {name}: {ratio:,.2f} (at {commit})", file=sys.stderr)
    measured = measure_lanes(args, budget) if args.smoke else measure_all(args, budget)
    rows, regressed = judge(measured, was)
    print("| check | recorded (commit) | this run | noise band (pairs) | verdict |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row.check} | {row.recorded:,.2f} ({row.commit}) | {row.now:,.2f} | "
              f"{pct(row.band)} ({row.pairs}) | {row.verdict} |")
    judged = sum(1 for row in rows if row.judged)
    outcome = "a judged ratio fell" if regressed else "no judged ratio fell"
    print(f"{len(rows)} checks in {budget.clock() - t0:.0f} s; {judged} judged (band at most "
          f"{pct(TARGET_BAND)} over {MIN_PAIRS} pairs or more), {len(rows) - judged} reported, "
          f"not judged: {outcome} beyond its noise band")
    if args.smoke:
        sys.exit(0)  # one short round proves it runs; it judges nothing
    sys.exit(1 if regressed else 0)


if __name__ == "__main__":
    main()
