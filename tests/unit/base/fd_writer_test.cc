// FdWriter on real pipes whose reader stalls: callers are never blocked, TryWrite refuses once
// the queue is full, Write never does, WhenRoom fires once the reader drains, every line comes
// out once and in order, and a reader that is gone discards rather than blocks.
#include "base/fd_writer.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "tests/unit/test_util.h"

namespace {

using crun::FdWriter;

std::string ReadAll(int fd) {
  std::string out;
  char buf[65536];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

}  // namespace

TEST_CASE("a stalled reader fills the writer's queue, never its callers") {
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  std::string expected;
  std::atomic<bool> room{false};
  {
    FdWriter w(p[1], 64 * 1024);
    // Nobody reads: the pipe (64 KiB) and then the queue fill, and TryWrite says so at once.
    int accepted = 0;
    for (int i = 0; i < 100000; ++i) {
      const std::string line = "line " + std::to_string(i) + "\n";
      if (!w.TryWrite(line)) break;
      expected += line;
      ++accepted;
    }
    REQUIRE(accepted < 100000);
    CHECK(w.queued() >= 64 * 1024);
    // What must not be lost is queued whatever waits.
    w.Write("the failure report\n");
    expected += "the failure report\n";
    w.WhenRoom([&] { room = true; });
    CHECK_FALSE(room.load());
    std::string got;
    std::thread reader([&] { got = ReadAll(p[0]); });
    REQUIRE(crun::testing::Eventually([&] { return room.load(); }));
    w.Flush();
    CHECK(w.queued() == 0);
    ::close(p[1]);  // (the writer does not own it)
    reader.join();
    CHECK(got == expected);
  }
  ::close(p[0]);
}

TEST_CASE("a reader that is gone: lines are discarded, Flush and WhenRoom do not wait") {
  ::signal(SIGPIPE, SIG_IGN);  // as crun does: EPIPE rather than death
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  ::close(p[0]);
  FdWriter w(p[1], 1024);
  for (int i = 0; i < 1000; ++i) w.Write("into nowhere\n");
  w.Flush();
  CHECK(w.queued() == 0);
  bool room = false;
  w.WhenRoom([&] { room = true; });
  CHECK(room);
  CHECK(w.TryWrite("still accepted, and dropped\n"));
  w.Flush();
  ::close(p[1]);
}
