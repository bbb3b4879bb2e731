// Signal names and ended processes in words (base/signals.h): the spelling of every report.
#include <catch2/catch.hpp>

#include <signal.h>

#include "base/signals.h"

TEST_CASE("a signal is named as the shell names it, and read back", "[signals]") {
  struct Row {
    int signo;
    const char* name;
  };
  for (const Row& r : {Row{SIGHUP, "SIGHUP"}, Row{SIGINT, "SIGINT"}, Row{SIGABRT, "SIGABRT"},
                       Row{SIGKILL, "SIGKILL"}, Row{SIGSEGV, "SIGSEGV"}, Row{SIGTERM, "SIGTERM"},
                       Row{SIGUSR1, "SIGUSR1"}, Row{SIGXCPU, "SIGXCPU"}, Row{SIGSYS, "SIGSYS"}}) {
    INFO(r.name);
    CHECK(crun::SignalName(r.signo) == r.name);
    CHECK(crun::ParseSignal(r.name) == r.signo);
    CHECK(crun::ParseSignal(r.name + 3) == r.signo);  // "TERM"
    CHECK(crun::ParseSignal(std::to_string(r.signo)) == r.signo);
  }
  // Every signal glibc names reads back as itself.
  for (int signo = 1; signo < SIGRTMIN; ++signo) {
    INFO(signo);
    const std::string name = crun::SignalName(signo);
    if (name.rfind("SIG", 0) == 0) CHECK(crun::ParseSignal(name) == signo);
  }
  CHECK(crun::SignalName(0) == "signal 0");
  CHECK(crun::SignalName(SIGRTMIN + 1) == "signal " + std::to_string(SIGRTMIN + 1));
  CHECK(crun::SignalName(-3) == "signal -3");
  for (const char* bad :
       {"", "SIG", "SIGNOPE", "term", "0", "65", "999999999999999999999", "-9", " 9", "SIGTERM "}) {
    INFO(bad);
    CHECK(crun::ParseSignal(bad) == -1);
  }
}

TEST_CASE("an ended process is said as an exit code or a named signal", "[signals]") {
  CHECK(crun::DescribeExit(false, 0) == "exit code 0");
  CHECK(crun::DescribeExit(false, 3) == "exit code 3");
  CHECK(crun::DescribeExit(true, SIGKILL) == "signal 9 (SIGKILL)");
  CHECK(crun::DescribeExit(true, SIGTERM) == "signal 15 (SIGTERM)");
  CHECK(crun::DescribeExit(true, 77) == "signal 77 (signal 77)");
}
