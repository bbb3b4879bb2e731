// crun::worker::Step (crun/worker/heartbeat.h): what it writes on the heartbeat pipe, read back
// with crun's own parser. Under ctest each case is a process of its own, which matters: the SDK
// reads CRUN_HEARTBEAT_FD once.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/step_records.h"
#include "crun/worker/heartbeat.h"
#include "worker_sdk/src/step_clock.h"

namespace {

TEST_CASE("Step: the first step's number, then each step's record less the time in collectives",
          "[steps]") {
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC | O_NONBLOCK) == 0);
  REQUIRE(::setenv("CRUN_HEARTBEAT_FD", std::to_string(p[1]).c_str(), 1) == 0);
  crun::worker::Step(10);  // starts the clock
  crun::worker::internal::AddCollectiveWait(std::chrono::hours(1));
  crun::worker::Step(11);  // waited longer than it ran: no compute
  crun::worker::Step(12);
  crun::worker::Heartbeat();
  char buf[256];
  const ssize_t n = ::read(p[0], buf, sizeof buf);
  REQUIRE(n > 0);
  crun::HeartbeatParser parser;
  std::vector<crun::StepRecord> records;
  CHECK(parser.Feed(std::string(buf, static_cast<std::size_t>(n)), records) == 4);
  REQUIRE(records.size() == 3);
  CHECK(records[0].step == 10);  // the short form: no compute time measured yet
  CHECK(!records[0].compute_us);
  CHECK(records[1].step == 11);
  CHECK(records[1].compute_us == 0);
  CHECK(records[2].step == 12);
  CHECK(records[2].compute_us >= 0);
  ::close(p[0]);
  ::close(p[1]);
}

}  // namespace
