"""unittest's command line, with the tests of every class run `lanes` at a time.

For suites whose cases wait on processes, sockets and timeouts rather than compute (the
configuration matrix: each case a real job of shell workers), several cases at once take a
fraction of the time one after another does, and the machine still has room. Each test runs
in a thread of its own with its class set up once around its tests (setUpClass, tearDownClass
and class cleanups, as unittest does); a test's own setUp, tearDown and cleanups are its own.
The classes run side by side: each is set up before its first test and torn down after its
last, and a lane takes the next test of whichever class, so that a long test of one class
does not hold back another class's. The tests must not share mutable state beyond what they
lock, and must not take ports from anything but crun_testing.free_port() (which never hands
out one port twice in a process) or a network namespace of their own (tests/pylib/fabric.py).
A class with `own_lane = True` runs its tests one after another in a lane of its own, beside
the shared ones: tests that must never run two at a time (each would slow the other past its
timeouts) still run beside those of the other classes.
A test marked alone() runs with no other test beside it, before the others of its class: one
whose own load would disturb what the others time.

Each test's line comes when it ends, with its time ("... ok (12.3 s)"), so the output also
says where a suite's time goes; failures and errors follow in full, as unittest prints them.
Exit status: 0 when every test passed or was skipped, 1 otherwise, 5 when none was selected."""
import concurrent.futures
import contextlib
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


def _add(total, result):
    """Adds `result`'s counts and lists to `total`'s."""
    total.testsRun += result.testsRun
    for kind in ("errors", "failures", "skipped", "expectedFailures", "unexpectedSuccesses"):
        getattr(total, kind).extend(getattr(result, kind))


def alone(test):
    """Marks a test method to run with no other test beside it (a hundred agents started at
    once would delay the heartbeats and leases that the other tests time)."""
    test.lanes_alone = True
    return test


def _is_alone(test):
    return getattr(getattr(test, test._testMethodName, None), "lanes_alone", False)


class _Turns:
    """Who runs now: any number of tests beside each other, or one alone() test. An alone test
    that waits goes before every test not started yet, so the lanes empty for it. A wait here
    ends when the running tests end, and each of them waits up to deadlines of its own."""
    def __init__(self):
        self.cond = threading.Condition()
        self.beside = 0  # tests running beside each other
        self.alone = False  # an alone() test running
        self.waiting = 0  # alone() tests waiting for the lanes to empty

    @contextlib.contextmanager
    def turn(self, alone):
        with self.cond:
            if alone:
                self.waiting += 1
                self.cond.wait_for(lambda: not self.alone and self.beside == 0)
                self.waiting -= 1
                self.alone = True
            else:
                self.cond.wait_for(lambda: not self.alone and self.waiting == 0)
                self.beside += 1
        try:
            yield
        finally:
            with self.cond:
                if alone:
                    self.alone = False
                else:
                    self.beside -= 1
                self.cond.notify_all()


class _Lanes:
    def __init__(self, lanes, stream):
        self.lanes = lanes
        self.stream = stream
        self.lock = threading.Lock()
        self.turns = _Turns()

    def say(self, text):
        with self.lock:
            self.stream.write(text + "\n")
            self.stream.flush()

    def run_test(self, test):
        result = unittest.TestResult()
        with self.turns.turn(_is_alone(test)):
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

    def run_class(self, cls, tests, pool):
        """Sets `cls` up, runs its tests in `pool` (the lanes, which every class shares) and
        tears it down after its last: their result. Each class runs this in a thread of its
        own, beside the others."""
        total = unittest.TestResult()
        if getattr(cls, "__unittest_skip__", False):  # as unittest: no class setup at all
            why = getattr(cls, "__unittest_skip_why__", "")
            self.say(f"{cls.__name__}: skipped {why!r}")
            total.skipped += [(t, why) for t in tests]
            return total
        try:
            cls.setUpClass()
        except unittest.SkipTest as e:
            self.say(f"{cls.__name__}: skipped {str(e)!r}")
            total.skipped += [(t, str(e)) for t in tests]
            return total
        except Exception:  # noqa: BLE001 (reported as unittest reports it)
            total.errors.append((tests[0], traceback.format_exc()))
            self.say(f"setUpClass ({cls.__name__}) ... ERROR")
            cls.doClassCleanups()
            total.errors += [(tests[0], traceback.format_exception(*e)) for e in
                             getattr(cls, "tearDown_exceptions", [])]
            return total
        try:
            ran = (map(self.run_test, tests) if getattr(cls, "own_lane", False)
                   else pool.map(self.run_test, tests))
            for r in ran:
                _add(total, r)
        finally:
            try:
                cls.tearDownClass()
            except Exception:  # noqa: BLE001
                total.errors.append((tests[0], traceback.format_exc()))
            cls.doClassCleanups()
            total.errors += [(tests[0], traceback.format_exception(*e)) for e in
                             getattr(cls, "tearDown_exceptions", [])]
        return total

    def run(self, suite):
        total = unittest.TestResult()
        t0 = time.monotonic()
        classes = {}
        # A class's alone() tests first: its other tests then run beside each other.
        for test in sorted(_flatten(suite), key=lambda t: not _is_alone(t)):
            classes.setdefault(type(test), []).append(test)
        with concurrent.futures.ThreadPoolExecutor(self.lanes) as pool, \
                concurrent.futures.ThreadPoolExecutor(max(1, len(classes))) as each_class:
            for r in list(each_class.map(lambda cls: self.run_class(cls, classes[cls], pool),
                                         classes)):
                _add(total, r)
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
