// The goodput ledger of one node (rendezvous/goodput/ledger.h) as a pure function of its
// events: a table of event orders with the categories they must give, and random orders whose
// categories always add up to the wall time.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "rendezvous/goodput/ledger.h"

namespace {

using crun::goodput::Category;
using crun::goodput::Ledger;
using crun::goodput::Ms;
using crun::goodput::NameOf;
using crun::goodput::NodeLedger;

// Category name -> milliseconds, only those above zero.
std::map<std::string, Ms> Named(const crun::goodput::Totals& totals) {
  std::map<std::string, Ms> out;
  for (Category c : crun::goodput::kAllCategories) {
    if (crun::goodput::At(totals, c) > 0)
      out[std::string(NameOf(c))] = crun::goodput::At(totals, c);
  }
  return out;
}
std::map<std::string, Ms> Named(const NodeLedger& l) { return Named(l.totals); }

// A started job of two local ranks, trained through `steps` steps of 1 s from t = 1 s (the
// first progress); returns the time of the last step.
Ms TrainFrom(Ledger& l, Ms t, std::int64_t first, std::int64_t last, Ms step_ms = 1000) {
  for (std::int64_t s = first; s <= last; ++s) {
    t += step_ms;
    l.Progress(t, 0, s);
    l.Progress(t, 1, s);
  }
  return t;
}

Ledger Started() {
  Ledger l = Ledger::Launched("n0", "host-a", 2, 0);
  l.Joining(0);
  l.Assigned(100, false, 0);
  l.WorkersRunning(200);
  return l;
}

TEST_CASE("goodput ledger: a clean job is starting, then training", "[goodput]") {
  Ledger l = Started();
  l.Progress(1000, 0, 1);
  // One rank has not progressed: starting is settled up to the workers' start only.
  CHECK(Named(l.Settled()) == std::map<std::string, Ms>{{"starting", 200}});
  l.Progress(1010, 1, 1);
  TrainFrom(l, 1010, 2, 5);
  l.Finished(5500);
  const NodeLedger n = l.Settled();
  CHECK(Named(n) == std::map<std::string, Ms>{{"starting", 1010}, {"training", 4490}});
  CHECK(n.steps_known);
  CHECK(n.finished);
  // The step rate's points: one a second at most, each where it was taken.
  REQUIRE(n.steps.size() == 5);
  CHECK(n.steps.front() == crun::goodput::StepPoint{1000, 1});
  CHECK(n.steps.back() == crun::goodput::StepPoint{5010, 5});
  CHECK(n.incidents.empty());
  CHECK(n.until == 5500);
}

TEST_CASE("goodput ledger: a crash, its restart, reload and redone steps", "[goodput]") {
  Ledger l = Started();
  Ms t = TrainFrom(l, 0, 1, 10);  // steps 1..10, the last at 10 s; starting 0..1 s
  l.FailureKnown(t + 400, t + 400, "crash", "local rank 1 exited with code 1");
  l.Joining(t + 500);
  l.Assigned(t + 600, false, 0);
  l.WorkersRunning(t + 700);
  // The snapshot held step 8: the workers do 9 and 10 again.
  l.Progress(t + 1700, 0, 9);
  l.Progress(t + 1705, 1, 9);
  l.Progress(t + 2705, 0, 10);
  l.Progress(t + 2705, 1, 10);
  l.Progress(t + 3705, 0, 11);
  l.Progress(t + 3705, 1, 11);
  l.Finished(t + 3705);
  const NodeLedger n = l.Settled();
  CHECK(Named(n) == std::map<std::string, Ms>{{"starting", 1000},
                                              {"training", 9000 + 1000},
                                              {"redone", 400 + 1000},
                                              {"restarting", 300},
                                              {"reloading", 1005}});
  REQUIRE(n.incidents.size() == 1);
  const auto& i = n.incidents[0];
  CHECK(i.kind == "crash");
  CHECK(i.fault == t + 400);
  CHECK(i.step_at_failure == 10);
  CHECK(i.resumed_from == 8);
  CHECK(i.resumed == t + 2705);
  CHECK(Named(i.cost) ==
        std::map<std::string, Ms>{{"redone", 1400}, {"restarting", 300}, {"reloading", 1005}});
}

TEST_CASE("goodput ledger: detecting runs from the fault to the failure known", "[goodput]") {
  struct Row {
    const char* name;
    Ms fault_after_last_step;  // the fault, after the last progress (at 5 s)
    Ms known_after_last_step;
    std::map<std::string, Ms> expected;  // of the incident
  };
  const Row rows[] = {
      // A hang: from the hung rank's last progress.
      {"hang", 0, 10000, {{"detecting", 10000}, {"restarting", 1000}}},
      // A lost peer, its last heartbeat 1 s after the last step, declared 2 s later: the step
      // under way is thrown away.
      {"node lost", 1000, 3000, {{"redone", 1000}, {"detecting", 2000}, {"restarting", 1000}}},
      // A fault said to be before the last progress (another node's clock) counts from it.
      {"peer", -500, 200, {{"detecting", 200}, {"restarting", 1000}}},
      // A fault said to come after it was known is at the time known.
      {"crash", 900, 400, {{"redone", 400}, {"restarting", 1000}}},
  };
  for (const Row& r : rows) {
    INFO(r.name);
    Ledger l = Started();
    const Ms last = TrainFrom(l, 0, 1, 4);
    CHECK(last == 4000);
    const Ms t = TrainFrom(l, last, 5, 5);
    const Ms fault =
        r.name == std::string("hang") ? *l.LastProgress(0) : t + r.fault_after_last_step;
    l.FailureKnown(t + r.known_after_last_step, fault, r.name, "cause");
    l.Joining(t + r.known_after_last_step + 1000);  // the stop and the edge
    l.Finished(t + r.known_after_last_step + 1000);
    const NodeLedger n = l.Settled();
    REQUIRE(n.incidents.size() == 1);
    CHECK(Named(n.incidents[0].cost) == r.expected);
    CHECK(crun::goodput::Sum(n.totals) == n.until - n.launched);
  }
}

TEST_CASE("goodput ledger: waiting for nodes, as a spare, and at the health gate", "[goodput]") {
  SECTION("the rendezvous waited 4 s of 5 for enough nodes") {
    Ledger l = Ledger::Launched("n0", "h", 1, 0);
    l.Joining(0);
    l.Assigned(5000, false, 4000);
    l.Finished(5000);
    CHECK(Named(l.Settled()) == std::map<std::string, Ms>{{"starting", 1000}, {"waiting", 4000}});
  }
  SECTION("a wait said to be longer than the join is the join") {
    Ledger l = Ledger::Launched("n0", "h", 1, 0);
    l.Joining(3000);
    l.Assigned(5000, false, 60000);
    l.Finished(5000);
    CHECK(Named(l.Settled()) == std::map<std::string, Ms>{{"starting", 3000}, {"waiting", 2000}});
  }
  SECTION("a spare waits, holding nothing back, until it is a member") {
    Ledger l = Ledger::Launched("n0", "h", 1, 0);
    l.Joining(0);
    l.Assigned(1000, true, 0);
    l.Assigned(9000, false, 0);
    l.WorkersRunning(9500);
    l.Progress(10000, 0, 7);
    l.Finished(11000);
    const NodeLedger n = l.Settled();
    CHECK(Named(n) == std::map<std::string, Ms>{{"starting", 1000 + 1000},
                                                {"waiting", 8000},
                                                {"training", 1000}});
    REQUIRE(n.segments.size() == 4);
    CHECK(n.segments[1].category == Category::kWaiting);
    CHECK_FALSE(n.segments[1].member);
    CHECK(n.segments[2].member);
  }
  SECTION("a member made a spare after an incident is done with it") {
    Ledger l = Started();
    TrainFrom(l, 0, 1, 3);
    l.FailureKnown(3500, 3500, "peer", "a peer failed");
    l.Joining(3600);
    l.Assigned(4000, true, 0);  // the re-formed round needs it no more
    l.Finished(9000);
    const NodeLedger n = l.Settled();
    REQUIRE(n.incidents.size() == 1);
    CHECK(n.incidents[0].resumed == 4000);  // else the job's would run on to its end
    CHECK(Named(n.incidents[0].cost) ==
          std::map<std::string, Ms>{{"redone", 500}, {"restarting", 500}});
  }
  SECTION("the health gate holds the join") {
    Ledger l = Ledger::Launched("n0", "h", 1, 0);
    l.GateHeld(100);
    l.Joining(3100);
    l.Finished(3200);
    CHECK(Named(l.Settled()) == std::map<std::string, Ms>{{"starting", 200}, {"waiting", 3000}});
  }
}

TEST_CASE("goodput ledger: without step numbers redone is not told", "[goodput]") {
  Ledger l = Ledger::Launched("n0", "h", 1, 0);
  l.Joining(0);
  l.Assigned(0, false, 0);
  l.WorkersRunning(0);
  for (Ms t = 1000; t <= 5000; t += 1000) l.Progress(t, 0, std::nullopt);
  l.FailureKnown(5300, 5300, "crash", "");
  l.Joining(5400);
  l.Assigned(5400, false, 0);
  l.WorkersRunning(5500);
  for (Ms t = 6000; t <= 8000; t += 1000) l.Progress(t, 0, std::nullopt);
  l.Finished(8000);
  const NodeLedger n = l.Settled();
  CHECK_FALSE(n.steps_known);
  CHECK(n.progress_known);
  CHECK(Named(n) == std::map<std::string, Ms>{{"starting", 1000},
                                              {"training", 4300 + 2000},
                                              {"restarting", 200},
                                              {"reloading", 500}});
  CHECK(!n.incidents[0].step_at_failure);
}

TEST_CASE("goodput ledger: snapshot saves are progress with the node's step", "[goodput]") {
  Ledger l = Started();
  l.Saved(1000, 1);
  l.Saved(2000, 2);
  l.Saved(3000, 3);
  l.FailureKnown(3500, 3500, "crash", "");
  l.Joining(3500);
  l.Assigned(3500, false, 0);
  l.WorkersRunning(3600);
  l.Saved(4000, 3);  // the step it held, saved again
  l.Saved(5000, 4);
  l.Finished(5000);
  const NodeLedger n = l.Settled();
  CHECK(n.saves.size() == 5);
  CHECK(Named(n) == std::map<std::string, Ms>{{"starting", 1000},
                                              {"training", 2000 + 1000},
                                              {"redone", 500},
                                              {"restarting", 100},
                                              {"reloading", 400}});
}

TEST_CASE("goodput ledger: the live view counts pending time, settled never goes down",
          "[goodput]") {
  Ledger l = Started();
  TrainFrom(l, 0, 1, 3);
  const auto live = l.Live(3500);
  CHECK(live.until == 3500);
  CHECK(Named(live)["training"] == 2500);
  CHECK(Named(l.Settled())["training"] == 2000);
}

TEST_CASE("goodput ledger: any order of events partitions the wall time", "[goodput]") {
  for (unsigned seed = 1; seed <= 2000; ++seed) {
    std::mt19937 rng(seed);
    auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
    const int nproc = 1 + pick(3);
    Ms t = pick(1000);
    Ledger l = Ledger::Launched("n", "h", nproc, t);
    const Ms launched = t;
    crun::goodput::Totals before{};
    std::int64_t step = 0;
    for (int e = 0; e < 60; ++e) {
      t += pick(3) == 0 ? 0 : pick(2000);
      const Ms at = pick(10) == 0 ? t - pick(500) : t;  // now and then a time gone by
      switch (pick(10)) {
        case 0:
          l.GateHeld(at);
          break;
        case 1:
          l.Joining(at);
          break;
        case 2:
          l.Assigned(at, pick(4) == 0, pick(5000));
          break;
        case 3:
          l.WorkersRunning(at);
          break;
        case 4:
        case 5:
        case 6:
          step += pick(3) - 1;
          l.Progress(at, pick(nproc + 1),
                     pick(4) == 0 ? std::nullopt : std::optional<std::int64_t>(step));
          break;
        case 7:
          l.Saved(at, pick(2) ? std::optional<std::int64_t>(step) : std::nullopt);
          break;
        case 8:
          l.FailureKnown(at, at - pick(20000) + pick(5000), "crash", "");
          break;
        default: {
          const NodeLedger live = l.Live(at + pick(100));
          REQUIRE(crun::goodput::Sum(live.totals) == live.until - launched);
        }
      }
      const NodeLedger n = l.Settled();
      INFO("seed " << seed << " event " << e);
      REQUIRE(crun::goodput::Sum(n.totals) == n.until - launched);
      for (std::size_t c = 0; c < before.size(); ++c) REQUIRE(n.totals[c] >= before[c]);
      before = n.totals;
      Ms end = launched;
      crun::goodput::Totals from_segments{};
      for (const auto& s : n.segments) {
        REQUIRE(s.begin == end);
        REQUIRE(s.end > s.begin);
        crun::goodput::At(from_segments, s.category) += s.end - s.begin;
        end = s.end;
      }
      REQUIRE(end == n.until);
      REQUIRE(from_segments == n.totals);
      for (const auto& i : n.incidents) {
        REQUIRE(i.fault <= i.known);
        REQUIRE(crun::goodput::At(i.cost, Category::kTraining) == 0);
        REQUIRE(crun::goodput::Sum(i.cost) <= n.until - launched);
      }
    }
    l.Finished(t + 1);
    const NodeLedger n = l.Settled();
    REQUIRE(n.finished);
    REQUIRE(crun::goodput::Sum(n.totals) == n.until - launched);
  }
}

}  // namespace
