"""The warm-start witness (tests/run_warm.py puts this directory on PYTHONPATH): it tells, for
every worker crun starts, whether the worker was forked from crun's warm template or started
cold, by appending one whole line to the ledger that CRUN_TEST_WARM_LEDGER names:

  cold <pid> <argv>   a worker's interpreter started (crun's hook runs this module, which it
                      shadows, at every interpreter start)
  warm <pid> <argv>   a worker forked from the template has the worker's environment (an
                      audit hook that the template installed when it ran this module, and
                      that forks carry, sees the worker's first event after that)

A cold worker is an interpreter whose environment has CRUN_ATTEMPT and whose parent is crun; a
warm one is the template's grandchild with that environment. The template's own start,
torchrun's workers and the workers' children are not counted."""
import os
import sys

_LEDGER = os.environ.get("CRUN_TEST_WARM_LEDGER", "")


def _parent_is_crun():
    try:
        with open(f"/proc/{os.getppid()}/comm") as f:
            return f.read().strip() == "crun"
    except OSError:
        return False


def _note(kind):
    line = f"{kind} {os.getpid()} {' '.join(sys.argv)}\n".encode()
    fd = os.open(_LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one write of a whole line: readers never see half of one
    finally:
        os.close(fd)


def _watch_forks():
    """In the template: a worker notes itself on its first audit event once it has a worker's
    environment. A worker is the template's grandchild (the template forks M, M forks the
    worker and exits: agent/warm/template.py); what a worker forks in turn is not one."""
    state = {"generation": 0}

    def after_fork():
        state["generation"] += 1

    def audit(event, args):
        if state["generation"] == 2 and "CRUN_ATTEMPT" in os.environ:
            state["generation"] = 3  # noted; what it forks counts on from 4
            _note("warm")

    os.register_at_fork(after_in_child=after_fork)
    sys.addaudithook(audit)


def _run_shadowed():
    """The sitecustomize this one shadows (Debian's, a user's), as crun's hook does for it."""
    import importlib
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.path[:]
    this = sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        importlib.import_module("sitecustomize")
    except ModuleNotFoundError as e:
        if e.name != "sitecustomize":
            raise
        if this is not None:
            sys.modules["sitecustomize"] = this
    finally:
        sys.path[:] = saved


if _LEDGER and __name__ == "sitecustomize":
    if "CRUN_WARM_FD" in os.environ:
        _watch_forks()
    elif "CRUN_ATTEMPT" in os.environ and _parent_is_crun():
        _note("cold")
    _run_shadowed()
