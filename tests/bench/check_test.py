"""check.py's judgement and its reading of docs/benchmarks.md, without running anything: a ratio
that fell beyond its band is a regression, one inside it is not, one that rose says so; the
recorded ratios come from the real tables with their commits."""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check  # noqa: E402

DOCS = os.path.join(HERE, "..", "..", "docs", "benchmarks.md")


class Judge(unittest.TestCase):
    def test_a_fall_beyond_the_band_is_a_regression(self):
        was = {"a": (100.0, "abc1234"), "b": (100.0, "abc1234"), "c": (100.0, "abc1234")}
        rows, regressed = check.judge({"a": [95, 100, 105],   # inside a 10 % band
                                       "b": [60, 62, 61],     # fell by 39 %
                                       "c": [150, 151, 149]},  # rose
                                      was)
        verdicts = {r[0]: r[5] for r in rows}
        self.assertEqual(verdicts, {"a": "ok", "b": "REGRESSION", "c": "better than recorded"})
        self.assertTrue(regressed)

    def test_the_band_is_the_measured_spread_when_wider(self):
        rows, regressed = check.judge({"a": [60, 100, 140]}, {"a": (130.0, "x")})
        self.assertAlmostEqual(rows[0][4], 0.8)  # (140 - 60) / 100
        self.assertEqual(rows[0][5], "ok")
        self.assertFalse(regressed)


    def test_the_storm_has_a_wider_floor_for_its_stepping_anchor(self):
        was = {check.STORM: (16.0, "x")}
        rows, regressed = check.judge({check.STORM: [7.7, 7.8]}, was)  # libuv 3.5 s, not 7 s
        self.assertEqual(rows[0][4], 0.65)
        self.assertEqual(rows[0][5], "ok")
        self.assertFalse(regressed)
        rows, regressed = check.judge({check.STORM: [3.0, 3.1]}, was)  # crun itself retrying
        self.assertEqual(rows[0][5], "REGRESSION")
        self.assertTrue(regressed)

    def test_the_torchrun_restart_ratio_is_shown_but_not_judged(self):
        was = {check.RESTART_TORCH: (167.0, "x"), check.RESTART_LIMIT: (0.43, "x")}
        rows, regressed = check.judge({check.RESTART_TORCH: [58, 60, 61],  # fell by 64 %
                                       check.RESTART_LIMIT: [0.42, 0.44, 0.43]}, was)
        verdicts = {r[0]: r[5] for r in rows}
        self.assertEqual(verdicts, {check.RESTART_TORCH: "shown, not judged",
                                    check.RESTART_LIMIT: "ok"})
        self.assertFalse(regressed)
        # crun's restart twice as slow against the same limit is judged.
        rows, regressed = check.judge({check.RESTART_LIMIT: [0.21, 0.22, 0.215]}, was)
        self.assertEqual(rows[0][5], "REGRESSION")
        self.assertTrue(regressed)


class Recorded(unittest.TestCase):
    def test_every_check_has_a_recorded_ratio_and_commit(self):
        was = check.recorded(DOCS)
        self.assertEqual(len(was), 16)
        for name, (ratio, commit) in was.items():
            self.assertGreater(ratio, 0, name)
            self.assertRegex(commit, r"^[0-9a-f]{7,}$", name)

    def test_the_scale_ratios_come_from_the_simulated_table(self):
        text = check.section(open(DOCS).read(), "<!-- rdzv-bench:begin -->",
                             "<!-- rdzv-bench:end -->")
        cells = check.row(text, "form a round")
        col = {n: 1 + i for i, n in enumerate(check.rdzv_bench.SIMULATED)}
        ten, thirty = check.number(cells[col[10000]]), check.number(cells[col[30000]])
        self.assertAlmostEqual(check.recorded(DOCS)[check.FORM_30K][0], 3 * ten / thirty)
        self.assertAlmostEqual(check.linearity({1: 10.0, 10: 100.0}, 1, 10), 1.0)
        self.assertAlmostEqual(check.linearity({1: 10.0, 10: 200.0}, 1, 10), 0.5)

    def test_the_etcd_ratio_is_how_forming_through_etcd_grows_from_100_to_1000(self):
        text = check.section(open(DOCS).read(), "<!-- rdzv-bench:begin -->",
                             "<!-- rdzv-bench:end -->")
        cells = check.row(text, check.rdzv_bench.ETCD_FORM_ROW)
        small, large = check.number(cells[1]), check.number(cells[2])
        self.assertEqual(check.ETCD_SCALE, (100, 1000))
        self.assertAlmostEqual(check.recorded(DOCS)[check.ETCD_FORM][0], 10 * small / large)

    def test_the_beat_ratio_is_the_bare_message_over_the_datagram_at_10k(self):
        text = check.section(open(DOCS).read(), "<!-- rdzv-bench:begin -->",
                             "<!-- rdzv-bench:end -->")
        col = 1 + check.rdzv_bench.SIMULATED.index(10000)
        bare = check.number(check.row(text, check.rdzv_bench.BARE_BEAT_ROW)[col])
        crun = check.number(check.row(text, check.rdzv_bench.BEAT_ROW)[col])
        self.assertAlmostEqual(check.recorded(DOCS)[check.BEATS_10K][0], bare / crun)

    def test_the_health_gate_is_judged_against_the_plain_restart(self):
        text = check.section(open(DOCS).read(), "<!-- launch-bench:begin -->",
                             "<!-- launch-bench:end -->")
        plain = check.number(check.row(text, "restart, 2 workers")[1])
        gated = check.number(check.row(text, "restart, 2 workers, health gate")[1])
        self.assertAlmostEqual(check.recorded(DOCS)[check.RESTART_GATED][0], plain / gated)

    def test_the_save_is_judged_on_the_pytorch_2_row(self):
        text = check.section(open(DOCS).read(), "<!-- snapshot-bench:begin -->",
                             "<!-- snapshot-bench:end -->")
        cells = next([c.strip() for c in line.strip().strip("|").split("|")]
                     for line in text.splitlines() if line.startswith("| 2."))
        self.assertAlmostEqual(check.recorded(DOCS)[check.SNAPSHOT][0],
                               check.number(cells[2]) / check.number(cells[1]))

    def test_the_restart_is_judged_against_the_limit_of_the_same_table(self):
        launch = check.section(open(DOCS).read(), "<!-- launch-bench:begin -->",
                               "<!-- launch-bench:end -->")
        limit = check.number(check.row(launch, "launch → exit, 2 workers")[2])
        restart = check.number(check.row(launch, "restart, 2 workers")[1])
        self.assertAlmostEqual(check.recorded(DOCS)[check.RESTART_LIMIT][0], limit / restart)

    def test_the_node_lost_ratio_is_disk_over_the_peer_copy_of_the_first_step_row(self):
        text = check.section(open(DOCS).read(), "<!-- node-lost-bench:begin -->",
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
