// A hang told from the job's step times (--hang-after-steps, agent/hangs/step_pace.h): the
// rule as a table with invented times, and random orders that keep its bounds. HangWatch with
// it, on a real process: hang_test.cc.
#include <catch2/catch.hpp>

#include <chrono>
#include <random>
#include <utility>
#include <vector>

#include "agent/hangs/step_pace.h"

namespace {

using crun::agent::kMinStepsForPace;
using crun::agent::kStepHangFloor;
using crun::agent::StepPace;
using std::chrono::milliseconds;
using Clock = StepPace::Clock;

const Clock::time_point kT0{std::chrono::hours(1)};

}  // namespace

TEST_CASE("step pace: K times the longest step, within the floor and --hang-timeout") {
  StepPace pace(5, milliseconds(10'000));
  Clock::time_point t = kT0;
  // Two ranks step every 100 ms: the bound until 8 steps are timed.
  for (int i = 0; i <= kMinStepsForPace / 2; ++i) {
    INFO("step " << i);
    CHECK(pace.LimitFor(0) == milliseconds(10'000));
    pace.Stepped(0, t);
    pace.Stepped(1, t);
    t += milliseconds(100);
  }
  CHECK(pace.Paced(0));
  CHECK(pace.longest() == milliseconds(100));
  CHECK(pace.LimitFor(0) == kStepHangFloor);        // 5 x 100 ms, under the floor
  CHECK(pace.LimitFor(2) == milliseconds(10'000));  // rank 2 has sent no step

  pace.Stepped(0, t + milliseconds(300));  // one step of 400 ms: the limit widens
  CHECK(pace.longest() == milliseconds(400));
  CHECK(pace.LimitFor(0) == milliseconds(2000));
  CHECK(pace.LimitFor(1) == milliseconds(2000));  // the node's longest, for every rank

  // Rank 1 restarts: the bound until its first step of the new attempt (imports, load); the
  // gap from its last step of the old attempt is no step.
  pace.Started(1);
  CHECK_FALSE(pace.Paced(1));
  CHECK(pace.LimitFor(1) == milliseconds(10'000));
  pace.Stepped(1, t + milliseconds(60'000));
  CHECK(pace.longest() == milliseconds(400));
  CHECK(pace.LimitFor(1) == milliseconds(2000));

  // A hang the pace declared after 1.2 s of silence: a stretch that long is not one again.
  pace.Declared(milliseconds(1200));
  CHECK(pace.longest() == milliseconds(1200));
  CHECK(pace.LimitFor(0) == milliseconds(6000));
  pace.Declared(milliseconds(300));  // shorter: nothing changes
  CHECK(pace.LimitFor(0) == milliseconds(6000));

  // A checkpoint every N steps, timed once as a 2.5 s step: K times it is over the bound.
  pace.Stepped(1, t + milliseconds(62'500));
  CHECK_FALSE(pace.Paced(1));
  CHECK(pace.LimitFor(1) == milliseconds(10'000));
}

TEST_CASE("step pace: off, or a bound under the floor, is the bound alone") {
  for (const auto& [factor, bound] :
       std::vector<std::pair<int, milliseconds>>{{0, milliseconds(10'000)},
                                                 {5, milliseconds(800)},
                                                 {5, kStepHangFloor}}) {
    INFO("factor " << factor << ", bound " << bound.count() << " ms");
    StepPace pace(factor, bound);
    for (int i = 0; i < 3 * kMinStepsForPace; ++i) pace.Stepped(0, kT0 + milliseconds(10 * i));
    CHECK_FALSE(pace.Paced(0));
    CHECK(pace.LimitFor(0) == bound);
  }
}

TEST_CASE(
    "step pace: in any order of steps and restarts, the limit stays within its bounds and "
    "never narrows") {
  std::mt19937 rng(20261208);
  for (int run = 0; run < 200; ++run) {
    const int factor = 1 + static_cast<int>(rng() % 10);
    const milliseconds bound(500 + rng() % 20'000);
    StepPace pace(factor, bound);
    Clock::time_point t = kT0;
    milliseconds widest{0};
    for (int event = 0; event < 300; ++event) {
      const int rank = static_cast<int>(rng() % 4);
      t += milliseconds(rng() % 700);
      if (rng() % 25 == 0) {
        pace.Started(rank);
      } else {
        pace.Stepped(rank, t);
      }
      for (int r = 0; r < 4; ++r) {
        const milliseconds limit = pace.LimitFor(r);
        INFO("run " << run << ", event " << event << ", rank " << r);
        REQUIRE(limit <= bound);
        REQUIRE(limit >= std::min(bound, kStepHangFloor));
        REQUIRE((pace.Paced(r) || limit == bound));
        if (pace.Paced(r)) {
          REQUIRE(limit >= widest);  // the longest step only grows
          widest = limit;
        }
      }
    }
  }
}
