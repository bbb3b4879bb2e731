// Rendezvous rules as tables: events at invented times in, state and actions out. No sockets,
// threads, clocks or sleeps.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>

#include "rendezvous/rules/rules.h"

namespace {

using namespace std::chrono_literals;
using crun::rdzv::Action;
using crun::rdzv::FailJob;
using crun::rdzv::Failure;
using crun::rdzv::FormRound;
using crun::rdzv::KeepAsSpare;
using crun::rdzv::NodeDescription;
using crun::rdzv::OnHeartbeat;
using crun::rdzv::OnJoin;
using crun::rdzv::OnNodeLost;
using crun::rdzv::OnNodeSucceeded;
using crun::rdzv::OnTick;
using crun::rdzv::OnUnhealthy;
using crun::rdzv::OnWorkerFailed;
using crun::rdzv::Phase;
using crun::rdzv::RefuseJoin;
using crun::rdzv::Settings;
using crun::rdzv::State;
using crun::rdzv::StopAndRejoin;
using crun::rdzv::SucceedJob;
using crun::rdzv::TimePoint;

const TimePoint T0{};  // an arbitrary origin: the rules only compare times

Settings Nodes(int min, int max) {
  Settings s;
  s.min_nodes = min;
  s.max_nodes = max;
  s.join_timeout = 60s;
  s.last_call_timeout = 1s;
  return s;
}

NodeDescription Node(const std::string& host, int nproc = 2, std::optional<int> rank = {}) {
  return {host + "#1", host, nproc, rank, host, {}};
}

State Start(const Settings& s) {
  State st;
  st.settings = s;
  return st;
}

// A failure in words alone.
Failure Said(const std::string& what) {
  Failure f;
  f.what = what;
  return f;
}

template <typename T>
const T* Only(const std::vector<Action>& actions) {
  REQUIRE(actions.size() == 1);
  return std::get_if<T>(&actions[0]);
}

}  // namespace

