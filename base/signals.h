// Signals by name and an ended process in words: the one spelling every message, report and
// option of crun uses ("SIGKILL", "signal 9 (SIGKILL)", "exit code 3"). The names are glibc's
// (sigabbrev_np).
#pragma once

#include <string>

namespace crun {

// "SIGKILL" for 9, "signal 77" for a number glibc has no name for.
std::string SignalName(int signo);
// Parses "SIGTERM", "TERM" or "15"; -1 when it is none.
int ParseSignal(const std::string& name);
// How a process ended: "exit code 3", or "signal 9 (SIGKILL)" when `signaled` (value is then
// the signal's number).
std::string DescribeExit(bool signaled, int value);

}  // namespace crun
