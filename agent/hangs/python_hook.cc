#include "agent/hangs/python_hook.h"

#include <signal.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <string>

#include "base/text.h"

namespace crun::agent {
StackSignals HookSignals() { return {SIGRTMIN + 8, SIGRTMIN + 9}; }

bool Catches(pid_t pid, int signo) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("SigCgt:")) continue;
    const std::string hex(Trim(std::string_view(line).substr(7)));
    errno = 0;
    const unsigned long long mask = std::strtoull(hex.c_str(), nullptr, 16);
    return errno == 0 && signo >= 1 && signo <= 64 && ((mask >> (signo - 1)) & 1ULL) != 0;
  }
  return false;
}

const char* PythonHookSource() {
  return R"PY(# Written by crun (docs/hangs.md): lets crun read this worker's Python stacks while it
# runs: on one signal, at the main thread's next safe point (a Python-level handler, where
# every frame is consistent), on another at once from the signal handler (for a main thread
# blocked in C code), faulthandler writes every thread's stack to a pipe crun reads. It takes
# its own directory off sys.path and PYTHONPATH again, so that the program sees both as they
# were, and runs the sitecustomize module this one shadows, if there is one.


def _crun_register_stack_hook():
    import os
    fd = os.environ.pop("CRUN_STACKS_FD", None)
    safe = os.environ.pop("CRUN_STACKS_SAFE_SIGNAL", None)
    at_once = os.environ.pop("CRUN_STACKS_SIGNAL", None)
    if fd is None or safe is None or at_once is None:
        return
    try:
        import faulthandler
        import signal
        fd = int(fd)
        os.fstat(fd)

        def _crun_dump_stacks(signum, frame):
            try:
                os.write(fd, b"crun-stacks-begin\n")
                faulthandler.dump_traceback(file=fd, all_threads=True)
                os.write(fd, b"crun-stacks-end\n")
            except OSError:
                pass

        signal.signal(int(safe), _crun_dump_stacks)
        faulthandler.register(int(at_once), file=fd, all_threads=True)
    except (OSError, ValueError, RuntimeError):
        pass


def _crun_leave_path():
    import os
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    # crun put this directory first on PYTHONPATH; the rest is what the user had.
    parts = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if parts and os.path.abspath(parts[0] or os.curdir) == here:
        if len(parts) == 1:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = os.pathsep.join(parts[1:])
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]


def _crun_run_shadowed_sitecustomize():
    import importlib
    import sys
    this = sys.modules.pop("sitecustomize", None)
    try:
        importlib.import_module("sitecustomize")
    except ModuleNotFoundError as e:
        if e.name != "sitecustomize":
            raise
        if this is not None:
            sys.modules["sitecustomize"] = this


# Imported as sitecustomize at a worker's start; a warm worker runs the first two itself
# (agent/warm/template.py), with the environment crun gave it.
if __name__ == "sitecustomize":
    _crun_register_stack_hook()
    _crun_leave_path()
    _crun_run_shadowed_sitecustomize()
)PY";
}

}  // namespace crun::agent
