// /proc: the state letter of real processes (running, stopped, a zombie) and of stat lines
// whose command names hold spaces and parentheses.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "base/proc.h"
#include "tests/unit/silent_listener.h"

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

TEST_CASE("start-up pages: read-only private file mappings without a private copy", "[proc]") {
  const char* smaps =
      "00400000-00406000 r--p 00000000 fe:00 53 /opt/crun/bin/crun\n"
      "Size:                 24 kB\n"
      "Rss:                  24 kB\n"
      "Anonymous:             0 kB\n"
      "VmFlags: rd mr mw me\n"
      "00406000-01071000 r-xp 00006000 fe:00 53 /opt/crun/bin/crun\n"
      "Rss:                2800 kB\n"
      "Private_Dirty:      2800 kB\n"  // a binary just written: dirty in the page cache
      "Anonymous:             0 kB\n"
      "VmFlags: rd ex mr mw me\n"
      "014bb000-01555000 r--p 010ba000 fe:00 53 /opt/crun/bin/crun\n"
      "Rss:                 212 kB\n"
      "Anonymous:             4 kB\n"  // relocated read-only data: never given back
      "01555000-01564000 rw-p 01154000 fe:00 53 /opt/crun/bin/crun\n"
      "Rss:                  60 kB\n"
      "Anonymous:            28 kB\n"
      "7f00000-7f01000 r-xp 00000000 00:00 0 [vdso]\n"
      "Rss:                   4 kB\n"
      "Anonymous:             0 kB\n"
      "7f10000-7f20000 r--p 00000000 fe:00 7 /usr/lib/locale/C.utf8/LC_CTYPE\n"
      "Rss:                   0 kB\n"
      "Anonymous:             0 kB\n"
      "7f30000-7f40000 r-xp 00000000 fe:00 8 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
      "Rss:                  64 kB\n"
      "Anonymous:             0 kB\n"
      "VmFlags: rd ex mr mw me lo\n"  // locked: left alone
      "7f50000-7f60000 rw-s 00000000 00:01 9 /dev/shm/x\n"
      "Rss:                  64 kB\n"
      "Anonymous:             0 kB\n";
  const auto m = crun::ReleasableMappings(smaps);
  REQUIRE(m.size() == 2);
  CHECK(m[0].start == 0x400000);
  CHECK(m[0].end == 0x406000);
  CHECK(m[0].rss_kib == 24);
  CHECK(m[1].start == 0x406000);
  CHECK(m[1].end == 0x1071000);
  CHECK(m[1].rss_kib == 2800);
  CHECK(crun::ReleasableMappings("").empty());
  CHECK(crun::ReleasableMappings("garbage\nRss: 4 kB\n").empty());
}

TEST_CASE("start-up pages: given back, and the process runs on", "[proc]") {
  const std::size_t released = crun::ReleaseStartupPages();
  CHECK(released > 0);  // this test binary's own code, at least
  // Code and constants come back from the page cache as they are used again.
  CHECK(crun::StateFromStat("1 (a) R 0") == 'R');
  CHECK(crun::ProcessState(::getpid()) == 'R');
}

TEST_CASE("port holders: the socket inodes of a port from /proc/net/tcp text", "[proc]") {
  const char* text =
      "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
      "timeout inode\n"
      "   0: 0100007F:5113 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0   "
      "     0 4711 1 0000000000000000 100 0 0 10 0\n"
      "   1: 0100007F:D3A2 0100007F:5113 01 00000000:00000000 00:00000000 00000000     0   "
      "     0 4712 1 0000000000000000 20 4 30 10 -1\n"
      "   2: 00000000:5113 00000000:0000 07 00000000:00000000 00:00000000 00000000     0   "
      "     0 0 1\n"
      "   3: garbage\n";
  CHECK(crun::SocketInodesOnPort(text, 0x5113) == std::vector<std::uint64_t>{4711});
  CHECK(crun::SocketInodesOnPort(text, 0xD3A2) == std::vector<std::uint64_t>{4712});
  CHECK(crun::SocketInodesOnPort(text, 80).empty());
  CHECK(crun::SocketInodesOnPort("", 80).empty());
}

TEST_CASE("port holders: this process, named, on the port it listens on", "[proc]") {
  crun::testing::SilentListener listener;
  const auto port = listener.port();
  const std::string holders = crun::TcpPortHolders(port);
  CHECK(holders.find("pid " + std::to_string(::getpid()) + " (") != std::string::npos);
  listener.Close();
  CHECK(crun::TcpPortHolders(port).empty());
}
