"""tests/budget_check.py's rules as tables: rows parsed and judged, sums against the ceiling."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from budget_check import (BUDGET_S, budget_problems, parse_ceiling, parse_table,  # noqa: E402
                          row_problems)


class Table(unittest.TestCase):
    def test_rows_and_their_why(self):
        rows = parse_table("# a comment\n\n"
                           "a   10  12  20  30  64  -     unit,quick\n"
                           "b  100 150 200 150 512  etcd  -     waits for leases to end\n")
        self.assertEqual(rows["a"], (10.0, 12.0, 20.0, 30, 64, "-", "unit,quick", ""))
        self.assertEqual(rows["b"], (100.0, 150.0, 200.0, 150, 512, "etcd", "-",
                                     "waits for leases to end"))

    def test_malformed_rows_are_named(self):
        for text, words in [("a 10 12 20 1 64 -\n", "line 1: 'a 10 12 20 1 64 -' has 7 columns"),
                            ("a ten 12 20 1 64 - -\n", "measured, beside and timeout are seconds"),
                            ("a 1 1 20 1.5 64 - -\n", "cpu (percent of a core) and mem (MiB)"),
                            ("a 1 1 20 0 64 - -\n", "cpu is at least 1"),
                            ("a 1 1 20 1 64 - -\na 1 1 20 1 64 - -\n",
                             "line 2: 'a' has a row already")]:
            with self.subTest(text=text), self.assertRaises(ValueError) as e:
                parse_table(text)
            self.assertIn(words, str(e.exception))

    def test_ceiling(self):
        self.assertEqual(parse_ceiling("# ceiling: 4000 s\na 1 1 10 1 64 - -\n"), 4000)
        self.assertEqual(parse_ceiling("a 1 1 10 1 64 - -\n"), BUDGET_S)


class Rows(unittest.TestCase):
    def test_about_twice_the_measured_time(self):
        for measured, timeout, ok in [(100, 200, True), (100, 150, True), (100, 250, True),
                                      (100, 140, False), (100, 260, False),
                                      (1, 6, True), (1, 5, False), (3, 6, True),
                                      (1, 12, True), (1, 13, False), (4, 12, True),
                                      (4, 13, False), (10, 25, True), (10, 26, False)]:
            with self.subTest(measured=measured, timeout=timeout):
                why = "it waits" if measured > 60 else ""
                problems = row_problems({"t": (measured, measured, timeout, 10, 64, "-", "-",
                                               why)})
                self.assertEqual(problems == [], ok, problems)

    def test_room_above_the_time_beside_the_others(self):
        for beside, ok in [(50, True), (80, True), (81, False)]:
            with self.subTest(beside=beside):
                problems = row_problems({"t": (50, beside, 100, 10, 64, "-", "-", "")})
                self.assertEqual(problems == [], ok, problems)
        self.assertIn("t: TIMEOUT 100 s leaves too little room above the 81 s it took beside "
                      "the others (at least 1.25x: 101.25 s)",
                      row_problems({"t": (50, 81, 100, 10, 64, "-", "-", "")})[0])

    def test_where_the_room_needs_more_than_2_5x_exactly_that(self):
        for timeout, ok in [(74, False), (75, True), (76, False)]:
            with self.subTest(timeout=timeout):
                problems = row_problems({"t": (20, 60, timeout, 10, 64, "-", "-", "")})
                self.assertEqual(problems == [], ok, problems)

    def test_a_long_test_says_why(self):
        self.assertEqual(row_problems({"t": (61, 61, 122, 10, 64, "-", "-", "")}),
                         ["t: measured 61 s, over 60 s, without saying why"])
        self.assertEqual(row_problems({"t": (61, 61, 122, 10, 64, "-", "-", "two venvs")}), [])
        self.assertEqual(row_problems({"t": (60, 60, 120, 10, 64, "-", "-", "")}), [])


class Sum(unittest.TestCase):
    def test_within_the_budget(self):
        problems, total = budget_problems({"a": (1000.0, ["unit"]), "b": (1400.0, [])})
        self.assertEqual((problems, total), ([], 2400.0))

    def test_over_the_budget_names_the_largest(self):
        problems, total = budget_problems({"a": (1000.0, []), "b": (1401.0, []),
                                           "c": (5.0, [])})
        self.assertEqual(total, 2406.0)
        self.assertEqual(len(problems), 1)
        self.assertIn("2406 s, over the limit of 2400 s", problems[0])
        self.assertIn("the largest: b 1401 s, a 1000 s, c 5 s", problems[0])

    def test_an_entry_without_a_timeout_is_named(self):
        problems, _ = budget_problems({"a": (None, []), "b": (10.0, [])})
        self.assertEqual(problems, ["a: no TIMEOUT (give it a row in tests/budget.txt)"])

    def test_quick_only_entries_are_not_counted(self):
        problems, total = budget_problems({"a": (2400.0, []), "q": (600.0, ["quick-only"])})
        self.assertEqual((problems, total), ([], 2400.0))

    def test_the_ceiling_holds_until_the_budget_is_met_then_must_go(self):
        over = {"a": (3000.0, [])}
        self.assertEqual(budget_problems(over, 3000)[0], [])
        self.assertIn("over the limit of 2999 s", budget_problems(over, 2999)[0][0])
        within = {"a": (2000.0, [])}
        self.assertIn("take the ceiling of 3000 s out", budget_problems(within, 3000)[0][0])


if __name__ == "__main__":
    unittest.main(verbosity=2)
