"""unittest's command line, with the tests of each class run `lanes` at a time.

For suites whose cases wait on processes, sockets and timeouts rather than compute (the
configuration matrix: each case a real job of shell workers), several cases at once take a
fraction of the time one after another does, and the machine still has room. Each test runs
in a thread of its own with the class set up once around them (setUpClass, tearDownClass and
class cleanups, as unittest does); a test's own setUp, tearDown and cleanups are its own. The
tests must not share mutable state beyond what they lock, and must not take ports from
anything but crun_testing.free_port() (which never hands out one port twice in a process).

Each test's line comes when it ends, with its time ("... ok (12.3 s)"), so the output also
says where a suite's time goes; failures and errors follow in full, as unittest prints them.
Exit status: 0 when every test passed or was skipped, 1 otherwise, 5 when none was selected."""
import concurrent.futures
import sys
import threading
import time
import traceback
import unittest


def _flatten(suite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from _flatten(item)
        else:
            yield item


class _Lanes:
    def __init__(self, lanes, stream):
        self.lanes = lanes
        self.stream = stream
        self.lock = threading.Lock()

    def say(self, text):
        with self.lock:
            self.stream.write(text + "\n")
            self.stream.flush()

    def run_test(self, test):
        result = unittest.TestResult()
        t0 = time.monotonic()
        test.run(result)
        took = time.monotonic() - t0
        if result.errors or result.failures:
            verdict = "ERROR" if result.errors else "FAIL"
        elif result.unexpectedSuccesses:
            verdict = "unexpected success"
        elif result.skipped:
            verdict = f"skipped {result.skipped[0][1]!r}"
        else:
            verdict = "ok"
        self.say(f"{test.id().rsplit('.', 2)[-1]} ({type(test).__name__}) ... {verdict} "
                 f"({took:.1f} s)")
        return result

    def run_class(self, cls, tests, total):
        if getattr(cls, "__unittest_skip__", False):  # as unittest: no class setup at all
            why = getattr(cls, "__unittest_skip_why__", "")
            self.say(f"{cls.__name__}: skipped {why!r}")
            total.skipped += [(t, why) for t in tests]
            return
        try:
            cls.setUpClass()
        except unittest.SkipTest as e:
            self.say(f"{cls.__name__}: skipped {str(e)!r}")
            total.skipped += [(t, str(e)) for t in tests]
            return
        except Exception:  # noqa: BLE001 (reported as unittest reports it)
            total.errors.append((tests[0], traceback.format_exc()))
            self.say(f"setUpClass ({cls.__name__}) ... ERROR")
            cls.doClassCleanups()
            total.errors += [(tests[0], traceback.format_exception(*e)) for e in
                             getattr(cls, "tearDown_exceptions", [])]
            return
        try:
            with concurrent.futures.ThreadPoolExecutor(self.lanes) as pool:
                for r in pool.map(self.run_test, tests):
                    total.testsRun += r.testsRun
                    for kind in ("errors", "failures", "skipped", "expectedFailures",
                                 "unexpectedSuccesses"):
                        getattr(total, kind).extend(getattr(r, kind))
        finally:
            try:
                cls.tearDownClass()
            except Exception:  # noqa: BLE001
                total.errors.append((tests[0], traceback.format_exc()))
            cls.doClassCleanups()
            total.errors += [(tests[0], traceback.format_exception(*e)) for e in
                             getattr(cls, "tearDown_exceptions", [])]

    def run(self, suite):
        total = unittest.TestResult()
        t0 = time.monotonic()
        classes = {}
        for test in _flatten(suite):
            classes.setdefault(type(test), []).append(test)
        for cls, tests in classes.items():
            self.run_class(cls, tests, total)
        for kind, items in (("ERROR", total.errors), ("FAIL", total.failures)):
            for test, text in items:
                text = text if isinstance(text, str) else "".join(text)
                self.say("=" * 70 + f"\n{kind}: {test.id()}\n" + "-" * 70 + f"\n{text}")
        bad = len(total.errors) + len(total.failures)
        self.say("-" * 70 + f"\nRan {total.testsRun} tests in {time.monotonic() - t0:.3f}s, "
                 f"{self.lanes} at a time\n\n" +
                 (f"FAILED (failures={len(total.failures)}, errors={len(total.errors)})"
                  if bad else "OK" + (f" (skipped={len(total.skipped)})"
                                      if total.skipped else "")))
        return total


def main(lanes):
    """unittest.main() for the calling module (its argv: -k, test names), `lanes` at a time."""
    runner = _Lanes(max(1, lanes), sys.stderr)

    class Runner:
        def run(self, test):
            return runner.run(test)

    prog = unittest.main(module="__main__", testRunner=Runner(), exit=False)
    result = prog.result
    if not result.wasSuccessful():
        sys.exit(1)
    sys.exit(5 if result.testsRun == 0 and not result.skipped else 0)
