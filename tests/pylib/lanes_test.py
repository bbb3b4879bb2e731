"""tests/pylib/lanes.py: tests of a class run `lanes` at a time, set up once, the classes side by
side in the same lanes, an alone() test first with none beside it, and a failure, an error, a
skip or a failed setUpClass reach the exit status and the output as unittest's do."""
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


def run_suite(body, lanes, *args):
    """Runs a generated test module under lanes.main(lanes): (exit status, its output)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "suite.py")
        with open(path, "w") as f:
            f.write(f"import sys, threading, unittest\nsys.path.insert(0, {HERE!r})\n"
                    "import lanes\n" + textwrap.dedent(body) +
                    f"\nif __name__ == '__main__':\n    lanes.main({lanes})\n")
        r = subprocess.run([sys.executable, path, *args], capture_output=True, text=True,
                           timeout=60)
        return r.returncode, r.stdout + r.stderr


class Lanes(unittest.TestCase):
    def test_three_lanes_run_three_tests_at_once_after_one_class_setup(self):
        # Each test waits at a barrier of three: one after another, none would pass it.
        rc, out = run_suite("""
            class T(unittest.TestCase):
                setups = []
                @classmethod
                def setUpClass(cls):
                    cls.setups.append(1)
                    cls.barrier = threading.Barrier(3, timeout=10)
                @classmethod
                def tearDownClass(cls):
                    print("setups", len(cls.setups), file=sys.stderr)
                def test_a(self): self.barrier.wait()
                def test_b(self): self.barrier.wait()
                def test_c(self): self.barrier.wait()
            """, 3)
        self.assertEqual(rc, 0, out)
        self.assertIn("setups 1", out)
        self.assertRegex(out, r"test_a \(T\) \.\.\. ok \(\d+\.\d s\)")
        self.assertIn("Ran 3 tests", out)
        self.assertIn("3 at a time", out)

    def test_the_classes_share_the_lanes_each_set_up_around_its_own_tests(self):
        # A test of each class waits at a barrier of two: class after class, neither would pass
        # it. Each class is up from before its first test to after its last.
        rc, out = run_suite("""
            barrier = threading.Barrier(2, timeout=10)
            class Up(unittest.TestCase):
                up = False
                @classmethod
                def setUpClass(cls): cls.up = True
                @classmethod
                def tearDownClass(cls): cls.up = False
                def meet(self):
                    self.assertTrue(self.up)
                    barrier.wait()
                    self.assertTrue(self.up)
            class A(Up):
                def test_a(self): self.meet()
            class B(Up):
                def test_b(self): self.meet()
            """, 2)
        self.assertEqual(rc, 0, out)
        self.assertIn("Ran 2 tests", out)

    def test_an_alone_test_runs_first_with_none_beside_it(self):
        # a and c meet at a barrier of two (they run beside each other); b, marked alone, would
        # see one of them start within the second it watches if they ran beside it.
        rc, out = run_suite("""
            class T(unittest.TestCase):
                cond = threading.Condition()
                others = 0
                barrier = threading.Barrier(2, timeout=10)
                def beside(self):
                    with self.cond:
                        T.others += 1
                        self.cond.notify_all()
                    try:
                        self.barrier.wait()
                    finally:
                        with self.cond:
                            T.others -= 1
                def test_a(self): self.beside()
                @lanes.alone
                def test_b(self):
                    with self.cond:
                        self.assertFalse(self.cond.wait_for(lambda: T.others, timeout=1))
                def test_c(self): self.beside()
            """, 3)
        self.assertEqual(rc, 0, out)
        self.assertIn("Ran 3 tests", out)
        self.assertLess(out.index("test_b (T) ... ok"), out.index("test_a (T) ... ok"))

    def test_a_class_of_its_own_lane_runs_its_tests_one_at_a_time_beside_the_lanes(self):
        # One shared lane: Mine's first test meets the other class's at a barrier of two (so
        # it runs beside it, not in the shared lane), and Mine's tests never run at once.
        rc, out = run_suite("""
            barrier = threading.Barrier(2, timeout=10)
            class Mine(unittest.TestCase):
                own_lane = True
                running = []
                def alone(self, then):
                    self.running.append(1)
                    try:
                        self.assertEqual(len(self.running), 1)
                        then()
                    finally:
                        self.running.pop()
                def test_a(self): self.alone(barrier.wait)
                def test_b(self): self.alone(lambda: None)
            class Other(unittest.TestCase):
                def test_c(self): barrier.wait()
            """, 1)
        self.assertEqual(rc, 0, out)
        self.assertIn("Ran 3 tests", out)

    def test_one_lane_runs_them_one_after_another(self):
        rc, out = run_suite("""
            class T(unittest.TestCase):
                running = []
                def check(self):
                    self.running.append(1)
                    self.assertEqual(len(self.running), 1)
                    self.running.pop()
                def test_a(self): self.check()
                def test_b(self): self.check()
            """, 1)
        self.assertEqual(rc, 0, out)

    def test_failures_errors_and_skips_are_reported_and_fail_the_run(self):
        rc, out = run_suite("""
            class T(unittest.TestCase):
                def test_fails(self): self.assertEqual(1, 2, "one is not two")
                def test_errs(self): raise RuntimeError("broken on purpose")
                @unittest.skip("not here")
                def test_skipped(self): pass
                def test_passes(self): pass
                def test_sub(self):
                    for i in range(2):
                        with self.subTest(i=i):
                            self.assertEqual(i, 0)
            """, 2)
        self.assertEqual(rc, 1, out)
        self.assertIn("test_fails (T) ... FAIL", out)
        self.assertIn("test_errs (T) ... ERROR", out)
        self.assertIn("test_skipped (T) ... skipped 'not here'", out)
        self.assertIn("test_passes (T) ... ok", out)
        self.assertIn("one is not two", out)
        self.assertIn("RuntimeError: broken on purpose", out)
        self.assertIn("(i=1)", out)
        self.assertIn("FAILED (failures=2, errors=1)", out)

    def test_a_failed_class_setup_fails_the_run_and_runs_no_test(self):
        rc, out = run_suite("""
            class T(unittest.TestCase):
                @classmethod
                def setUpClass(cls): raise RuntimeError("no cluster")
                def test_a(self): print("ran", file=sys.stderr)
            """, 2)
        self.assertEqual(rc, 1, out)
        self.assertIn("RuntimeError: no cluster", out)
        self.assertNotIn("ran", out.replace("Ran ", ""))

    def test_a_skipped_class_is_not_set_up_and_an_unexpected_success_fails(self):
        rc, out = run_suite("""
            @unittest.skip("no cluster here")
            class Skipped(unittest.TestCase):
                @classmethod
                def setUpClass(cls): raise RuntimeError("set up anyway")
                def test_a(self): pass
            class T(unittest.TestCase):
                @unittest.expectedFailure
                def test_passes_unexpectedly(self): pass
            """, 2)
        self.assertEqual(rc, 1, out)
        self.assertIn("Skipped: skipped 'no cluster here'", out)
        self.assertNotIn("set up anyway", out)
        self.assertIn("test_passes_unexpectedly (T) ... unexpected success", out)

    def test_k_selects_and_nothing_selected_is_an_error(self):
        body = """
            class T(unittest.TestCase):
                def test_alpha(self): pass
                def test_beta(self): pass
            """
        rc, out = run_suite(body, 2, "-k", "alpha")
        self.assertEqual(rc, 0, out)
        self.assertIn("Ran 1 tests", out)
        rc, out = run_suite(body, 2, "-k", "gamma")
        self.assertEqual(rc, 5, out)


if __name__ == "__main__":
    unittest.main()
