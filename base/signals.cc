#include "base/signals.h"

#include <signal.h>
#include <string.h>

#include <algorithm>
#include <cctype>

#include "base/numbers.h"

namespace crun {

std::string SignalName(int signo) {
  const char* abbrev = signo > 0 && signo < NSIG ? ::sigabbrev_np(signo) : nullptr;
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(signo);
}

int ParseSignal(const std::string& text) {
  if (!text.empty() &&
      std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c) != 0; })) {
    const auto n = ParseInteger(text, 1, NSIG - 1);  // digits, but maybe 30 of them
    return n ? static_cast<int>(*n) : -1;
  }
  const std::string bare = text.rfind("SIG", 0) == 0 ? text.substr(3) : text;
  for (int signo = 1; signo < NSIG && !bare.empty(); ++signo) {
    const char* abbrev = ::sigabbrev_np(signo);
    if (abbrev != nullptr && bare == abbrev) return signo;
  }
  return -1;
}

std::string DescribeExit(bool signaled, int value) {
  if (signaled) return "signal " + std::to_string(value) + " (" + SignalName(value) + ")";
  return "exit code " + std::to_string(value);
}

}  // namespace crun