TEST_CASE("settings are validated with the values named", "[rules]") {
  struct Row {
    Settings s;
    const char* message;
  };
  Settings bad_max = Nodes(4, 2);
  Settings bad_min = Nodes(0, 2);
  Settings bad_join = Nodes(1, 1);
  bad_join.join_timeout = 0ms;
  Settings bad_restarts = Nodes(1, 1);
  bad_restarts.max_restarts = -1;
  // Past the bounds (found by tests/fuzz/rendezvous_engine_fuzz: a deadline of
  // now + INT64_MAX ms overflowed the clock).
  Settings huge_heartbeat = Nodes(1, 1);
  huge_heartbeat.heartbeat_timeout = crun::rdzv::Millis(INT64_MAX);
  Settings huge_last_call = Nodes(1, 1);
  huge_last_call.last_call_timeout = crun::rdzv::Millis(31LL * 24 * 3600 * 1000);
  Settings newer_contract = Nodes(1, 1);  // an agent newer than this service
  newer_contract.contracts = crun::ContractSet::FromBits(1u << 9);
  for (const auto& row : std::vector<Row>{
           {Nodes(1, 100'001), "max nodes (100001) must be <= 100000"},
           {huge_heartbeat, "heartbeat_timeout (9223372036854775807 ms) must be at most 30 days"},
           {huge_last_call, "last_call_timeout (2678400000 ms) must be 0 to 30 days"},
           {bad_max, "max nodes (2) must be >= min nodes (4)"},
           {bad_min, "min nodes (0) must be >= 1"},
           {bad_join, "join_timeout (0 ms) must be positive"},
           {bad_restarts, "max restarts (-1) must be >= 0"},
           {newer_contract,
            "--contract torch,unknown contracts (bits 512) names contracts this crun does not "
            "know (is the agent newer?)"},
       }) {
    CHECK(row.s.Validate().message() == row.message);
  }
  CHECK(Nodes(2, 4).Validate().ok());
}

TEST_CASE("one node of 1:1 forms round 0 at once", "[rules]") {
  auto t = OnJoin(Start(Nodes(1, 1)), Node("a", 4), Nodes(1, 1), T0);
  const auto* round = Only<FormRound>(t.actions);
  REQUIRE(round != nullptr);
  CHECK(round->round == 0);
  REQUIRE(round->assignments.size() == 1);
  CHECK(round->assignments[0].group_rank == 0);
  CHECK(round->assignments[0].world_size == 4);
  CHECK(t.state.phase == Phase::kRunning);
  CHECK(t.wake_at == T0 + 3s);  // the first heartbeat check
}

TEST_CASE("2:4 waits for the last call after the second node, then forms", "[rules]") {
  const Settings s = Nodes(2, 4);
  auto t = OnJoin(Start(s), Node("b"), s, T0);
  CHECK(t.actions.empty());
  CHECK(t.wake_at == T0 + 60s);  // the join deadline
  t = OnJoin(t.state, Node("a"), s, T0 + 5s);
  CHECK(t.actions.empty());
  CHECK(t.wake_at == T0 + 6s);  // last call closes 1 s after min was reached
  t = OnTick(t.state, T0 + 5999ms);
  CHECK(t.actions.empty());
  t = OnTick(t.state, T0 + 6s);
  const auto* round = Only<FormRound>(t.actions);
  REQUIRE(round != nullptr);
  REQUIRE(round->assignments.size() == 2);
  CHECK(round->assignments[0].node_id == "a#1");  // rank order: by host
  CHECK(round->assignments[1].base_rank == 2);
  CHECK(round->assignments[1].world_size == 4);
  CHECK(round->waited_for_nodes == 5s);  // from the first join until min was there (goodput)
}

TEST_CASE("reaching max forms at once, without a last call", "[rules]") {
  const Settings s = Nodes(2, 3);
  State st = Start(s);
  for (const char* h : {"c", "a"}) st = OnJoin(st, Node(h), s, T0).state;
  auto t = OnJoin(st, Node("b"), s, T0 + 10ms);
  const auto* round = Only<FormRound>(t.actions);
  REQUIRE(round != nullptr);
  CHECK(round->assignments.size() == 3);
  CHECK(round->assignments[2].node_id == "c#1");
}

TEST_CASE("ranks: heterogeneous nproc, imposed order first", "[rules]") {
  const Settings s = Nodes(3, 3);
  State st = Start(s);
  st = OnJoin(st, Node("z", 8), s, T0).state;     // no imposed rank: last
  st = OnJoin(st, Node("y", 1, 1), s, T0).state;  // imposed rank 1
  auto t = OnJoin(st, Node("x", 4, 0), s, T0);    // imposed rank 0
  const auto* round = Only<FormRound>(t.actions);
  REQUIRE(round != nullptr);
  struct Row {
    const char* node;
    int group_rank, base_rank;
  };
  const Row expected[] = {{"x#1", 0, 0}, {"y#1", 1, 4}, {"z#1", 2, 5}};
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(round->assignments[i].node_id == expected[i].node);
    CHECK(round->assignments[i].group_rank == expected[i].group_rank);
    CHECK(round->assignments[i].base_rank == expected[i].base_rank);
    CHECK(round->assignments[i].world_size == 13);
    CHECK(round->assignments[i].group_world_size == 3);
  }
}

TEST_CASE("nodes beyond max are spares", "[rules]") {
  State st = Start(Nodes(1, 2));
  st.joined = {Node("c"), Node("a"), Node("b")};  // as after a re-join with an extra node
  st.last_call_deadline = T0;
  auto t = OnTick(st, T0);
  const auto* round = Only<FormRound>(t.actions);
  REQUIRE(round != nullptr);
  CHECK(round->assignments.size() == 2);
  CHECK(round->spares == std::vector<std::string>{"c#1"});
}

TEST_CASE("too few nodes by the join deadline fail the job, naming who came", "[rules]") {
  const Settings s = Nodes(3, 4);
  State st = Start(s);
  st = OnJoin(st, Node("a"), s, T0).state;
  st = OnJoin(st, Node("b"), s, T0 + 1s).state;
  CHECK(OnTick(st, T0 + 59s).actions.empty());
  auto t = OnTick(st, T0 + 60s);
  const auto* fail = Only<FailJob>(t.actions);
  REQUIRE(fail != nullptr);
  CHECK(fail->reason == "only 2 of at least 3 nodes joined within 60000 ms (joined: a, b)");
  CHECK(t.state.phase == Phase::kFailed);
}

TEST_CASE("joins that cannot be accepted are refused with the reason", "[rules]") {
  const Settings s = Nodes(2, 4);
  State st = OnJoin(Start(s), Node("a"), s, T0).state;
  struct Row {
    NodeDescription node;
    Settings settings;
    const char* reason;
  };
  NodeDescription zero = Node("z");
  zero.nproc = 0;
  NodeDescription huge = Node("h");
  huge.nproc = INT32_MAX;  // two of them would overflow the world size
  for (const auto& row : std::vector<Row>{
           {Node("a"), s, "another agent already joined as node 'a#1'"},
           {Node("b"), Nodes(2, 3), "--nnodes differs: this job uses 2:4, the joining agent 2:3"},
           {zero, s, "nproc 0 must be 1 to 4096"},
           {huge, s, "nproc 2147483647 must be 1 to 4096"},
       }) {
    auto t = OnJoin(st, row.node, row.settings, T0 + 1s);
    const auto* refused = Only<RefuseJoin>(t.actions);
    REQUIRE(refused != nullptr);
    CHECK(refused->reason == row.reason);
    CHECK(t.state.joined.size() == 1);
  }
}

// Issue 52: two pods with the same index (a JobSet whose pods all read index 0) must not both
// run as that rank. Another host's claim is refused naming both hosts, in each place a node
// waits: gathering, in the round, as a spare. The same host's new agent (a pod the controller
// restarted keeps its host name) is not refused: it waits until the old one is gone.
TEST_CASE("a node rank claimed by two hosts is refused naming both", "[rules]") {
  const auto claim = [](const std::string& host, int rank, int agent = 1) {
    NodeDescription n = Node(host, 2, rank);
    n.node_id = host + "#" + std::to_string(agent);
    return n;
  };
  const Settings s = Nodes(2, 3);
  State gathering = OnJoin(Start(s), claim("pod-0", 0), s, T0).state;
  State running = OnJoin(gathering, claim("pod-1", 1), s, T0).state;
  running = OnJoin(running, claim("pod-2", 2), s, T0).state;  // the third: the round forms
  REQUIRE(running.phase == Phase::kRunning);
  State with_spare = OnJoin(running, claim("spare-a", 7), s, T0).state;
  REQUIRE(with_spare.spares.size() == 1);
  struct Row {
    const char* where;
    const State& state;
    NodeDescription node;
    const char* holder;  // nullptr: accepted
  };
  for (const auto& row : std::vector<Row>{
           {"gathering", gathering, claim("pod-9", 0), "pod-0"},
           {"gathering, restarted", gathering, claim("pod-0", 0, 2), nullptr},
           {"gathering, its own rank", gathering, claim("pod-9", 1), nullptr},
           {"in the round", running, claim("pod-9", 1), "pod-1"},
           {"in the round, restarted", running, claim("pod-1", 1, 2), nullptr},
           {"a spare", with_spare, claim("spare-b", 7), "spare-a"},
           {"no rank imposed", with_spare, Node("free"), nullptr},
       }) {
    INFO(row.where);
    const auto t = OnJoin(row.state, row.node, s, T0 + 1s);
    const auto* refused = t.actions.size() == 1 ? std::get_if<RefuseJoin>(&t.actions[0]) : nullptr;
    if (row.holder == nullptr) {
      CHECK(refused == nullptr);
      CHECK(t.state.present.count(row.node.node_id) == 1);
      continue;
    }
    REQUIRE(refused != nullptr);
    CHECK(refused->kind == RefuseJoin::Kind::kDuplicateNode);
    CHECK(refused->reason == "node rank " + std::to_string(*row.node.requested_rank) +
                                 " is claimed twice: by host " + row.holder +
                                 " (in the job) and by host " + row.node.host +
                                 "; give each node its own (--node-rank, PET_NODE_RANK, "
                                 "JOB_COMPLETION_INDEX)");
    CHECK(t.state.present.count(row.node.node_id) == 0);
  }
}

// Every contract set with 1 to 3 workers a node: a node that reserved what the set's port layout
// says joins; one port more or fewer is refused naming the counts and the set; a node that runs
// another set is refused naming both (issue 46: three contracts used to be refused as "at most
// one each and one more").
TEST_CASE("a node's ports are judged by its contracts' port layout", "[rules]") {
  const char* sets[] = {"torch",
                        "tensorflow",
                        "jax",
                        "horovod",
                        "deepspeed",
                        "mpi",
                        "tf,jax",
                        "jax,horovod",
                        "tensorflow,horovod",
                        "tf,jax,horovod",
                        "tf,jax,horovod,deepspeed,mpi"};
  for (const char* list : sets) {
    const crun::ContractSet contracts = crun::ParseContracts(list).value();
    Settings s = Nodes(2, 2);
    s.contracts = contracts;
    for (int nproc = 1; nproc <= 3; ++nproc) {
      INFO(list << " with " << nproc << " workers");
      const int want = crun::PortLayout(contracts, nproc).count();
      const auto node = [&](const char* host, int ports) {
        NodeDescription n = Node(host, nproc);
        for (int i = 0; i < ports; ++i) n.ports.push_back(static_cast<std::uint16_t>(1000 + i));
        return n;
      };
      State st = OnJoin(Start(s), node("a", want), s, T0).state;
      auto formed = OnJoin(st, node("b", want), s, T0);
      REQUIRE(Only<FormRound>(formed.actions) != nullptr);
      for (const int ports : {want + 1, want - 1}) {
        if (ports < 0) continue;
        const auto t = OnJoin(st, node("b", ports), s, T0);
        const auto* refused = Only<RefuseJoin>(t.actions);
        REQUIRE(refused != nullptr);
        CHECK(refused->reason == std::to_string(ports) + " reserved ports for " +
                                     std::to_string(nproc) + (nproc == 1 ? " worker" : " workers") +
                                     " where --contract " + contracts.ToString() + " needs " +
                                     std::to_string(want));
      }
      Settings other = s;
      other.contracts = crun::ParseContracts("mpi").value();
      if (other.contracts == contracts) continue;
      const auto t = OnJoin(st, node("b", 0), other, T0);
      const auto* refused = Only<RefuseJoin>(t.actions);
      REQUIRE(refused != nullptr);
      CHECK(refused->reason == "--contract differs: this job uses " + contracts.ToString() +
                                   ", the joining agent torch,mpi");
    }
  }
}

TEST_CASE("ranks follow from members in one function", "[rules]") {
  // Uneven nodes: node i's first rank is the workers of the nodes before it.
  const auto a = crun::rdzv::AssignRanks({Node("a", 2), Node("b", 3), Node("c", 1)});
  REQUIRE(a.size() == 3);
  const int want[][2] = {{0, 0}, {1, 2}, {2, 5}};  // group rank, base rank
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].group_rank == want[i][0]);
    CHECK(a[i].base_rank == want[i][1]);
    CHECK(a[i].group_world_size == 3);
    CHECK(a[i].world_size == 6);
  }
  CHECK(a[1].node_id == "b#1");
  CHECK(crun::rdzv::AssignRanks({}).empty());
}

