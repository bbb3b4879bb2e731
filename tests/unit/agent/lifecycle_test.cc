// The agent's lifecycle (agent/supervise/lifecycle.h): tables of events and the actions they
// must give, then random orders of events against a simulated node whose processes obey the
// actions, checking at every step that no attempt overlaps another and that nothing of an
// earlier attempt touches the current one.
#include <signal.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include <catch2/catch.hpp>

#include "agent/supervise/lifecycle.h"

namespace crun::agent::lifecycle {
namespace {

using std::chrono::milliseconds;
const TimePoint kT0{std::chrono::hours(1)};

// ---- events as data, so that tables and random runs share one dispatcher ----------------------

struct Assign {
  int round = 0;
  bool spare = false;
};
struct Launched {
  int attempt = 0;
  std::vector<Launch> launches;
};
struct Exit {
  int attempt = 0;
  int lr = 0;
  ExitStatus exit;
};
struct Stream {
  int attempt = 0;
  int lr = 0;
};
struct Edge {
  int attempt = 0;
  bool complete = true;
};
struct Hang {
  int attempt = 0;
  std::vector<int> lrs;
};
struct Rejoin {
  bool spends = true;
};
struct Finished {
  Outcome outcome;
};
struct Signal {
  int signo = 0;
};
struct Tick {
  milliseconds advance{0};
};
struct Leaves {
  NodeLeaves::Why why = NodeLeaves::Why::kExcluded;
};
using Event = std::variant<Assign, Launched, Exit, Stream, Edge, Hang, Rejoin, Finished, Signal,
                           Tick, Leaves>;

ExitStatus Code(int c) { return ExitStatus{false, c}; }
ExitStatus Sig(int s) { return ExitStatus{true, s}; }

// Every rank of an attempt started, each with `streams` pipes.
Launched AllStarted(int attempt, int nproc, int streams = 0) {
  Launched l{attempt, {}};
  for (int lr = 0; lr < nproc; ++lr) l.launches.push_back({lr, true, 0, streams});
  return l;
}

Transition Apply(State s, const Event& e, TimePoint& now) {
  return std::visit(
      [&](const auto& ev) -> Transition {
        using T = std::decay_t<decltype(ev)>;
        if constexpr (std::is_same_v<T, Assign>) return OnAssignment(s, ev.round, ev.spare, now);
        if constexpr (std::is_same_v<T, Launched>)
          return OnLaunched(s, ev.attempt, ev.launches, now);
        if constexpr (std::is_same_v<T, Exit>)
          return OnWorkerExit(s, ev.attempt, ev.lr, ev.exit, now);
        if constexpr (std::is_same_v<T, Stream>) return OnStreamClosed(s, ev.attempt, ev.lr, now);
        if constexpr (std::is_same_v<T, Edge>) return OnEdgeDone(s, ev.attempt, ev.complete, now);
        if constexpr (std::is_same_v<T, Hang>) return OnHang(s, ev.attempt, ev.lrs, now, now);
        if constexpr (std::is_same_v<T, Rejoin>) return OnStopAndRejoin(s, ev.spends, now);
        if constexpr (std::is_same_v<T, Finished>) return OnFinished(s, ev.outcome, now);
        if constexpr (std::is_same_v<T, Signal>) return OnSignal(s, ev.signo, now);
        if constexpr (std::is_same_v<T, Leaves>) {
          return OnNodeLeaves(s, NodeLeaves{ev.why, "slow", 86}, now);
        }
        if constexpr (std::is_same_v<T, Tick>) {
          now += ev.advance;
          return lifecycle::OnTick(s, now);
        }
      },
      e);
}

std::string Ranks(const std::vector<int>& ranks) {
  std::string s = "[";
  for (int r : ranks) s += (s.size() > 1 ? "," : "") + std::to_string(r);
  return s + "]";
}

// An action in a line, for tables.
std::string Describe(const Action& a) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, StartAttempt>) {
          return "start " + std::to_string(x.attempt) + " round " + std::to_string(x.round);
        } else if constexpr (std::is_same_v<T, WaitAsSpare>) {
          return "spare " + std::to_string(x.round);
        } else if constexpr (std::is_same_v<T, AttemptStarted>) {
          return "started " + std::to_string(x.attempt);
        } else if constexpr (std::is_same_v<T, WorkerExited>) {
          static const char* kRecord[] = {"", " failure", " hang-end"};
          return "exited " + std::to_string(x.attempt) + " lr" + std::to_string(x.local_rank) +
                 " " + x.exit.Describe() + kRecord[static_cast<int>(x.record)] +
                 (x.stops_group ? " stops" : "") + (x.stopping ? " while-stopping" : "");
        } else if constexpr (std::is_same_v<T, RecordHang>) {
          return "hang " + std::to_string(x.attempt) + " lr" + std::to_string(x.local_rank);
        } else if constexpr (std::is_same_v<T, ReportFailure>) {
          return "report-failure " + std::to_string(x.attempt);
        } else if constexpr (std::is_same_v<T, SignalWorkers>) {
          static const char* kWhy[] = {"stop", "notice", "grace-over", "no-more-grace"};
          return "signal " + std::to_string(x.attempt) + " " + SignalName(x.signo) + " " +
                 Ranks(x.local_ranks) + " " + kWhy[static_cast<int>(x.why)];
        } else if constexpr (std::is_same_v<T, BeginEdge>) {
          return "edge " + std::to_string(x.attempt);
        } else if constexpr (std::is_same_v<T, EndAttempt>) {
          return "end " + std::to_string(x.attempt);
        } else if constexpr (std::is_same_v<T, Restarting>) {
          return x.spends_restart ? "restarting" : "re-forming";
        } else if constexpr (std::is_same_v<T, ReportSuccess>) {
          return "report-success";
        } else if constexpr (std::is_same_v<T, Join>) {
          return "join";
        } else if constexpr (std::is_same_v<T, Leave>) {
          return "leave " + SignalName(x.signo);
        } else if constexpr (std::is_same_v<T, LeaveJob>) {
          return std::string(x.leaves.why == NodeLeaves::Why::kUnhealthy ? "unhealthy"
                                                                         : "excluded") +
                 ": " + x.leaves.detail;
        } else if constexpr (std::is_same_v<T, Say>) {
          return "say: " + x.text;
        } else if constexpr (std::is_same_v<T, Finish>) {
          static const char* kHow[] = {"signal", "signal-waiting", "edge-stuck", "outcome"};
          return "finish " + std::to_string(x.exit_code) + " " + kHow[static_cast<int>(x.how)];
        }
      },
      a);
}

