"""check.py's noise band, its verdicts, its rounds and its reading of docs/benchmarks.md, without
timing anything: the band is a confidence interval of the median pair ratio; a check is judged
only within ±20 % over enough pairs, and reported (saying why) otherwise; rounds are added to
the checks that can still be judged, up to a cap and within the time budget, on a fake clock
with scripted measurements; --smoke's lanes run at once and hold every group once. The
recorded ratios come from the real tables with their commits."""
import argparse
import math
import os
import sys
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check  # noqa: E402

DOCS = os.path.join(HERE, "..", "..", "docs", "benchmarks.md")
TIGHT = [100, 102, 98, 105, 95]  # 5 pairs within ±5 %: the band is the 10 % minimum


def docs_text():
    with open(DOCS) as f:
        return f.read()


def coverage(n, k):
    """P(the k-th smallest <= median <= the k-th largest) of n values: binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(k, n - k + 1)) / 2 ** n


class Band(unittest.TestCase):
    def test_the_median_rank_is_the_narrowest_interval_holding_90_percent(self):
        for n, k in [(1, None), (2, None), (4, None), (5, 1), (7, 1), (8, 2), (10, 2),
                     (11, 3), (12, 3), (13, 4)]:
            with self.subTest(n=n):
                self.assertEqual(check.median_rank(n), k)
        self.assertEqual(check.MIN_PAIRS, 5)
        for n in range(5, 40):
            k = check.median_rank(n)
            self.assertGreaterEqual(coverage(n, k), 0.90, n)
            self.assertLess(coverage(n, k + 1), 0.90, n)

    def test_the_band_from_the_pairs(self):
        # (pair ratios, floor) -> (this run's figure, band, whether the floor set it)
        cases = [
            (TIGHT, 0.0, (100, 0.10, False)),                      # at least 10 %
            ([100, 130, 90, 110, 95], 0.0, (100, 0.30, False)),    # [min, max] of 5: the wider side
            ([100, 80, 105, 110, 95], 0.0, (100, 0.20, False)),    # the lower side wider
            # One outlier each way among 8: [x(2), x(7)] leaves both out.
            ([50, 97, 98, 100, 100, 102, 103, 160], 0.0, (100, 0.10, False)),
            ([50, 97, 98, 100, 100, 102, 103, 125], 0.0, (100, 0.10, False)),
            # The same outliers among 5: [min, max] holds them.
            ([50, 98, 100, 102, 160], 0.0, (100, 0.60, False)),
            # Fewer pairs than a 90 % interval needs: [min, max], shown (and never judged).
            ([90, 100, 120], 0.0, (100, 0.20, False)),
            ([200], 0.0, (200, 0.10, False)),
            # A floor wider than the spread sets the band, and says so.
            (TIGHT, 0.45, (100, 0.45, True)),
            ([100, 150, 90, 110, 95], 0.45, (100, 0.50, False)),
        ]
        for ratios, floor, (now, band, floored) in cases:
            with self.subTest(ratios=ratios, floor=floor):
                got = check.noise_band(ratios, floor)
                self.assertAlmostEqual(got[0], now)
                self.assertAlmostEqual(got[1], band)
                self.assertEqual(got[2], floored)

    def test_a_zero_figure_has_no_finite_band(self):
        self.assertEqual(check.noise_band([0, 0, 0, 1, 2])[1], math.inf)

    def test_the_band_narrows_as_pairs_are_added(self):
        # The same spread of single pairs; more of them pin the median down more closely.
        noisy = [100, 125, 80, 110, 90, 104, 96, 118, 85, 102, 98, 112]
        bands = [check.noise_band(noisy[:n])[1] for n in (5, 8, 11)]
        self.assertEqual(bands, sorted(bands, reverse=True))
        self.assertGreater(bands[0], check.TARGET_BAND)
        self.assertLessEqual(bands[-1], check.TARGET_BAND)


class Judge(unittest.TestCase):
    NOT_JUDGED_3 = "3 pairs, fewer than the 5 a 90 % interval needs: reported, not judged"

    def test_the_verdicts(self):
        # (check, pair ratios, recorded) -> (verdict, judged). No floors but the real ones
        # where the check is named by its constant.
        cases = [
            ("a", TIGHT, 100.0, ("ok", True)),
            ("a", [61, 60, 62, 59, 63], 100.0, ("REGRESSION", True)),      # fell by 39 %
            ("a", [150, 151, 149, 152, 148], 100.0, ("better than recorded", True)),
            ("a", [100, 120, 90, 95, 105], 100.0, ("ok", True)),           # ±20 %: judged
            ("a", [100, 120, 90, 95, 105], 130.0, ("REGRESSION", True)),   # below 130 × 0.8
            # A band wider than ±20 % judges nothing, whatever the ratio did: the ±76 % band
            # that passed a slowdown of two-thirds reports it and does not pass it.
            ("a", [100, 134, 90, 95, 105], 200.0, ("band ±34 %: reported, not judged", False)),
            ("a", [100, 176, 95, 100, 105], 300.0, ("band ±76 %: reported, not judged", False)),
            ("a", [60, 62, 61], 150.0, (self.NOT_JUDGED_3, False)),         # fell, 3 pairs
            ("a", [90, 100, 134], 150.0, ("band ±34 %: reported, not judged", False)),
            (check.RDZV, [100, 101, 99], 300.0,
             ("band ±45 % (its between-run floor): reported, not judged", False)),
            ("a", [40], 100.0, ("1 pair, fewer than the 5 a 90 % interval needs: reported, "
                                "not judged", False)),
            # A tight run of a check whose ratio moves between runs: its floor decides.
            (check.STORM, [7.7, 7.8, 7.75, 7.7, 7.8], 16.0,
             ("band ±65 % (its between-run floor): reported, not judged", False)),
            (check.RESTART_TORCH, [58, 60, 61, 59, 60], 167.0,
             ("reported, never judged: its ratio moves too far between runs", False)),
            # crun's restart twice as slow against the same limit is judged.
            (check.RESTART_LIMIT, [0.21, 0.22, 0.215, 0.22, 0.21], 0.43, ("REGRESSION", True)),
            (check.RESTART_LIMIT, [0.42, 0.44, 0.43, 0.43, 0.42], 0.43, ("ok", True)),
        ]
        for name, ratios, was, (verdict, judged) in cases:
            with self.subTest(check=name, ratios=ratios, was=was):
                rows, regressed = check.judge({name: ratios}, {name: (was, "abc1234")})
                self.assertEqual((rows[0].verdict, rows[0].judged), (verdict, judged))
                self.assertEqual(rows[0].pairs, len(ratios))
                self.assertEqual(regressed, verdict == "REGRESSION")

    def test_only_a_judged_check_makes_the_run_regress(self):
        was = {"fell, judged": (100.0, "x"), "fell, wide": (100.0, "x"), "fell, few": (100.0, "x")}
        rows, regressed = check.judge({"fell, wide": [50, 80, 45, 50, 52],
                                       "fell, few": [50, 51, 49]}, was)
        self.assertEqual([r.judged for r in rows], [False, False])
        self.assertFalse(regressed)
        rows, regressed = check.judge({"fell, judged": [50, 51, 49, 50, 50],
                                       "fell, wide": [50, 80, 45, 50, 52]}, was)
        self.assertEqual([r.verdict for r in rows],
                         ["REGRESSION", "band ±60 %: reported, not judged"])
        self.assertTrue(regressed)

    def test_every_floor_above_the_target_leaves_its_check_unjudged(self):
        for name, floor in check.BAND_FLOORS.items():
            with self.subTest(check=name):
                rows, _ = check.judge({name: [1.0] * 12}, {name: (1.0, "x")})
                self.assertEqual(rows[0].judged, floor <= check.TARGET_BAND)


class Rounds(unittest.TestCase):
    FLOORS = {"floored": 0.45}
    FIRST = check.Rounds(first=3, cap=8)

    def plan(self, pairs, last_s=1.0, left_s=100.0, extra_s=50.0, rounds=FIRST):
        return set(check.plan_round(pairs, rounds, last_s, left_s, extra_s, self.FLOORS))

    def test_which_checks_a_round_measures(self):
        tight4 = TIGHT[:4]
        wide5 = [100, 134, 90, 95, 105]
        # (pairs so far, budget: last round s, time left s, extra left s) -> checks measured
        cases = [
            # The first round always runs, even past the budget: every check reports a figure.
            ({"a": [], "floored": []}, (5.0, 0.0, 0.0), {"a", "floored"}),
            # Up to the first rounds: every check, while a round fits in the time left.
            ({"a": [1, 1], "floored": [1, 1]}, (5.0, 60.0, 0.0), {"a", "floored"}),
            ({"a": [1, 1], "floored": [1, 1]}, (5.0, 4.0, 50.0), set()),
            # Past them: only a check that can be judged and is not yet (too few pairs for
            # the interval, or a band wider than ±20 %); a floor above the target never is.
            ({"a": TIGHT[:3], "floored": TIGHT[:3]}, (1.0, 100.0, 50.0), {"a"}),
            ({"a": tight4, "floored": tight4}, (1.0, 100.0, 50.0), {"a"}),
            ({"a": TIGHT, "floored": TIGHT}, (1.0, 100.0, 50.0), set()),
            ({"a": wide5, "b": TIGHT}, (1.0, 100.0, 50.0), {"a"}),
            ({check.RESTART_TORCH: wide5, "b": wide5}, (1.0, 100.0, 50.0), {"b"}),
            # Up to the cap.
            ({"a": wide5 * 2}, (1.0, 100.0, 50.0), set()),
            ({"a": (wide5 * 2)[:7]}, (1.0, 100.0, 50.0), {"a"}),
            # An extra round must fit in both the time left and the extra rounds' share.
            ({"a": wide5}, (1.0, 0.5, 50.0), set()),
            ({"a": wide5}, (6.0, 100.0, 5.0), set()),
            ({"a": wide5}, (5.0, 100.0, 5.0), {"a"}),
        ]
        for pairs, (last_s, left_s, extra_s), want in cases:
            with self.subTest(pairs={k: len(v) for k, v in pairs.items()}, budget=(last_s, left_s,
                                                                                   extra_s)):
                self.assertEqual(self.plan(pairs, last_s, left_s, extra_s), want)

    def test_smoke_takes_one_round(self):
        smoke = check.Rounds(first=1, cap=1)
        self.assertEqual(self.plan({"a": []}, rounds=smoke), {"a"})
        self.assertEqual(self.plan({"a": [1.0]}, rounds=smoke), set())


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class RunGroup(unittest.TestCase):
    """run_group on a fake clock, each round's ratios scripted and its cost the clock's step."""

    def run_group(self, script, total_s, extra_s, round_s=10.0, rounds=check.Rounds(3, 8)):
        clock = FakeClock()
        budget = check.Budget(total_s, extra_s, clock)
        calls = []

        def measure(want, r):
            calls.append((r, sorted(want)))
            clock.now += round_s
            return {c: script[c][r] for c in script}  # more than asked: only `want` counts

        pairs = check.run_group(measure, list(script), rounds, budget, {"floored": 0.45})
        return pairs, calls, budget

    def test_rounds_are_added_only_to_the_checks_that_need_them(self):
        noisy = [100, 125, 80, 110, 90, 104, 96, 118]  # judged once 8 pairs pin it down
        script = {"tight": TIGHT + [100] * 3, "noisy": noisy, "floored": noisy}
        pairs, calls, budget = self.run_group(script, total_s=300, extra_s=60)
        self.assertEqual({c: len(v) for c, v in pairs.items()},
                         {"tight": 5, "noisy": 8, "floored": 3})
        self.assertEqual([w for _, w in calls],
                         [["floored", "noisy", "tight"]] * 3 + [["noisy", "tight"]] * 2
                         + [["noisy"]] * 3)
        self.assertEqual(budget.extra_left_s, 60 - 5 * 10.0)  # five extra rounds of 10 s
        self.assertLessEqual(check.noise_band(pairs["noisy"])[1], check.TARGET_BAND)

    def test_the_extra_rounds_stop_at_their_share_of_the_budget(self):
        script = {"noisy": [100, 134, 90, 95, 105, 100, 100, 100]}
        pairs, calls, budget = self.run_group(script, total_s=300, extra_s=25)
        self.assertEqual(len(pairs["noisy"]), 5)  # 3 first, 2 extra of 10 s; a third: no
        self.assertEqual(budget.extra_left_s, 5.0)

    def test_the_run_budget_cuts_rounds_but_never_a_groups_first(self):
        script = {"noisy": [100, 134, 90, 95, 105, 100, 100, 100]}
        pairs, _, _ = self.run_group(script, total_s=15, extra_s=60)
        self.assertEqual(len(pairs["noisy"]), 1)  # after 10 s, a second 10 s round does not fit
        pairs, _, _ = self.run_group(script, total_s=0, extra_s=60)
        self.assertEqual(len(pairs["noisy"]), 1)

    def test_the_cap_bounds_the_rounds_of_a_check_that_never_settles(self):
        script = {"noisy": [100, 200, 50] * 5}
        pairs, _, _ = self.run_group(script, total_s=10 ** 6, extra_s=10 ** 6,
                                     rounds=check.Rounds(3, 12))
        self.assertEqual(len(pairs["noisy"]), 12)


class Lanes(unittest.TestCase):
    """measure_lanes on scripted groups: no process is started, nothing is timed."""

    def lanes(self, groups, lanes):
        args = argparse.Namespace(smoke=True)
        return check.measure_lanes(args, check.Budget(100.0, 0.0), groups, lanes, limit_s=60)

    def test_every_group_is_in_one_smoke_lane(self):
        names = [name for lane in check.SMOKE_LANES for name in lane]
        self.assertEqual(sorted(names), sorted(g.name for g in check.GROUPS))
        self.assertEqual(len(names), len(set(names)))

    def test_the_lanes_run_at_once_each_in_turn(self):
        # The first group of each lane waits for the other's: lanes taken in turn would not
        # meet, and the barrier's deadline would fail the run.
        met = threading.Barrier(2, timeout=30)
        order = []

        def meets(args, want, r, _):
            met.wait()
            order.append(sorted(want))
            return {c: 2.0 for c in want}

        def after(args, want, r, _):
            order.append(sorted(want))
            return {c: 3.0 for c in want}

        groups = (check.Group("a", ("ca",), meets), check.Group("b", ("cb",), meets),
                  check.Group("c", ("cc",), after))
        got = self.lanes(groups, (("a",), ("b", "c")))
        self.assertEqual(list(got.items()), [("ca", [2.0]), ("cb", [2.0]), ("cc", [3.0])])
        self.assertLess(order.index(["cb"]), order.index(["cc"]))

    def test_a_groups_failure_is_the_runs(self):
        def fails(args, want, r, _):
            raise RuntimeError("crun exited 1")

        def works(args, want, r, _):
            return {c: 1.0 for c in want}

        groups = (check.Group("a", ("ca",), fails), check.Group("b", ("cb",), works))
        with self.assertRaisesRegex(RuntimeError, "crun exited 1"):
            self.lanes(groups, (("a",), ("b",)))


class Recorded(unittest.TestCase):
    def test_every_check_has_a_recorded_ratio_and_commit(self):
        was = check.recorded(DOCS)
        self.assertEqual(len(was), 16)
        for name, (ratio, commit) in was.items():
            self.assertGreater(ratio, 0, name)
            self.assertRegex(commit, r"^[0-9a-f]{7,}$", name)

    def test_the_scale_ratios_come_from_the_simulated_table(self):
        text = check.section(docs_text(), "<!-- rdzv-bench:begin -->",
                             "<!-- rdzv-bench:end -->")
        cells = check.row(text, "form a round")
        col = {n: 1 + i for i, n in enumerate(check.rdzv_bench.SIMULATED)}
        ten, thirty = check.number(cells[col[10000]]), check.number(cells[col[30000]])
        self.assertAlmostEqual(check.recorded(DOCS)[check.FORM_30K][0], 3 * ten / thirty)
        self.assertAlmostEqual(check.linearity({1: 10.0, 10: 100.0}, 1, 10), 1.0)
        self.assertAlmostEqual(check.linearity({1: 10.0, 10: 200.0}, 1, 10), 0.5)

    def test_the_etcd_ratio_is_how_forming_through_etcd_grows_from_100_to_1000(self):
        text = check.section(docs_text(), "<!-- rdzv-bench:begin -->",
                             "<!-- rdzv-bench:end -->")
        cells = check.row(text, check.rdzv_bench.ETCD_FORM_ROW)
        small, large = check.number(cells[1]), check.number(cells[2])
        self.assertEqual(check.ETCD_SCALE, (100, 1000))
        self.assertAlmostEqual(check.recorded(DOCS)[check.ETCD_FORM][0], 10 * small / large)

    def test_the_beat_ratio_is_the_bare_message_over_the_datagram_at_10k(self):
        text = check.section(docs_text(), "<!-- rdzv-bench:begin -->",
                             "<!-- rdzv-bench:end -->")
        col = 1 + check.rdzv_bench.SIMULATED.index(10000)
        bare = check.number(check.row(text, check.rdzv_bench.BARE_BEAT_ROW)[col])
        crun = check.number(check.row(text, check.rdzv_bench.BEAT_ROW)[col])
        self.assertAlmostEqual(check.recorded(DOCS)[check.BEATS_10K][0], bare / crun)

    def test_the_health_gate_is_judged_against_the_plain_restart(self):
        text = check.section(docs_text(), "<!-- launch-bench:begin -->",
                             "<!-- launch-bench:end -->")
        plain = check.number(check.row(text, "restart, 2 workers")[1])
        gated = check.number(check.row(text, "restart, 2 workers, health gate")[1])
        self.assertAlmostEqual(check.recorded(DOCS)[check.RESTART_GATED][0], plain / gated)

    def test_the_save_is_judged_on_the_pytorch_2_row(self):
        text = check.section(docs_text(), "<!-- snapshot-bench:begin -->",
                             "<!-- snapshot-bench:end -->")
        cells = next([c.strip() for c in line.strip().strip("|").split("|")]
                     for line in text.splitlines() if line.startswith("| 2."))
        self.assertAlmostEqual(check.recorded(DOCS)[check.SNAPSHOT][0],
                               check.number(cells[2]) / check.number(cells[1]))

    def test_the_restart_is_judged_against_the_limit_of_the_same_table(self):
        launch = check.section(docs_text(), "<!-- launch-bench:begin -->",
                               "<!-- launch-bench:end -->")
        limit = check.number(check.row(launch, "launch → exit, 2 workers")[2])
        restart = check.number(check.row(launch, "restart, 2 workers")[1])
        self.assertAlmostEqual(check.recorded(DOCS)[check.RESTART_LIMIT][0], limit / restart)

    def test_the_node_lost_ratio_is_disk_over_the_peer_copy_of_the_first_step_row(self):
        text = check.section(docs_text(), "<!-- node-lost-bench:begin -->",
                             "<!-- node-lost-bench:end -->")
        cells = check.row(text, check.node_lost_bench.FIRST_STEP)
        self.assertTrue(cells[0].startswith("**loss → every rank's first step"))
        self.assertAlmostEqual(check.recorded(DOCS)[check.NODE_LOST][0],
                               check.number(cells[3]) / check.number(cells[1]))

    def test_number_reads_the_tables_cells(self):
        self.assertEqual(check.number("1,652.1 ms"), 1652.1)
        self.assertEqual(check.number("382×"), 382)
        self.assertEqual(check.number("0.45 s"), 0.45)
        with self.assertRaises(ValueError):
            check.number("failed")


if __name__ == "__main__":
    unittest.main(verbosity=2)