TEST_CASE("the restart budget: spent while some remain, never past max", "[rules]") {
  for (int max = 0; max <= 3; ++max) {
    int used = 0;
    for (int failure = 0; failure < 5; ++failure) {
      CHECK(crun::rdzv::SpendRestart(used, max) == (failure < max));
      CHECK(used == std::min(failure + 1, max));
    }
  }
}

// A running 2:3 job of nodes a and b (formed by the last call at T0 + 1 s).
State Running(int max_restarts = 1) {
  Settings s = Nodes(2, 3);
  s.max_restarts = max_restarts;
  State st = Start(s);
  st = OnJoin(st, Node("a"), s, T0).state;
  st = OnJoin(st, Node("b"), s, T0).state;
  auto t = OnTick(st, T0 + 1s);
  REQUIRE(Only<FormRound>(t.actions) != nullptr);
  return t.state;
}

State Rejoin(State st, TimePoint now, std::initializer_list<const char*> hosts) {
  for (const char* h : hosts) st = OnJoin(st, Node(h), st.settings, now).state;
  return OnTick(st, now + 1s).state;
}

TEST_CASE("a worker failure stops every node, the re-formed round carries the restart count",
          "[rules]") {
  State st = Running(/*max_restarts=*/1);
  auto t = OnWorkerFailed(st, "b#1", Said("rank 3 on b: exit code 7"), T0 + 10s);
  const auto* stop = Only<StopAndRejoin>(t.actions);
  REQUIRE(stop != nullptr);
  CHECK(stop->spends_restart);
  CHECK(stop->reason == "rank 3 on b: exit code 7");
  CHECK(stop->kind == crun::rdzv::kStopPeer);
  CHECK(stop->fault_ago == 0ms);
  CHECK(t.state.restarts_used == 1);
  st = t.state;
  st = OnJoin(st, Node("b"), st.settings, T0 + 10s).state;
  auto formed = OnJoin(st, Node("a"), st.settings, T0 + 10s);
  formed = OnTick(formed.state, T0 + 11s);
  const auto* round = Only<FormRound>(formed.actions);
  REQUIRE(round != nullptr);
  CHECK(round->round == 1);
  CHECK(round->waited_for_nodes == 0s);  // both were back at once
  CHECK(round->restart_count == 1);      // the same job-wide number on every node
  // The budget is spent: the next failure fails the job everywhere.
  auto fail =
      OnWorkerFailed(formed.state, "a#1", Said("rank 0 on a: signal 9 (SIGKILL)"), T0 + 20s);
  const auto* f = Only<FailJob>(fail.actions);
  REQUIRE(f != nullptr);
  CHECK(f->reason == "rank 0 on a: signal 9 (SIGKILL) (after 1 restarts)");
}

