// LinePump on real pipes: a burst of lines arrives whole and in order (several per write, none
// split), a line longer than PIPE_BUF goes alone, a last line without a newline is kept, the
// tail holds the last lines, and the file and the prefixed console both get everything; a
// stalled console holds back the worker, never the event loop.
#include "agent/output/line_pump.h"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "base/fd_writer.h"

namespace {

using crun::agent::LinePump;
using crun::agent::PumpTargets;

std::string ReadAll(int fd) {
  std::string out;
  char buf[65536];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

}  // namespace

TEST_CASE("a line pump carries a burst whole, in order, and its last unterminated line") {
  int worker[2], console[2];
  REQUIRE(::pipe2(worker, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(console, O_CLOEXEC) == 0);
  boost::asio::io_context io;
  PumpTargets t;
  t.console_fd = console[1];
  t.prefix = "[r0]:";
  t.tail_lines = 3;
  bool eof = false;
  LinePump pump(io, worker[0], t, [&] { eof = true; });
  std::string expected;
  // The writer: 20,000 short lines as fast as it can, one long line, a last one unended.
  std::thread writer([&, fd = worker[1]] {
    std::string all;
    for (int i = 0; i < 20000; ++i) all += "step " + std::to_string(i) + "\n";
    all += std::string(3 * PIPE_BUF, 'x') + "\n";
    all += "the end";
    for (std::size_t off = 0; off < all.size();) {
      const auto n = ::write(fd, all.data() + off, std::min<std::size_t>(64, all.size() - off));
      if (n <= 0) break;  // (no Catch assertion off the test's thread: the output check fails)
      off += static_cast<std::size_t>(n);
    }
    ::close(fd);
  });
  std::string got;
  std::thread reader([&] { got = ReadAll(console[0]); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!eof && std::chrono::steady_clock::now() < deadline)
    io.run_one_for(std::chrono::milliseconds(50));
  writer.join();
  REQUIRE(eof);
  ::close(console[1]);
  reader.join();
  ::close(console[0]);
  for (int i = 0; i < 20000; ++i) expected += "[r0]:step " + std::to_string(i) + "\n";
  expected += "[r0]:" + std::string(3 * PIPE_BUF, 'x') + "\n";
  expected += "[r0]:the end\n";
  CHECK(got == expected);
  REQUIRE(pump.tail().size() == 3);
  CHECK(pump.tail().back() == "the end");
  CHECK(pump.tail().front() == "step 19999");
}

// The console's reader stalls (a paused pager, a stuck log shipper): the pump holds its lines
// and stops reading, so the worker blocks on its full pipe while the event loop goes on (a
// timer keeps firing); once the reader drains, every line arrives, in order.
TEST_CASE("a stalled console holds back the worker, never the event loop, and loses nothing") {
  int worker[2], console[2];
  REQUIRE(::pipe2(worker, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(console, O_CLOEXEC) == 0);
  boost::asio::io_context io;
  std::string expected;
  std::atomic<bool> writer_done{false};
  {
    crun::FdWriter out(console[1], 64 * 1024);
    PumpTargets t;
    t.console_writer = &out;
    t.prefix = "[r1]:";
    bool eof = false;
    LinePump pump(io, worker[0], t, [&] { eof = true; });
    // 4 MiB of lines: far more than the worker's pipe, the writer's queue and the console pipe
    // hold together.
    std::string all;
    for (int i = 0; all.size() < (4u << 20); ++i) {
      const std::string line = "step " + std::to_string(i) + " " + std::string(100, 'y');
      all += line + "\n";
      expected += "[r1]:" + line + "\n";
    }
    std::thread writer([&, fd = worker[1]] {
      for (std::size_t off = 0; off < all.size();) {
        const auto n = ::write(fd, all.data() + off, all.size() - off);
        if (n <= 0) break;
        off += static_cast<std::size_t>(n);
      }
      ::close(fd);
      writer_done = true;
    });
    // The loop's own work: a timer that re-arms itself. It must keep firing while the console
    // is stalled.
    int ticks = 0;
    boost::asio::steady_timer timer(io);
    std::function<void()> tick = [&] {
      timer.expires_after(std::chrono::milliseconds(1));
      timer.async_wait([&](const boost::system::error_code& ec) {
        if (!ec) ++ticks, tick();
      });
    };
    tick();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (out.queued() < 64 * 1024 && std::chrono::steady_clock::now() < deadline)
      io.run_one_for(std::chrono::milliseconds(50));
    REQUIRE(out.queued() >= 64 * 1024);  // the writer is full: the console stalled
    const int before = ticks;
    while (ticks < before + 50 && std::chrono::steady_clock::now() < deadline)
      io.run_one_for(std::chrono::milliseconds(50));
    CHECK(ticks >= before + 50);      // the loop went on
    CHECK_FALSE(writer_done.load());  // and the worker waits on its pipe
    // The reader comes back: everything drains, the worker finishes, nothing is lost.
    std::string got;
    std::thread reader([&] { got = ReadAll(console[0]); });
    while (!eof && std::chrono::steady_clock::now() < deadline)
      io.run_one_for(std::chrono::milliseconds(50));
    timer.cancel();
    writer.join();
    REQUIRE(eof);
    out.Flush();
    ::close(console[1]);
    reader.join();
    CHECK(got.size() == expected.size());
    CHECK(got == expected);
  }
  ::close(console[0]);
}
