// How a process ended: an exit code or a signal. What an ExitWatcher reports, what the lifecycle
// decides on and what a failure report records (agent/failures/report_format.h: ExitOf).
#pragma once

#include <string>

#include "base/signals.h"  // SignalName, ParseSignal, DescribeExit

namespace crun::agent {

struct ExitStatus {
  bool signaled = false;
  int value = 0;  // exit code, or signal number when signaled

  bool success() const { return !signaled && value == 0; }
  // The shell's convention: the exit code, or 128 + signal.
  int ShellCode() const { return signaled ? 128 + value : value; }
  // "exit code 3", "signal 9 (SIGKILL)" (DescribeExit)
  std::string Describe() const;
};

}  // namespace crun::agent