// A failure of rank 3 on b, the way `way` says, before any progress or after some.
Failure Crash(const std::string& way, bool before_progress = true) {
  return {"rank 3 (local rank 1) on b failed with " + way, "rank 3 (local rank 1) on b failed", "",
          way, before_progress};
}

TEST_CASE("a failed job's exit code: its own, else the deciding failure's, else 1", "[rules]") {
  struct Row {
    int own;
    std::optional<int> root;
    int expected;
  };
  const Row rows[] = {{0, std::nullopt, 1}, {0, 137, 137}, {87, std::nullopt, 87}, {87, 3, 87}};
  for (const Row& r : rows) {
    INFO(r.own << " " << r.root.value_or(-1));
    CHECK(crun::rdzv::FailedJobExitCode(FailJob{"why", r.own}, r.root) == r.expected);
  }
}

TEST_CASE("crash loops: K failures in a row, the same way, before any progress", "[rules]") {
  struct Row {
    const char* name;
    std::vector<Failure> failures;
    int limit;
    int stops_at;  // the failure (0-based) that declares the loop; -1: none does
  };
  const Failure a = Crash("exit code 1: ImportError: no module named x");
  const Failure b = Crash("exit code 1: ValueError: bad");
  const Failure a_late = Crash("exit code 1: ImportError: no module named x", false);
  const Failure unknown = Crash("", true);
  const std::vector<Row> rows = {
      {"the same way K times", {a, a, a}, 3, 2},
      {"K = 1 stops at the first", {a}, 1, 0},
      {"0 never stops", {a, a, a, a, a}, 0, -1},
      {"another way starts over", {a, a, b, b, b}, 3, 4},
      {"progress starts over", {a, a, a_late, a, a, a}, 3, 5},
      {"only progress: never", {a_late, a_late, a_late, a_late}, 3, -1},
      {"a way unknown (no failures) counts nothing", {a, a, unknown, a, a}, 3, -1},
      {"alternating ways never", {a, b, a, b, a, b}, 2, -1},
  };
  for (const auto& row : rows) {
    INFO(row.name);
    crun::rdzv::CrashLoop loop;
    int stopped = -1;
    for (std::size_t i = 0; i < row.failures.size() && stopped < 0; ++i) {
      if (crun::rdzv::CountCrash(loop, row.failures[i], row.limit)) stopped = static_cast<int>(i);
    }
    CHECK(stopped == row.stops_at);
  }
}