struct Row {
  Event event;
  std::vector<std::string> expect;
};

// Feeds the rows in order; each row's actions must be exactly its `expect`.
State RunTable(const std::vector<Row>& rows, int nproc = 2) {
  State s = Initial(Settings{0, nproc, milliseconds(30'000)});
  TimePoint now = kT0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    Transition t = Apply(std::move(s), rows[i].event, now);
    std::vector<std::string> got;
    for (const auto& a : t.actions) got.push_back(Describe(a));
    INFO("row " << i);
    CHECK(got == rows[i].expect);
    s = std::move(t.state);
  }
  return s;
}

// The first attempt of two ranks, started, without streams.
std::vector<Row> Running2() {
  return {{Assign{0}, {"start 0 round 0"}}, {AllStarted(0, 2), {"started 0"}}};
}

std::vector<Row> operator+(std::vector<Row> a, const std::vector<Row>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_CASE("a clean run: the attempt ends after its exits, its streams and its edge",
          "[lifecycle]") {
  const State s = RunTable({
      {Assign{0}, {"start 0 round 0"}},
      {AllStarted(0, 2, 1), {"started 0"}},
      {Exit{0, 0, Code(0)}, {"exited 0 lr0 exit code 0"}},
      {Stream{0, 0}, {}},
      {Exit{0, 1, Code(0)}, {"exited 0 lr1 exit code 0", "edge 0"}},
      {Edge{0, true}, {}},  // lr1's output is still being read
      {Stream{0, 1}, {"end 0", "report-success"}},
      {Finished{{true, 0}}, {"finish 0 outcome"}},
  });
  CHECK(s.phase == Phase::kDone);
  CHECK(s.exit_code == 0);
}

TEST_CASE("a failure stops the others, the restart waits for the edge", "[lifecycle]") {
  RunTable(Running2() + std::vector<Row>{
                            {Exit{0, 1, Code(7)},
                             {"exited 0 lr1 exit code 7 failure stops", "report-failure 0",
                              "signal 0 SIGTERM [0] stop"}},
                            {Rejoin{true}, {"restarting"}},  // the round's stop arrives mid-stop
                            {Exit{0, 0, Sig(SIGTERM)},
                             {"exited 0 lr0 signal 15 (SIGTERM) failure while-stopping", "edge 0"}},
                            {Assign{1}, {}},  // no round before the join
                            {Edge{0, true}, {"end 0", "join"}},
                            {Assign{1}, {"start 1 round 1"}},
                        });
}

TEST_CASE("exits before, during and after the stop", "[lifecycle]") {
  SECTION("every worker exits before the rendezvous's stop arrives") {
    RunTable(Running2() +
             std::vector<Row>{
                 {Exit{0, 1, Code(7)},
                  {"exited 0 lr1 exit code 7 failure stops", "report-failure 0",
                   "signal 0 SIGTERM [0] stop"}},
                 {Exit{0, 0, Code(0)}, {"exited 0 lr0 exit code 0 while-stopping", "edge 0"}},
                 {Edge{0, true}, {"end 0"}},  // waits for the rendezvous
                 {Rejoin{true}, {"restarting", "join"}},
             });
  }
  SECTION("the rendezvous stops a healthy group (another node failed)") {
    RunTable(Running2() +
             std::vector<Row>{
                 {Rejoin{true}, {"restarting", "signal 0 SIGTERM [0,1] stop"}},
                 {Exit{0, 0, Code(0)}, {"exited 0 lr0 exit code 0 while-stopping"}},
                 {Exit{0, 1, Sig(SIGTERM)},
                  {"exited 0 lr1 signal 15 (SIGTERM) failure while-stopping", "edge 0"}},
                 {Edge{0, true}, {"end 0", "join"}},
             });
  }
  SECTION("a worker exits at the moment of the stop signal, with success") {
    RunTable(Running2() +
             std::vector<Row>{
                 {Exit{0, 1, Code(3)},
                  {"exited 0 lr1 exit code 3 failure stops", "report-failure 0",
                   "signal 0 SIGTERM [0] stop"}},
                 {Exit{0, 0, Code(0)}, {"exited 0 lr0 exit code 0 while-stopping", "edge 0"}},
                 {Exit{0, 0, Code(0)}, {}},  // a second report of the same exit
                 {Edge{0, true}, {"end 0"}},
             });
  }
}

TEST_CASE("events of an earlier attempt never touch the current one", "[lifecycle]") {
  State s = RunTable(
      Running2() +
      std::vector<Row>{
          {Rejoin{false}, {"re-forming", "signal 0 SIGTERM [0,1] stop"}},
          {Exit{0, 0, Sig(SIGTERM)}, {"exited 0 lr0 signal 15 (SIGTERM) failure while-stopping"}},
          {Exit{0, 1, Sig(SIGTERM)},
           {"exited 0 lr1 signal 15 (SIGTERM) failure while-stopping", "edge 0"}},
          {Edge{0, true}, {"end 0", "join"}},
          {Assign{1}, {"start 1 round 1"}},
          {AllStarted(1, 2), {"started 1"}},
          // late: an exit, a stream, an edge, a hang of attempt 0
          {Exit{0, 0, Code(1)}, {}},
          {Stream{0, 1}, {}},
          {Edge{0, false}, {}},
          {Hang{0, {0}}, {}},
          {Launched{0, {{0, false, 127, 0}}}, {}},
      });
  CHECK(s.phase == Phase::kRunning);
  CHECK(s.attempt == 1);
  CHECK(Running(s) == 2);
  CHECK(s.failures.empty());
  CHECK_FALSE(s.edge_stuck);
}

TEST_CASE("the grace ends in SIGKILL for those still running, once", "[lifecycle]") {
  RunTable(Running2() + std::vector<Row>{
                            {Exit{0, 1, Code(7)},
                             {"exited 0 lr1 exit code 7 failure stops", "report-failure 0",
                              "signal 0 SIGTERM [0] stop"}},
                            {Tick{milliseconds(29'999)}, {}},
                            {Tick{milliseconds(1)}, {"signal 0 SIGKILL [0] grace-over"}},
                            {Tick{milliseconds(60'000)}, {}},
                            {Exit{0, 0, Sig(SIGKILL)},
                             {"exited 0 lr0 signal 9 (SIGKILL) failure while-stopping", "edge 0"}},
                        });
}

TEST_CASE("signals: a stop, a repeat, a second Ctrl-C, a notice", "[lifecycle]") {
  SECTION("SIGTERM while running stops the job with 143 once the attempt is over") {
    const State s = RunTable(
        Running2() +
        std::vector<Row>{
            {Signal{SIGTERM},
             {"say: received SIGTERM: forwarding it to 2 workers", "leave SIGTERM",
              "signal 0 SIGTERM [0,1] stop"}},
            {Signal{SIGTERM}, {"say: received SIGTERM again: the workers keep their grace period"}},
            {Rejoin{true}, {}},  // the job is ending: no rejoin
            {Signal{SIGINT},
             {"say: received SIGINT again: SIGKILL to the workers now",
              "signal 0 SIGKILL [0,1] no-more-grace"}},
            {Exit{0, 0, Sig(SIGKILL)}, {"exited 0 lr0 signal 9 (SIGKILL) failure while-stopping"}},
            {Exit{0, 1, Sig(SIGKILL)},
             {"exited 0 lr1 signal 9 (SIGKILL) failure while-stopping", "edge 0"}},
            {Edge{0, true}, {"end 0", "finish 143 signal"}},
            {Assign{1}, {}},
        });
    CHECK(s.exit_code == 143);
  }
  SECTION("a signal mid-restart, while waiting for the next round, ends the job at once") {
    RunTable(
        Running2() +
        std::vector<Row>{
            {Rejoin{true}, {"restarting", "signal 0 SIGTERM [0,1] stop"}},
            {Exit{0, 0, Sig(SIGTERM)}, {"exited 0 lr0 signal 15 (SIGTERM) failure while-stopping"}},
            {Exit{0, 1, Sig(SIGTERM)},
             {"exited 0 lr1 signal 15 (SIGTERM) failure while-stopping", "edge 0"}},
            {Edge{0, true}, {"end 0", "join"}},
            {Signal{SIGHUP},
             {"say: received SIGHUP: forwarding it to 0 workers", "leave SIGHUP",
              "finish 129 signal-waiting"}},
            {Assign{1}, {}},
        });
  }
  SECTION("a signal while the group stops for a failure is forwarded all the same") {
    RunTable(Running2() + std::vector<Row>{
                              {Exit{0, 1, Code(7)},
                               {"exited 0 lr1 exit code 7 failure stops", "report-failure 0",
                                "signal 0 SIGTERM [0] stop"}},
                              {Signal{SIGINT},
                               {"say: received SIGINT: forwarding it to 1 worker", "leave SIGINT",
                                "signal 0 SIGINT [0] stop"}},
                          });
  }
  SECTION("a signal while the attempt starts stops it once started") {
    RunTable({
        {Assign{0}, {"start 0 round 0"}},
        {Signal{SIGTERM}, {"say: received SIGTERM: forwarding it to 0 workers", "leave SIGTERM"}},
        {AllStarted(0, 2), {"signal 0 SIGTERM [0,1] stop"}},
    });
  }
  SECTION("SIGUSR1 is passed on and nothing stops") {
    const State s = RunTable(Running2() + std::vector<Row>{
                                              {Signal{SIGUSR1},
                                               {"say: received SIGUSR1: passing it on to 2 workers",
                                                "signal 0 SIGUSR1 [0,1] notice"}},
                                          });
    CHECK(s.phase == Phase::kRunning);
  }
}

TEST_CASE("an edge that cannot clear ends the job instead of restarting", "[lifecycle]") {
  const State s = RunTable(Running2() + std::vector<Row>{
                                            {Exit{0, 1, Code(7)},
                                             {"exited 0 lr1 exit code 7 failure stops",
                                              "report-failure 0", "signal 0 SIGTERM [0] stop"}},
                                            {Rejoin{true}, {"restarting"}},
                                            {Exit{0, 0, Sig(SIGTERM)},
                                             {"exited 0 lr0 signal 15 (SIGTERM) failure "
                                              "while-stopping",
                                              "edge 0"}},
                                            {Edge{0, false}, {"end 0", "finish 7 edge-stuck"}},
                                        });
  CHECK(s.phase == Phase::kDone);
}

TEST_CASE("workers that cannot be started count as failures", "[lifecycle]") {
  SECTION("one rank: the others are stopped, its code is the root cause") {
    RunTable({
        {Assign{0}, {"start 0 round 0"}},
        {Launched{0, {{0, true, 0, 0}, {1, false, 127, 0}}},
         {"report-failure 0", "signal 0 SIGTERM [0] stop"}},
        {Exit{0, 0, Sig(SIGTERM)},
         {"exited 0 lr0 signal 15 (SIGTERM) failure while-stopping", "edge 0"}},
        {Edge{0, true}, {"end 0"}},
        {Finished{{false, 127}}, {"finish 127 outcome"}},
    });
  }
  SECTION("every rank: straight to the edge") {
    RunTable({
        {Assign{0}, {"start 0 round 0"}},
        {Launched{0, {{0, false, 126, 2}, {1, false, 126, 2}}}, {"report-failure 0", "edge 0"}},
        {Edge{0, true}, {}},
        {Stream{0, 0}, {}},
        {Stream{0, 0}, {}},
        {Stream{0, 1}, {}},
        {Stream{0, 1}, {"end 0"}},
        {Rejoin{true}, {"restarting", "join"}},
    });
  }
  SECTION("a rank never tried (its log directory failed) counts for nothing") {
    RunTable({
        {Assign{0}, {"start 0 round 0"}},
        {Launched{0, {{0, false, 1, 0}}}, {"report-failure 0", "edge 0"}},
        {Edge{0, true}, {"end 0"}},
    });
  }
}

TEST_CASE("the job's end decided mid-stop comes once the attempt is over", "[lifecycle]") {
  RunTable(Running2() + std::vector<Row>{
                            {Exit{0, 1, Code(7)},
                             {"exited 0 lr1 exit code 7 failure stops", "report-failure 0",
                              "signal 0 SIGTERM [0] stop"}},
                            {Finished{{false, 7}}, {}},
                            {Rejoin{true}, {}},  // after the outcome: ignored
                            {Exit{0, 0, Sig(SIGTERM)},
                             {"exited 0 lr0 signal 15 (SIGTERM) failure while-stopping", "edge 0"}},
                            {Edge{0, true}, {"end 0", "finish 7 outcome"}},
                        });
}

TEST_CASE("a hang records the hung ranks, stops the group, and keeps how they ended",
          "[lifecycle]") {
  const State s = RunTable(
      Running2() +
      std::vector<Row>{
          {Hang{0, {0}}, {"hang 0 lr0", "report-failure 0", "signal 0 SIGTERM [0,1] stop"}},
          {Hang{0, {0, 1}}, {"hang 0 lr1"}},  // already stopping
          {Exit{0, 0, Sig(SIGTERM)}, {"exited 0 lr0 signal 15 (SIGTERM) hang-end while-stopping"}},
          {Exit{0, 1, Code(0)}, {"exited 0 lr1 exit code 0 hang-end while-stopping", "edge 0"}},
      });
  REQUIRE(s.failures.size() == 2);
  CHECK(s.failures[1].exit.success());
}

TEST_CASE("a node that leaves: once, before a join or mid-run, as the job's end", "[lifecycle]") {
  using Why = NodeLeaves::Why;
  // Unhealthy before its first join: no worker runs, the job ends at once.
  RunTable({
      {Leaves{Why::kUnhealthy}, {"unhealthy: slow", "finish 86 outcome"}},
      {Leaves{Why::kExcluded}, {}},
      {Assign{0}, {}},
  });
  // Excluded while running: the group stops, the end waits for the attempt's end.
  RunTable(
      Running2() +
      std::vector<Row>{
          {Leaves{Why::kExcluded}, {"excluded: slow", "signal 0 SIGTERM [0,1] stop"}},
          {Leaves{Why::kExcluded}, {}},  // once
          {Exit{0, 0, Sig(SIGTERM)}, {"exited 0 lr0 signal 15 (SIGTERM) failure while-stopping"}},
          {Exit{0, 1, Sig(SIGTERM)},
           {"exited 0 lr1 signal 15 (SIGTERM) failure while-stopping", "edge 0"}},
          {Edge{0, true}, {"end 0", "finish 86 outcome"}},
      });
  // After the job's end, nothing.
  RunTable({
      {Signal{SIGTERM},
       {"say: received SIGTERM: forwarding it to 0 workers", "leave SIGTERM",
        "finish 143 signal-waiting"}},
      {Leaves{Why::kExcluded}, {}},
  });
}

TEST_CASE("a spare waits, a round while running is not acted on", "[lifecycle]") {
  RunTable({
      {Assign{0, true}, {"spare 0"}},
      {Assign{1}, {"start 0 round 1"}},
      {AllStarted(0, 2), {"started 0"}},
      {Assign{2}, {}},
  });
}

// ---- random orders --------------------------------------------------------------------------

// A node whose processes do what the actions say, and a rendezvous that answers, with every
// choice of what happens next drawn at random. It checks the lifecycle's promises as it goes.
class World {
 public:
  explicit World(std::uint32_t seed) : rng_(seed) {
    s_ = Initial(Settings{0, kNproc, milliseconds(30'000)});
  }

  void Run(int steps) {
    Feed(Assign{round_++});
    for (int i = 0; i < steps && s_.phase != Phase::kDone; ++i) Feed(Next());
    // Wind down: the job ends, every process dies, everything pending arrives.
    Feed(Finished{{false, 1}});
    for (int i = 0; i < 1000 && s_.phase != Phase::kDone; ++i) {
      if (!pending_.empty()) {
        Feed(TakePending(0));
      } else if (!alive_.empty()) {
        const int lr = alive_.begin()->first;
        alive_.erase(alive_.begin());
        Feed(Exit{attempt_, lr, Sig(SIGKILL)});
      } else {
        Feed(Tick{milliseconds(40'000)});
      }
    }
    REQUIRE(s_.phase == Phase::kDone);
    CHECK(finishes_ == 1);
  }

  int attempts() const { return attempt_ + 1; }

 private:
  static constexpr int kNproc = 3;

  bool Chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  int Pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }

  Event TakePending(std::size_t i) {
    Event e = pending_[i];
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    return e;
  }

  // What happens next: something pending (an exit, a stream, an edge, a round), or something
  // from outside (a signal, time passing, a node lost), or a late event of an earlier attempt.
  Event Next() {
    const int roll = Pick(1000);
    if (roll < 4) {
      static const int kSignals[] = {SIGTERM, SIGINT, SIGHUP};
      return Signal{kSignals[Pick(3)]};
    }
    if (roll < 7)
      return Leaves{Chance(0.5) ? NodeLeaves::Why::kUnhealthy : NodeLeaves::Why::kExcluded};
    if (roll < 20) return Signal{SIGUSR1};
    if (roll < 100) return Tick{milliseconds(Pick(40'000))};
    if (!pending_.empty() && std::holds_alternative<Launched>(pending_.front())) {
      return TakePending(0);  // the start is synchronous: no exit comes before its answer
    }
    if (roll < 130) return Rejoin{Chance(0.5)};
    if (roll < 150 && attempt_ >= 0) return Hang{attempt_, {Pick(kNproc)}};
    if (roll < 250 && !stale_.empty()) {
      const std::size_t i = static_cast<std::size_t>(Pick(static_cast<int>(stale_.size())));
      stale_expected_ = true;
      return stale_[i];
    }
    if (!alive_.empty() && (pending_.empty() || Chance(0.3))) {
      auto it = alive_.begin();
      std::advance(it, Pick(static_cast<int>(alive_.size())));
      const int lr = it->first;
      ExitStatus exit = it->second != 0 ? Sig(it->second) : (Chance(0.3) ? Code(7) : Code(0));
      alive_.erase(it);
      return Exit{attempt_, lr, exit};
    }
    if (!pending_.empty()) {
      return TakePending(static_cast<std::size_t>(Pick(static_cast<int>(pending_.size()))));
    }
    return Tick{milliseconds(1'000)};
  }

  void Feed(const Event& e) {
    Observe(e);
    const State before = s_;
    Transition t = Apply(s_, e, now_);
    if (stale_expected_) {
      stale_expected_ = false;
      CHECK(t.actions.empty());
      CHECK(t.state.phase == before.phase);
      CHECK(t.state.attempt == before.attempt);
      CHECK(t.state.failures.size() == before.failures.size());
      CHECK(Running(t.state) == Running(before));
    }
    s_ = std::move(t.state);
    for (const auto& a : t.actions) Carry(a);
    if (t.wake_at) CHECK(*t.wake_at > now_ - milliseconds(1));
  }

  // The node carries out an action, and the checks of what it may ask.
  void Carry(const Action& a) {
    CHECK(finishes_ == 0);  // nothing after the end
    if (auto* st = std::get_if<StartAttempt>(&a)) {
      // The hard edge: nothing of any earlier attempt is alive.
      CHECK(alive_.empty());
      CHECK(leftovers_ == 0);
      CHECK(open_streams_ == 0);
      CHECK(st->attempt == attempt_ + 1);
      Retire(attempt_);
      attempt_ = st->attempt;
      Launched l{attempt_, {}};
      for (int lr = 0; lr < kNproc; ++lr) {
        const bool ok = !Chance(0.05);
        l.launches.push_back({lr, ok, ok ? 0 : 127, 1});
        ++open_streams_;
        pending_.push_back(Stream{attempt_, lr});
        if (ok) alive_[lr] = 0;
      }
      leftovers_ = Pick(3);
      pending_.insert(pending_.begin(), l);  // the start is synchronous: its answer comes next
    } else if (auto* sw = std::get_if<SignalWorkers>(&a)) {
      CHECK(sw->attempt == attempt_);
      for (int lr : sw->local_ranks) {
        REQUIRE(alive_.count(lr) == 1);  // only live workers of this attempt
        if (sw->signo == SIGKILL || (sw->signo != SIGUSR1 && !Chance(0.2))) {
          alive_[lr] = sw->signo;  // dies of it; 20% ignore the stop signal
        }
      }
    } else if (auto* e = std::get_if<BeginEdge>(&a)) {
      CHECK(e->attempt == attempt_);
      CHECK(alive_.empty());
      pending_.push_back(Edge{attempt_, !Chance(0.02)});
    } else if (auto* end = std::get_if<EndAttempt>(&a)) {
      CHECK(end->attempt == attempt_);
      CHECK(alive_.empty());
      CHECK(open_streams_ == 0);
    } else if (std::holds_alternative<Join>(a)) {
      pending_.push_back(Assign{round_++, Chance(0.05)});
    } else if (std::holds_alternative<ReportFailure>(a)) {
      if (Chance(0.95)) pending_.push_back(Rejoin{true});
    } else if (std::holds_alternative<ReportSuccess>(a)) {
      pending_.push_back(Chance(0.3) ? Event{Finished{{true, 0}}} : Event{Rejoin{false}});
    } else if (std::holds_alternative<LeaveJob>(a)) {
      CHECK(++leaves_ == 1);  // once
    } else if (std::holds_alternative<Finish>(a)) {
      ++finishes_;
      CHECK(alive_.empty());
    }
  }

  // Once an attempt is over, its events may still arrive, late: each must change nothing.
  void Retire(int attempt) {
    if (attempt < 0) return;
    for (int lr = 0; lr < kNproc; ++lr) {
      stale_.push_back(Exit{attempt, lr, Code(1)});
      stale_.push_back(Stream{attempt, lr});
    }
    stale_.push_back(Edge{attempt, false});
    stale_.push_back(Hang{attempt, {0}});
    stale_.push_back(Launched{attempt, {{0, false, 127, 1}}});
    if (stale_.size() > 64) stale_.erase(stale_.begin(), stale_.begin() + 16);
  }

  // The node's view of streams and leftovers, updated as their events are fed.
  void Observe(const Event& e) {
    if (const auto* st = std::get_if<Stream>(&e); st && st->attempt == attempt_) --open_streams_;
    if (const auto* ed = std::get_if<Edge>(&e); ed && ed->attempt == attempt_ && ed->complete) {
      leftovers_ = 0;
    }
  }

  std::mt19937 rng_;
  State s_;
  TimePoint now_ = kT0;
  int attempt_ = -1, round_ = 0, finishes_ = 0, leaves_ = 0;
  std::map<int, int> alive_;  // the current attempt's live workers -> the signal they die of
  int leftovers_ = 0;         // their children, until a complete edge
  int open_streams_ = 0;
  std::vector<Event> pending_;
  std::vector<Event> stale_;
  bool stale_expected_ = false;
};

TEST_CASE("random orders of events: attempts never overlap, stale events change nothing",
          "[lifecycle]") {
  int attempts = 0;
  for (std::uint32_t seed = 1; seed <= 2000; ++seed) {
    INFO("seed " << seed);
    World w(seed);
    w.Run(400);
    attempts += w.attempts();
  }
  CHECK(attempts > 2000);  // the runs went through many attempts, not one each
}

}  // namespace
}  // namespace crun::agent::lifecycle
