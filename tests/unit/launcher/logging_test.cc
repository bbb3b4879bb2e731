// crun's log over a stderr whose reader stalls (launcher/logging.h): logging never blocks,
// warnings and lesser lines are dropped and counted while the writer is full and the count is
// said once the reader catches up, errors are never dropped, and every line is either
// delivered or counted. fd 2 is a pipe of the test's for the duration.
#include "launcher/logging.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <regex>
#include <string>
#include <thread>

#include "base/fd_writer.h"
#include "tests/unit/test_util.h"

TEST_CASE("crun's log never blocks on a stalled stderr, and says what it dropped") {
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  const int saved = ::dup(STDERR_FILENO);
  REQUIRE(saved >= 0);
  REQUIRE(::dup2(p[1], STDERR_FILENO) == STDERR_FILENO);
  crun::launcher::SetUpLogging("test", "info");
  constexpr int kLines = 40000;  // about 4 MB: far more than the pipe and the writer hold
  std::atomic<bool> logged{false};
  std::thread logger([&] {
    for (int i = 0; i < kLines; ++i) {
      spdlog::info("line {:06d} {}", i, std::string(60, 'z'));
      if (i == kLines / 2) spdlog::error("an error that must arrive");
    }
    logged = true;
  });
  // Nobody reads: the logging thread must finish all the same.
  const bool finished = crun::testing::Eventually([&] { return logged.load(); });
  std::string got;
  std::thread reader([&] {
    char buf[65536];
    for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;) got.append(buf, std::size_t(n));
  });
  logger.join();
  REQUIRE(crun::testing::Eventually([] { return crun::FdWriter::Stderr().queued() == 0; }));
  spdlog::info("after the reader came back");
  crun::launcher::FlushOutput();
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  ::close(p[1]);
  reader.join();
  ::close(p[0]);
  CHECK(finished);
  CHECK(got.find("an error that must arrive") != std::string::npos);
  CHECK(got.find("after the reader came back") != std::string::npos);
  // Said once per stall the reader caught up from: their sum is every line dropped.
  const std::regex note(R"(crun: ([0-9,]+) log lines? dropped while stderr was blocked)");
  int dropped = 0;
  for (auto it = std::sregex_iterator(got.begin(), got.end(), note); it != std::sregex_iterator();
       ++it) {
    std::string digits = (*it)[1];
    digits.erase(std::remove(digits.begin(), digits.end(), ','), digits.end());
    dropped += std::stoi(digits);
  }
  int delivered = 0;
  for (auto at = got.find(" line "); at != std::string::npos; at = got.find(" line ", at + 1)) {
    ++delivered;
  }
  CHECK(dropped > 0);
  CHECK(delivered + dropped == kLines);
}