TEST_CASE("a crash loop fails the job with do-not-requeue, before the budget is spent", "[rules]") {
  for (const int max_restarts : {2, 10}) {
    INFO("max restarts " << max_restarts);
    State st = Running(max_restarts);
    REQUIRE(st.settings.max_restarts_without_progress == 3);  // the default
    Failure f = Crash("exit code 1");
    f.last_line = "ImportError: no module named x";
    for (int attempt = 0; attempt < 2; ++attempt) {
      auto t = OnWorkerFailed(st, "b#1", f, T0 + 10s);
      REQUIRE(Only<StopAndRejoin>(t.actions) != nullptr);
      st = Rejoin(t.state, T0 + 10s, {"a", "b"});
    }
    auto t = OnWorkerFailed(st, "b#1", f, T0 + 20s);
    const auto* fail = Only<FailJob>(t.actions);
    REQUIRE(fail != nullptr);
    CHECK(fail->exit_code == crun::report::kExitDoNotRequeue);
    CHECK(fail->reason.rfind("crash loop: rank 3 (local rank 1) on b failed in 3 attempts before "
                             "any step: ImportError: no module named x (--max-restarts-without-"
                             "progress 3",
                             0) == 0);
    CHECK(t.state.phase == crun::rdzv::Phase::kFailed);
    CHECK(t.state.restarts_used == 2);
  }
  // The same failures after progress spend the budget and end with the root cause's code.
  State st = Running(2);
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto t = OnWorkerFailed(st, "b#1", Crash("exit code 1", false), T0 + 10s);
    REQUIRE(Only<StopAndRejoin>(t.actions) != nullptr);
    st = Rejoin(t.state, T0 + 10s, {"a", "b"});
  }
  auto t = OnWorkerFailed(st, "b#1", Crash("exit code 1", false), T0 + 20s);
  const auto* fail = Only<FailJob>(t.actions);
  REQUIRE(fail != nullptr);
  CHECK(fail->exit_code == 0);
  CHECK(fail->reason == "rank 3 (local rank 1) on b failed with exit code 1 (after 2 restarts)");
}

TEST_CASE("repeated failures: K in a row, the same way, progress or not", "[rules]") {
  struct Row {
    const char* name;
    std::vector<Failure> failures;
    int limit;
    int stops_at;  // the failure (0-based) that ends the job; -1: none does
  };
  const Failure a = Crash("exit code 1: ValueError: bad batch 1200", false);
  const Failure a_early = Crash("exit code 1: ValueError: bad batch 1200", true);
  const Failure b = Crash("exit code 1: RuntimeError: NCCL timeout", false);
  const Failure unknown = Crash("", false);
  const std::vector<Row> rows = {
      {"the same way after progress K times", {a, a, a}, 3, 2},
      {"before progress or not, alike", {a_early, a, a}, 3, 2},
      {"0 never stops", {a, a, a, a, a}, 0, -1},
      {"another way starts over", {a, a, b, a, a, a}, 3, 5},
      {"a way unknown counts nothing", {a, a, unknown, a, a}, 3, -1},
  };
  for (const auto& row : rows) {
    INFO(row.name);
    State st = Running(100);
    st.settings.max_restarts_without_progress = 0;  // the crash loop's limit apart
    st.settings.max_repeated_failures = row.limit;
    int stopped = -1;
    for (std::size_t i = 0; i < row.failures.size() && stopped < 0; ++i) {
      auto t = OnWorkerFailed(st, "b#1", row.failures[i], T0 + 10s);
      if (const auto* fail = Only<FailJob>(t.actions)) {
        stopped = static_cast<int>(i);
        CHECK(fail->exit_code == crun::report::kExitDoNotRequeue);
        CHECK(fail->reason.rfind("repeated failure: rank 3 (local rank 1) on b failed in " +
                                     std::to_string(row.limit) +
                                     " attempts in a row, progress or not",
                                 0) == 0);
        CHECK(fail->reason.find("(--max-repeated-failures " + std::to_string(row.limit)) !=
              std::string::npos);
      } else {
        REQUIRE(Only<StopAndRejoin>(t.actions) != nullptr);
        st = Rejoin(t.state, T0 + 10s, {"a", "b"});
      }
    }
    CHECK(stopped == row.stops_at);
  }
}

