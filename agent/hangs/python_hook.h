// The hook crun installs in every Python worker (a sitecustomize), answering two signals with
// faulthandler's dump of every thread, written to a pipe crun reads (stack_pipe.h).
#pragma once

#include <sys/types.h>

#include <string_view>

namespace crun::agent {

// The two real-time signals the Python hook answers (nothing else of crun's uses them).
// faulthandler's dump from the signal handler reads the interpreter's frames while they may
// be changing (a worker busy in Python code): "best effort", and it has crashed workers that
// were importing torch. The safe one runs faulthandler from a Python-level handler instead,
// where every frame is consistent; the at-once one only when the main thread does not get
// there (blocked in C code, where its frames stand still).
struct StackSignals {
  int safe = 0, at_once = 0;
};
StackSignals HookSignals();
// Whether `pid` catches `signo` (its SigCgt in /proc): the hook is installed.
bool Catches(pid_t pid, int signo);
// The sitecustomize.py crun writes for its Python workers (in a directory put first on
// PYTHONPATH): registers the hook, then runs the sitecustomize it shadows, if any.
const char* PythonHookSource();
// The lines the hook writes around a dump taken at a safe point.
inline constexpr std::string_view kDumpBegin = "crun-stacks-begin\n";
inline constexpr std::string_view kDumpEnd = "crun-stacks-end\n";

}  // namespace crun::agent
