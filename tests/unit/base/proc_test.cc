// /proc: the state letter of real processes (running, stopped, a zombie) and of stat lines
// whose command names hold spaces and parentheses.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "base/proc.h"

using crun::ProcessState;
using crun::StateFromStat;

namespace {

// Polls `pid`'s state until it is `want`, for at most 10 s (nothing tells a parent that its
// child went to sleep); returns the last state seen.
std::optional<char> AwaitState(pid_t pid, char want) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::optional<char> s = ProcessState(pid);
  while (s != want && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    s = ProcessState(pid);
  }
  return s;
}

}  // namespace

TEST_CASE("proc: the state field follows the last ')'", "[proc]") {
  CHECK(StateFromStat("42 (python3) S 1 42 42 0") == 'S');
  CHECK(StateFromStat("42 (a b) c) T 1 42") == 'T');
  CHECK(StateFromStat("42 (x) Z") == 'Z');
  for (const char* bad : {"", "42 (x)", "42 (x) ", "42 x S", "42 (x)S 1"}) {
    INFO(bad);
    CHECK_FALSE(StateFromStat(bad).has_value());
  }
}

TEST_CASE("proc: a child seen running, stopped, a zombie, then gone", "[proc]") {
  CHECK(ProcessState(::getpid()) == 'R');
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::pause();
    ::_exit(0);
  }
  CHECK(AwaitState(pid, 'S') == 'S');
  siginfo_t info{};
  ::kill(pid, SIGSTOP);
  REQUIRE(::waitid(P_PID, static_cast<id_t>(pid), &info, WSTOPPED | WNOWAIT) == 0);
  CHECK(ProcessState(pid) == 'T');
  ::kill(pid, SIGKILL);
  REQUIRE(::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT) == 0);
  CHECK(ProcessState(pid) == 'Z');
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK_FALSE(ProcessState(pid).has_value());
}