TEST_CASE("agents that differ on --max-restarts-without-progress are refused, naming it",
          "[rules]") {
  Settings mine = Nodes(2, 2), theirs = Nodes(2, 2);
  theirs.max_restarts_without_progress = 0;
  const auto s = mine.CheckCompatible(theirs);
  CHECK_THAT(s.message(), Catch::Contains("--max-restarts-without-progress differs: this job "
                                          "uses 3, the joining agent 0"));
  mine.max_restarts_without_progress = -1;
  CHECK_THAT(mine.Validate().message(), Catch::Contains("max restarts without progress (-1)"));
}

TEST_CASE("a lost node re-forms the job without spending the budget", "[rules]") {
  State st = Running(/*max_restarts=*/0);
  auto t = OnNodeLost(st, "a#1", T0 + 5s, "its session ended");
  const auto* stop = Only<StopAndRejoin>(t.actions);
  REQUIRE(stop != nullptr);
  CHECK_FALSE(stop->spends_restart);
  CHECK(stop->reason == "node a (a#1) was lost: its session ended");
  CHECK(stop->kind == crun::rdzv::kStopNodeLost);
  CHECK(stop->fault_ago == 0ms);  // a session that ended: now
  CHECK(t.state.restarts_used == 0);
  // Only b comes back: below min, so the job waits for the join deadline, then fails naming a.
  st = OnJoin(t.state, Node("b"), t.state.settings, T0 + 5s).state;
  auto fail = OnTick(st, T0 + 5s + 60s);
  const auto* f = Only<FailJob>(fail.actions);
  REQUIRE(f != nullptr);
  CHECK_THAT(f->reason, Catch::Contains("only 1 of at least 2") && Catch::Contains("lost: a"));
}

TEST_CASE("a node whose health check failed stays out, is counted and named", "[rules][health]") {
  // (what the state holds for the node when its report comes, what follows)
  const Settings s = Nodes(2, 3);
  SECTION("before it ever joined: a smaller round goes on with the others") {
    State st = Start(s);
    st = OnJoin(st, Node("a"), s, T0).state;
    auto t = OnUnhealthy(st, {"c#1", "c", "gpu: GPU 1 has 2 uncorrectable ECC errors"}, T0);
    CHECK(t.actions.empty());
    CHECK(t.state.unhealthy_reports == 1);
    REQUIRE(t.state.unhealthy.size() == 1);
    CHECK(t.state.unhealthy[0].host == "c");
    t = OnJoin(t.state, Node("b"), s, T0 + 1s);
    t = OnTick(t.state, T0 + 2s);
    const auto* round = Only<FormRound>(t.actions);
    REQUIRE(round != nullptr);
    CHECK(round->assignments.size() == 2);
  }
  SECTION("waiting in the gathering (a re-join it made before): it leaves it") {
    State st = Start(s);
    st = OnJoin(st, Node("a"), s, T0).state;
    st = OnJoin(st, Node("c"), s, T0).state;
    REQUIRE(st.last_call_deadline.has_value());
    auto t = OnUnhealthy(st, {"c#1", "c", "disk: /logs has 1 MiB free"}, T0 + 100ms);
    CHECK(t.state.joined.size() == 1);
    CHECK(t.state.present.count("c#1") == 0);
    CHECK_FALSE(t.state.last_call_deadline.has_value());  // below min again
    CHECK(OnTick(t.state, T0 + 2s).actions.empty());
  }
  SECTION("a spare: it is no longer one") {
    State st = Running();
    st.spares = {Node("c")};
    st.present.insert("c#1");
    auto t = OnUnhealthy(st, {"c#1", "c", "memory"}, T0 + 5s);
    CHECK(t.actions.empty());
    CHECK(t.state.spares.empty());
    CHECK(t.state.phase == Phase::kRunning);
  }
  SECTION("a member of the running round (none runs a gate): its loss") {
    auto t = OnUnhealthy(Running(), {"a#1", "a", "nic down"}, T0 + 5s);
    const auto* stop = Only<StopAndRejoin>(t.actions);
    REQUIRE(stop != nullptr);
    CHECK(stop->reason == "node a (a#1) was lost: it failed its health check");
    CHECK_FALSE(stop->spends_restart);
  }
  SECTION("too few nodes by the deadline: the reason names it and why") {
    State st = Start(s);
    st = OnJoin(st, Node("a"), s, T0).state;
    st = OnUnhealthy(st, {"c#1", "c", "health check `x` failed with exit code 4"}, T0).state;
    auto t = OnTick(st, T0 + 60s);
    const auto* fail = Only<FailJob>(t.actions);
    REQUIRE(fail != nullptr);
    CHECK(fail->reason ==
          "only 1 of at least 2 nodes joined within 60000 ms (joined: a); failed their health "
          "check: c (c#1): health check `x` failed with exit code 4");
  }
  SECTION("the same node again: counted twice, named once with its newest reason") {
    State st = Start(s);
    st = OnUnhealthy(st, {"c#1", "c", "first"}, T0).state;
    st = OnUnhealthy(st, {"c#1", "c", "second"}, T0 + 1s).state;
    CHECK(st.unhealthy_reports == 2);
    REQUIRE(st.unhealthy.size() == 1);
    CHECK(st.unhealthy[0].reason == "second");
  }
  SECTION("bounded: the newest kMaxUnhealthyKept") {
    State st = Start(s);
    for (std::size_t i = 0; i < crun::rdzv::kMaxUnhealthyKept + 3; ++i) {
      st = OnUnhealthy(st, {"n" + std::to_string(i), "h", "r"}, T0).state;
    }
    CHECK(st.unhealthy.size() == crun::rdzv::kMaxUnhealthyKept);
    CHECK(st.unhealthy.front().node_id == "n3");
  }
}

TEST_CASE("missing heartbeats mark a node lost within the heartbeat timeout", "[rules]") {
  State st = Running();
  st = OnHeartbeat(st, "a#1", T0 + 3s).state;  // a is alive, b has said nothing since T0 + 1 s
  auto quiet = OnTick(st, T0 + 3999ms);
  CHECK(quiet.actions.empty());
  CHECK(quiet.wake_at == T0 + 4s);
  auto t = OnTick(st, T0 + 4s);
  const auto* stop = Only<StopAndRejoin>(t.actions);
  REQUIRE(stop != nullptr);
  CHECK(stop->reason ==
        "node b (b#1) was lost: no heartbeat for 3000 ms (heartbeat_timeout 3000 ms)");
  CHECK(stop->kind == crun::rdzv::kStopNodeLost);
  CHECK(stop->fault_ago == 3s);  // its last heartbeat: the fault, for the goodput ledger
}

TEST_CASE("late joiners scale up below max and are spares at max", "[rules]") {
  State st = Running();
  auto t = OnJoin(st, Node("c"), st.settings, T0 + 2s);
  const auto* stop = Only<StopAndRejoin>(t.actions);
  REQUIRE(stop != nullptr);
  CHECK_FALSE(stop->spends_restart);
  CHECK(stop->reason == "node c joined: scaling up");
  CHECK(stop->kind == crun::rdzv::kStopScaleUp);
  st = OnJoin(t.state, Node("a"), st.settings, T0 + 2s).state;
  auto formed = OnJoin(st, Node("b"), st.settings, T0 + 2s);  // the third: max, at once
  REQUIRE(Only<FormRound>(formed.actions) != nullptr);
  CHECK(formed.state.members.size() == 3);
  auto spare = OnJoin(formed.state, Node("d"), st.settings, T0 + 3s);
  // Told at once that it waits as a spare, and nothing else happens.
  const auto* told = Only<KeepAsSpare>(spare.actions);
  REQUIRE(told != nullptr);
  CHECK(told->node_id == "d#1");
  CHECK(told->round == formed.state.round);
  REQUIRE(spare.state.spares.size() == 1);
  CHECK(spare.state.spares[0].node_id == "d#1");
}

TEST_CASE("the job succeeds when every member has", "[rules]") {
  State st = Running();
  auto one = OnNodeSucceeded(st, "a#1", T0 + 2s);
  CHECK(one.actions.empty());
  // a is done: its silence from now on is no loss, while b keeps beating.
  auto later = OnHeartbeat(one.state, "b#1", T0 + 4s);
  later = OnTick(later.state, T0 + 6s);
  CHECK(later.actions.empty());
  auto both = OnNodeSucceeded(later.state, "b#1", T0 + 6s);
  REQUIRE(Only<SucceedJob>(both.actions) != nullptr);
  CHECK(both.state.phase == Phase::kSucceeded);
}

TEST_CASE("restarts paid from the budget are no restart storm", "[rules]") {
  // max_restarts bounds them: a job allowed 50 restarts of a fast-failing worker gets them.
  State st = Running(/*max_restarts=*/50);
  st.settings.storm_rounds = 3;
  st.settings.storm_window = 60s;
  TimePoint now = T0 + 2s;
  for (int i = 0; i < 20; ++i) {
    auto failed = OnWorkerFailed(st, "a#1", Said("rank 0 failed with exit code 7"), now);
    REQUIRE(Only<StopAndRejoin>(failed.actions) != nullptr);
    st = Rejoin(failed.state, now, {"a", "b"});
    REQUIRE(st.phase == crun::rdzv::Phase::kRunning);
    now += 100ms;
  }
  CHECK(st.restarts_used == 20);
  CHECK(st.round_times.size() == 1);  // the first round only
  // Membership changes still count, and a paid round in between does not reset them.
  for (int i = 0; i < 2; ++i) {
    st = OnNodeLost(st, "b#1", now, "its session ended").state;
    st = Rejoin(st, now, {"a", "b"});
    st = Rejoin(OnWorkerFailed(st, "a#1", Said("rank 0 failed"), now).state, now, {"a", "b"});
    now += 1s;
  }
  CHECK(st.round_times.size() == 3);
  st = OnNodeLost(st, "b#1", now, "its session ended").state;
  st = OnJoin(st, Node("a"), st.settings, now).state;
  st = OnJoin(st, Node("b"), st.settings, now).state;
  const auto t = OnTick(st, now + 1s);
  const auto* f = Only<FailJob>(t.actions);
  REQUIRE(f != nullptr);
  CHECK_THAT(f->reason, Catch::StartsWith("restart storm: 4 rounds within 60000 ms"));
}

TEST_CASE("too many rounds too fast is a restart storm", "[rules]") {
  State st = Running(/*max_restarts=*/0);
  st.settings.storm_rounds = 3;
  st.settings.storm_window = 60s;
  TimePoint now = T0 + 2s;
  // Rounds 1 and 2 after losses (not failures: the budget of 0 is not the limit here).
  for (int i = 0; i < 2; ++i) {
    st = OnNodeLost(st, "b#1", now, "its session ended").state;
    st = Rejoin(st, now, {"a", "b"});
    REQUIRE(st.phase == crun::rdzv::Phase::kRunning);
    now += 1s;
  }
  st = OnNodeLost(st, "b#1", now, "its session ended").state;
  st = OnJoin(st, Node("a"), st.settings, now).state;
  st = OnJoin(st, Node("b"), st.settings, now).state;
  auto t = OnTick(st, now + 1s);
  const auto* f = Only<FailJob>(t.actions);
  REQUIRE(f != nullptr);
  CHECK_THAT(f->reason, Catch::StartsWith("restart storm: 4 rounds within 60000 ms"));
}

TEST_CASE("a restart keeps the last round's members: a spare that rejoins first waits", "[rules]") {
  Settings s = Nodes(2, 2);
  s.max_restarts = 3;
  State st = Start(s);
  st = OnJoin(st, Node("a"), s, T0).state;
  auto formed = OnJoin(st, Node("b"), s, T0);
  REQUIRE(Only<FormRound>(formed.actions) != nullptr);
  st = OnJoin(formed.state, Node("c"), s, T0 + 1s).state;  // the spare
  REQUIRE(st.spares.size() == 1);
  st = OnWorkerFailed(st, "b#1", Said("rank 2 on b: exit code 1"), T0 + 10s).state;
  // The spare has no workers to stop: it is back first, with a; b's workers are stopping.
  st = OnJoin(st, Node("c"), s, T0 + 10s).state;
  auto t = OnJoin(st, Node("a"), s, T0 + 10100ms);
  CHECK(t.actions.empty());  // full, but b of the last round is on its way
  CHECK(t.wake_at == T0 + 11100ms);
  SECTION("b comes back within the last call: the round is a and b again, ranks as before") {
    auto back = OnJoin(t.state, Node("b"), s, T0 + 10500ms);
    const auto* round = Only<FormRound>(back.actions);
    REQUIRE(round != nullptr);
    REQUIRE(round->assignments.size() == 2);
    CHECK(round->assignments[0].node_id == "a#1");
    CHECK(round->assignments[1].node_id == "b#1");
    CHECK(round->spares == std::vector<std::string>{"c#1"});
  }
  SECTION("b does not: at the last call, the spare takes its place") {
    auto late = OnTick(t.state, T0 + 11100ms);
    const auto* round = Only<FormRound>(late.actions);
    REQUIRE(round != nullptr);
    CHECK(round->assignments[0].node_id == "a#1");
    CHECK(round->assignments[1].node_id == "c#1");
  }
  SECTION("b is lost meanwhile: nobody waits for it, the round forms now") {
    auto lost = OnNodeLost(t.state, "b#1", T0 + 10200ms, "its session ended");
    const auto* round = Only<FormRound>(lost.actions);
    REQUIRE(round != nullptr);
    CHECK(round->assignments[1].node_id == "c#1");
  }
}
