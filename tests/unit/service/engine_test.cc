// The engine as tables: sessions send messages at invented times; the test reads what each
// session was sent. Stores are counted, not opened: no sockets, threads, clocks or sleeps.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <variant>
#include <vector>

#include "metrics/registry.h"
#include "rendezvous/goodput/ledger.h"
#include "rendezvous/goodput/ledger_json.h"
#include "rendezvous/service/engine.h"
#include "rendezvous/store_server/round_store.h"
#include "tests/unit/metrics_page.h"

namespace {

using namespace std::chrono_literals;
using crun::rdzv::Engine;
using crun::rdzv::SessionId;
using crun::rdzv::TimePoint;
namespace msg = crun::rdzv::msg;

const TimePoint T0{};

class FakeStore final : public crun::rdzv::RoundStore {
 public:
  FakeStore(std::uint16_t port, int* open) : port_(port), open_(open) { ++*open_; }
  ~FakeStore() override { --*open_; }
  std::uint16_t port() const override { return port_; }

 private:
  std::uint16_t port_;
  int* open_;
};

// A join's settings; the defaults are the common two-node job.
struct JoinSpec {
  int min = 2;
  int max = 2;
  int nproc = 2;
  int max_restarts = 1;
  std::string run = "job7";
  std::string node_id = "";  // empty: the host
  std::uint32_t version = 1;
  std::string contracts = "torch";  // --contract
};

struct Harness {
  std::map<SessionId, std::vector<msg::ServiceMessage>> inbox;
  int stores_open = 0;
  int stores_started = 0;
  std::vector<std::vector<std::string>> store_allowed;                   // per store started
  std::vector<std::pair<std::uint64_t, msg::StacksResult>> stacks_done;  // AskStacks' answers
  bool store_fails = false;
  Engine engine;

  explicit Harness(crun::rdzv::EngineOptions options = {})
      : engine(crun::rdzv::EngineHooks{
                   [this](SessionId s, const msg::ServiceMessage& m) { inbox[s].push_back(m); },
                   [this](const std::string&, int, int,
                          const std::vector<std::vector<std::string>>& members)
                       -> crun::StatusOr<std::unique_ptr<crun::rdzv::RoundStore>> {
                     if (store_fails) return crun::Unavailable("port exhausted");
                     ++stores_started;
                     // Whom the service's store admits, as grpc_service.cc sets it up.
                     crun::RoundStoreSpec spec;
                     spec.members = members;
                     spec.host_runs_workers = false;
                     store_allowed.push_back(crun::RoundStoreOptions(spec).allowed_peers);
                     return std::unique_ptr<crun::rdzv::RoundStore>(
                         std::make_unique<FakeStore>(static_cast<std::uint16_t>(40000 +
                                                                                stores_started),
                                                     &stores_open));
                   },
                   nullptr,
                   [this](std::uint64_t query, const msg::StacksResult& r) {
                     stacks_done.emplace_back(query, r);
                   }},
               std::move(options)) {}

  void Join(SessionId s, const std::string& host, TimePoint t, const JoinSpec& spec = {}) {
    engine.OnMessage(s, JoinMessage(host, spec), t);
  }
  // A join arriving from `peer_ip`, declaring `declared` addresses (two-node job).
  void JoinFrom(SessionId s, const std::string& host, const std::string& peer_ip,
                std::vector<std::string> declared, TimePoint t) {
    auto m = JoinMessage(host, {});
    m.node.addresses = std::move(declared);
    engine.OnMessage(s, m, t, peer_ip);
  }
  static msg::Join JoinMessage(const std::string& host, const JoinSpec& spec) {
    msg::Join j;
    j.protocol_version = spec.version;
    j.run_id = spec.run;
    j.service_host = "10.0.0.1";
    j.node.node_id = spec.node_id.empty() ? host : spec.node_id;
    j.node.host = host;
    j.node.nproc = spec.nproc;
    j.settings.min_nodes = spec.min;
    j.settings.max_nodes = spec.max;
    j.settings.join_timeout = 60'000ms;
    j.settings.last_call_timeout = 1'000ms;
    j.settings.heartbeat_timeout = 3'000ms;
    j.settings.max_restarts = spec.max_restarts;
    j.settings.contracts = crun::ParseContracts(spec.contracts).value();
    return j;
  }
  void Heartbeat(SessionId s, TimePoint t, msg::NodeSnapshots snapshots = {}) {
    engine.OnMessage(s, msg::Heartbeat{1, snapshots, {}, 0}, t);
  }
  void Fail(SessionId s, const std::string& host, int rank, int code, TimePoint t) {
    msg::FailureReport r;
    r.host = host;
    auto& f = r.failures.emplace_back();
    f.rank = rank;
    f.exit_code = code;
    f.message = "ValueError: boom";
    engine.OnMessage(s, r, t);
  }
  void Succeed(SessionId s, TimePoint t) { engine.OnMessage(s, msg::WorkersSucceeded{}, t); }
  // The last message session `s` got; fails the test if none.
  const msg::ServiceMessage& Last(SessionId s) {
    REQUIRE_FALSE(inbox[s].empty());
    return inbox[s].back();
  }
  // Whether the last message session `s` got is a T.
  template <class T>
  bool LastIs(SessionId s) {
    return std::holds_alternative<T>(Last(s));
  }
  // The last message session `s` got, which must be a T.
  template <class T>
  const T& LastAs(SessionId s) {
    REQUIRE(LastIs<T>(s));
    return std::get<T>(Last(s));
  }
  const msg::Assignment& Assignment(SessionId s) { return LastAs<msg::Assignment>(s); }
  const msg::StopAndRejoin& Stop(SessionId s) { return LastAs<msg::StopAndRejoin>(s); }
  const msg::JobFinished& Finished(SessionId s) { return LastAs<msg::JobFinished>(s); }
  const msg::Refused& Refused(SessionId s) { return LastAs<msg::Refused>(s); }
  void Tick(TimePoint t) {
    auto wake = engine.NextWake();
    REQUIRE(wake.has_value());
    REQUIRE(*wake <= t);
    engine.OnTick(t);
  }
};

}  // namespace

TEST_CASE("engine: two nodes form a round with contiguous ranks and one store", "[engine]") {
  Harness h;
  h.Join(1, "node-b", T0, {.nproc = 3});
  CHECK(h.inbox[1].empty());
  h.Join(2, "node-a", T0 + 5ms, {});
  const auto& b = h.Assignment(1);
  const auto& a = h.Assignment(2);
  CHECK(a.group_rank == 0);  // host order: node-a first
  CHECK(a.base_rank == 0);
  CHECK(b.group_rank == 1);
  CHECK(b.base_rank == 2);
  CHECK(a.world_size == 5);
  CHECK(b.world_size == 5);
  CHECK(a.master_addr == "10.0.0.1");  // the host the agents dialed
  CHECK(a.master_port == b.master_port);
  CHECK(h.stores_open == 1);
  CHECK(a.restart_count == 0);
}

TEST_CASE("engine: every member gets each node's address and reserved ports in rank order",
          "[engine]") {
  Harness h;
  // --contract tensorflow: one port a worker.
  auto b = Harness::JoinMessage("node-b", {.nproc = 3, .contracts = "tensorflow"});
  b.node.ports = {5000, 5001, 5002};
  h.engine.OnMessage(1, b, T0, "10.0.0.2");  // no declared address: where it came from
  auto a = Harness::JoinMessage("node-a", {.contracts = "tensorflow"});
  a.node.addresses = {"192.168.1.1"};  // --local-addr wins over the session's peer
  a.node.ports = {4000, 4001};
  h.engine.OnMessage(2, a, T0 + 5ms, "10.0.0.3");
  const std::vector<msg::RoundMember> want{{"node-a", "192.168.1.1", 2, {4000, 4001}},
                                           {"node-b", "10.0.0.2", 3, {5000, 5001, 5002}}};
  // One list, the same object in every member's assignment: encoded once (Core::Encode).
  REQUIRE(h.Assignment(1).members != nullptr);
  CHECK(h.Assignment(1).members == h.Assignment(2).members);
  for (SessionId s : {1, 2}) {
    const auto& m = *h.Assignment(s).members;
    REQUIRE(m.size() == want.size());
    for (std::size_t i = 0; i < m.size(); ++i) {
      CHECK(m[i].host == want[i].host);
      CHECK(m[i].address == want[i].address);
      CHECK(m[i].nproc == want[i].nproc);
      CHECK(m[i].ports == want[i].ports);
    }
  }
  // No node reserved ports (no --contract that needs them): no list, which would cost every
  // member of a large job O(nodes).
  Harness plain;
  plain.Join(1, "node-b", T0);
  plain.Join(2, "node-a", T0 + 5ms);
  CHECK(plain.Assignment(1).members == nullptr);
  CHECK(plain.Assignment(2).members == nullptr);
  // Ports that do not fit the node's contracts: refused, naming the counts and the set.
  Harness h2;
  auto c = Harness::JoinMessage("node-c", {.min = 1, .max = 1, .nproc = 1, .contracts = "tf"});
  c.node.ports = {1, 2, 3};
  h2.engine.OnMessage(1, c, T0, "10.0.0.4");
  CHECK(h2.Refused(1).reason.find("3 reserved ports for 1 worker where --contract "
                                  "torch,tensorflow needs 1") != std::string::npos);
}

TEST_CASE("engine: MASTER_ADDR is the advertised address when one is set", "[engine]") {
  crun::rdzv::EngineOptions o;
  o.advertise_addr = "192.168.7.7";
  Harness h(o);
  h.Join(1, "a", T0, {.min = 1, .max = 1});
  CHECK(h.Assignment(1).master_addr == "192.168.7.7");
}

TEST_CASE("engine: the last call forms a round at MIN, a late node scales up", "[engine]") {
  Harness h;
  h.Join(1, "a", T0, {.max = 3});
  h.Join(2, "b", T0 + 10ms, {.max = 3});
  CHECK(h.inbox[1].empty());
  CHECK(*h.engine.NextWake() == T0 + 10ms + 1s);  // the last call
  h.Tick(T0 + 10ms + 1s);
  CHECK(h.Assignment(1).group_world_size == 2);
  const int first_round = h.Assignment(1).round;
  h.Join(3, "c", T0 + 2s, {.max = 3});
  // Scale-up: everyone is told to stop and re-join; the budget is not spent.
  CHECK(h.LastIs<msg::StopAndRejoin>(1));
  CHECK_FALSE(h.Stop(1).spends_restart);
  CHECK(h.LastIs<msg::StopAndRejoin>(2));
  CHECK(h.inbox[3].empty());                  // the newcomer has joined the new gathering already
  h.Join(3, "c", T0 + 2s + 1ms, {.max = 3});  // a repeated join changes nothing
  CHECK(h.inbox[3].empty());
  h.Join(1, "a", T0 + 2s + 5ms, {.max = 3});
  h.Join(2, "b", T0 + 2s + 6ms, {.max = 3});  // the third: MAX, so the round forms at once
  for (SessionId s : {1, 2, 3}) {
    const auto& r = h.Assignment(s);
    CHECK(r.group_world_size == 3);
    CHECK(r.round == first_round + 1);
    CHECK(r.restart_count == 0);
  }
  CHECK(h.stores_started == 2);
  CHECK(h.stores_open == 1);  // the first round's store is closed
}

TEST_CASE("engine: a worker failure restarts every node with one job-wide count", "[engine]") {
  Harness h;
  h.Join(1, "a", T0);
  ;
  h.Join(2, "b", T0);
  ;
  h.Fail(2, "b", 3, 7, T0 + 1s);
  CHECK(h.Stop(1).spends_restart);
  CHECK(h.Stop(1).reason == "rank 3 (local rank 0) on b failed with exit code 7: ValueError: boom");
  CHECK(h.LastIs<msg::StopAndRejoin>(2));
  h.Join(2, "b", T0 + 1100ms);
  ;
  h.Join(1, "a", T0 + 1200ms);
  ;
  CHECK(h.Assignment(1).restart_count == 1);
  CHECK(h.Assignment(2).restart_count == 1);

  // The budget (1) is spent: the next failure ends the job on every node, same report.
  h.Fail(1, "a", 0, 5, T0 + 2s);
  for (SessionId s : {1, 2}) {
    const auto& f = h.Finished(s);
    CHECK_FALSE(f.success);
    CHECK(f.exit_code == 5);
    REQUIRE(f.root_cause.has_value());
    CHECK(f.root_cause->host == "a");
    CHECK(f.root_cause->node_id == "a");
    CHECK(f.root_cause->failures.at(0).rank == 0);
  }
  CHECK(h.stores_open == 0);
  CHECK_FALSE(h.engine.NextWake().has_value());
}

TEST_CASE("engine: a signal's exit code is 128 + signal", "[engine]") {
  Harness h;
  h.Join(1, "a", T0, {.min = 1, .max = 1, .nproc = 1, .max_restarts = 0});
  msg::FailureReport r;
  r.failures.emplace_back().signal = 9;
  h.engine.OnMessage(1, r, T0 + 1s);
  CHECK(h.Finished(1).exit_code == 137);
}

TEST_CASE("engine: a dropped session re-forms the survivors without spending", "[engine]") {
  Harness h;
  h.Join(1, "a", T0, {.min = 1, .max = 3});
  h.Join(2, "b", T0, {.min = 1, .max = 3});
  h.Join(3, "c", T0, {.min = 1, .max = 3});
  h.engine.OnSessionClosed(2, T0 + 1s);
  CHECK(h.Stop(1).reason == "node b (b) was lost: its session ended");
  CHECK_FALSE(h.Stop(1).spends_restart);
  h.Join(1, "a", T0 + 1s, {.min = 1, .max = 3});
  h.Join(3, "c", T0 + 1s, {.min = 1, .max = 3});
  h.Tick(T0 + 2s);  // last call
  CHECK(h.Assignment(1).group_world_size == 2);
  CHECK(h.Assignment(1).restart_count == 0);
  CHECK(h.Assignment(3).group_rank == 1);
}

TEST_CASE("engine: a silent node is lost when its heartbeat is overdue", "[engine]") {
  Harness h;
  h.Join(1, "a", T0, {.min = 1});
  h.Join(2, "b", T0, {.min = 1});
  REQUIRE(h.LastIs<msg::Assignment>(1));
  for (auto t = 1s; t <= 5s; t += 1s) {
    h.Heartbeat(1, T0 + t);  // b stays silent
    if (auto w = h.engine.NextWake(); w && *w <= T0 + t) h.engine.OnTick(T0 + t);
  }
  CHECK_THAT(h.Stop(1).reason, Catch::StartsWith("node b (b) was lost: no heartbeat for "));
  CHECK(h.LastIs<msg::StopAndRejoin>(2));  // told too, in case it comes back
  auto status = h.engine.Status("job7", T0 + 5s);
  REQUIRE(status.jobs.size() == 1);
  CHECK(status.jobs.at(0).lost_hosts.at(0) == "b");
}

TEST_CASE("engine: status shows what each node's heartbeat says of its snapshots", "[engine]") {
  Harness h;
  h.Join(1, "a", T0, {.min = 2});
  h.Join(2, "b", T0, {.min = 2});
  REQUIRE(h.LastIs<msg::Assignment>(1));
  h.Heartbeat(1, T0 + 1s, {400u << 20, 1234, 1200});
  h.Heartbeat(2, T0 + 1s);
  h.Heartbeat(1, T0 + 2s, {400u << 20, 1235, 1200});  // the newest one counts
  const auto status = h.engine.Status("job7", T0 + 2s);
  REQUIRE(status.jobs.at(0).nodes.size() == 2);
  const auto& a = status.jobs.at(0).nodes.at(0);
  const auto& b = status.jobs.at(0).nodes.at(1);
  CHECK(a.node_id == "a");
  CHECK(a.snapshots.bytes == 400u << 20);
  CHECK(a.snapshots.step == 1235);
  CHECK(a.snapshots.disk_step == 1200);
  CHECK(b.snapshots.bytes == 0);
  CHECK(b.snapshots.step == -1);
}

TEST_CASE("engine: below MIN after a loss, the job fails at the join deadline", "[engine]") {
  Harness h;
  h.Join(1, "a", T0);
  ;
  h.Join(2, "b", T0);
  ;
  h.engine.OnSessionClosed(2, T0 + 1s);
  h.Join(1, "a", T0 + 1s);
  ;
  h.Tick(T0 + 61s);
  const auto& f = h.Finished(1);
  CHECK_FALSE(f.success);
  CHECK(f.exit_code == 1);
  CHECK(f.reason == "only 1 of at least 2 nodes joined within 60000 ms (joined: a); lost: b");
}

TEST_CASE("engine: joins are refused with the reason", "[engine]") {
  Harness h;
  h.Join(1, "a", T0, {.max = 4});
  h.Join(2, "b", T0, {.max = 3});
  CHECK(h.Refused(2).reason == "--nnodes differs: this job uses 2:4, the joining agent 2:3");
  h.Join(4, "c", T0, {.max = 4, .version = 2});
  CHECK(h.Refused(4).reason ==
        "protocol version 2 is not supported: this service speaks version 1");
  h.Join(5, "d", T0, {.min = 3, .max = 1});
  CHECK(h.Refused(5).reason == "max nodes (1) must be >= min nodes (3)");
  // The refused sessions are not bound: their leaving changes nothing.
  h.engine.OnSessionClosed(2, T0 + 1s);
  h.engine.OnSessionClosed(4, T0 + 1s);
  CHECK(h.engine.live_sessions() == 1);
  CHECK(h.inbox[1].empty());
}

TEST_CASE("engine: a duplicate node id while gathering fails the job for those waiting",
          "[engine]") {
  Harness h;
  h.Join(1, "a", T0, {.max = 4});
  h.Join(2, "a", T0 + 1s, {.max = 4});  // node id "a" is taken by session 1
  CHECK(h.Refused(2).reason ==
        "another agent already joined run 'job7' as node 'a' (give each agent its own node id)");
  // Session 1 would otherwise wait out its join timeout for a node that never comes.
  REQUIRE(h.inbox[1].size() == 1);
  const auto& f = h.Finished(1);
  CHECK_FALSE(f.success);
  CHECK(f.exit_code == 1);
  CHECK(f.reason.find("asked to join as node 'a', which another agent holds") != std::string::npos);
  CHECK(h.engine.Status("job7", T0 + 1s).jobs.at(0).phase == "failed");
}

namespace {

void JoinAs(Harness& h, SessionId s, const std::string& node, std::uint64_t incarnation,
            TimePoint t, int min = 2, int max = 2) {
  auto m = Harness::JoinMessage(node, {.min = min, .max = max});
  m.node.incarnation = incarnation;
  h.engine.OnMessage(s, m, t);
}

}  // namespace

TEST_CASE("engine: the same agent back on a new session takes its node over while gathering",
          "[engine]") {
  Harness h;
  JoinAs(h, 1, "a", 0xA1, T0);
  // Session 1 broke where the service cannot see it yet (a stopped daemon, a cut link);
  // agent a joins again on session 2.
  JoinAs(h, 2, "a", 0xA1, T0 + 1s);
  CHECK(h.inbox[2].empty());  // not refused
  CHECK(h.inbox[1].empty());  // and the job was not failed
  JoinAs(h, 3, "b", 0xB1, T0 + 2s);
  REQUIRE(h.LastIs<msg::Assignment>(2));
  REQUIRE(h.LastIs<msg::Assignment>(3));
  CHECK(h.inbox[1].empty());  // the old session hears nothing more
  CHECK(h.engine.live_sessions() == 2);
  h.engine.OnSessionClosed(1, T0 + 3s);  // its end, seen late, changes nothing
  CHECK(h.engine.Status("job7", T0 + 3s).jobs.at(0).phase == "running");
}

TEST_CASE("engine: the same agent back during a round re-forms it", "[engine]") {
  Harness h;
  JoinAs(h, 1, "a", 0xA1, T0);
  JoinAs(h, 2, "b", 0xB1, T0);
  REQUIRE(h.LastIs<msg::Assignment>(1));
  JoinAs(h, 3, "a", 0xA1, T0 + 1s);
  CHECK(h.Stop(2).reason == "node a (a) was lost: it came back on a new session");
  CHECK_FALSE(h.Stop(2).spends_restart);
  JoinAs(h, 2, "b", 0xB1, T0 + 2s);  // b re-joins on its session, as agents do
  REQUIRE(h.LastIs<msg::Assignment>(3));
  CHECK(h.Assignment(3).round == 1);
  CHECK(h.Assignment(3).restart_count == 0);
}

TEST_CASE("engine: another agent with a taken node id is still refused", "[engine]") {
  Harness h;
  JoinAs(h, 1, "a", 0xA1, T0);
  JoinAs(h, 2, "a", 0xA2, T0 + 1s);
  CHECK(h.Refused(2).reason.find("another agent already joined") == 0);
  Harness unknown;  // incarnation 0 (an older agent): never taken for the same agent
  JoinAs(unknown, 1, "c", 0, T0);
  JoinAs(unknown, 2, "c", 0, T0 + 1s);
  CHECK(unknown.Refused(2).reason.find("another agent already joined") == 0);
}

TEST_CASE("engine: a duplicate node id of a running job is only refused", "[engine]") {
  Harness h;
  h.Join(1, "a", T0, {.min = 1});
  h.Join(2, "b", T0, {.min = 1});
  REQUIRE(h.LastIs<msg::Assignment>(1));
  const auto before = h.inbox[1].size();
  h.Join(3, "a", T0 + 1s, {.min = 1});
  CHECK(h.Refused(3).reason.find("another agent already joined") == 0);
  CHECK(h.inbox[1].size() == before);  // the running job is not disturbed
}

TEST_CASE("engine: two run ids are independent jobs", "[engine]") {
  Harness h;
  h.Join(1, "a", T0, {.min = 1, .max = 1, .nproc = 1, .max_restarts = 0, .run = "job1"});
  h.Join(2, "a", T0,
         {.nproc = 4, .max_restarts = 0, .run = "job2"});  // same node id, other job: fine
  CHECK(h.Assignment(1).world_size == 1);
  CHECK(h.inbox[2].empty());
  h.Join(3, "b", T0, {.nproc = 4, .max_restarts = 0, .run = "job2"});
  CHECK(h.Assignment(2).world_size == 8);
  CHECK(h.stores_open == 2);
  h.Succeed(1, T0 + 1s);
  CHECK(h.Finished(1).success);
  CHECK(h.Finished(1).exit_code == 0);
  CHECK(h.inbox[2].size() == 1);  // job2 untouched
  auto all = h.engine.Status("", T0 + 1s);
  REQUIRE(all.jobs.size() == 2);
  CHECK(all.jobs.at(0).phase == "succeeded");
  CHECK(all.jobs.at(1).phase == "running");
  CHECK(all.jobs.at(1).nodes.size() == 2);
}

TEST_CASE("engine: a finished run id starts afresh once its agents are gone", "[engine]") {
  Harness h;
  h.Join(1, "a", T0, {.min = 1, .max = 1, .nproc = 1, .max_restarts = 0});
  h.Fail(1, "a", 0, 3, T0 + 1s);
  CHECK(h.Finished(1).exit_code == 3);
  h.Join(2, "a", T0 + 2s,
         {.min = 1,
          .max = 1,
          .nproc = 1,
          .max_restarts = 0});  // session 1 still open: the job has ended
  CHECK(h.Refused(2).reason ==
        "another agent already joined run 'job7' as node 'a' (give each agent its own node id)");
  h.engine.OnSessionClosed(1, T0 + 3s);
  h.Join(2, "a", T0 + 4s, {.min = 1, .max = 1, .nproc = 1, .max_restarts = 0});
  CHECK(h.Assignment(2).round == 0);
}

TEST_CASE("engine: a store that cannot start fails the job with the reason", "[engine]") {
  Harness h;
  h.store_fails = true;
  h.Join(1, "a", T0, {.min = 1, .max = 1});
  CHECK(h.Finished(1).reason == "cannot start the worker store of round 0: port exhausted");
}

TEST_CASE("engine: spares get told they wait, and replace a lost node", "[engine]") {
  Harness h;
  h.Join(1, "a", T0, {.min = 1});
  h.Join(2, "b", T0, {.min = 1});
  h.Join(3, "c", T0 + 1s, {.min = 1});
  // Told at once that it waits outside round 0, with no ranks and no store.
  REQUIRE(h.inbox[3].size() == 1);
  CHECK(h.Assignment(3).spare);
  CHECK(h.Assignment(3).round == 0);
  CHECK(h.Assignment(3).master_port == 0);
  h.engine.OnSessionClosed(1, T0 + 2s);
  CHECK(h.LastIs<msg::StopAndRejoin>(3));
  h.Join(2, "b", T0 + 2s, {.min = 1});
  h.Join(3, "c", T0 + 2s, {.min = 1});  // MAX again at once
  CHECK(h.Assignment(3).group_world_size == 2);
  CHECK(h.Assignment(3).group_rank == 1);
}

TEST_CASE("a round's store admits the addresses its members joined from and declared", "[engine]") {
  Harness h;
  h.JoinFrom(1, "node-a", "10.0.0.2", {}, T0);
  h.JoinFrom(2, "node-b", "10.0.0.3", {"192.168.7.3"}, T0);
  REQUIRE(h.stores_started == 1);
  auto allowed = h.store_allowed.at(0);
  std::sort(allowed.begin(), allowed.end());
  CHECK(allowed == std::vector<std::string>{"10.0.0.2", "10.0.0.3", "192.168.7.3"});
}

TEST_CASE("a member of unknown address leaves the round's store without a list", "[engine]") {
  Harness h;
  h.JoinFrom(1, "node-a", "10.0.0.2", {}, T0);
  h.JoinFrom(2, "node-b", "", {}, T0);  // e.g. a session that is not over TCP
  REQUIRE(h.stores_started == 1);
  CHECK(h.store_allowed.at(0).empty());
}

// ---- stacks (docs/hangs.md) ---------------------------------------------------------------------

TEST_CASE(
    "engine: a hung node's request for stacks goes to the other members and comes back "
    "with their answers",
    "[engine][stacks]") {
  Harness h;
  h.Join(1, "a", T0, {.min = 3, .max = 4});
  h.Join(2, "b", T0, {.min = 3, .max = 4});
  h.Join(3, "c", T0, {.min = 3, .max = 4});
  h.Join(4, "d", T0, {.min = 3, .max = 4});
  REQUIRE(h.LastIs<msg::Assignment>(1));
  h.engine.OnMessage(2, msg::StacksWanted{77, "rank 2 on b hung", 5000}, T0 + 1s);
  // The others are asked (not the asker), with the reason.
  for (SessionId s : {1, 3, 4}) {
    REQUIRE(h.LastIs<msg::StacksRequest>(s));
    CHECK(h.LastAs<msg::StacksRequest>(s).reason == "rank 2 on b hung");
  }
  CHECK(h.LastIs<msg::Assignment>(2));
  const auto id = h.LastAs<msg::StacksRequest>(1).request_id;
  h.engine.OnMessage(1, msg::StacksReply{id, "stacks of a"}, T0 + 1100ms);
  h.engine.OnMessage(1, msg::StacksReply{id, "again"}, T0 + 1150ms);         // one answer per node
  h.engine.OnMessage(3, msg::StacksReply{id + 1, "wrong id"}, T0 + 1150ms);  // ignored
  h.engine.OnSessionClosed(4, T0 + 1200ms);  // d is lost before it answers
  CHECK(h.LastIs<msg::StopAndRejoin>(2));    // (its loss re-forms the round, as ever)
  h.engine.OnMessage(3, msg::StacksReply{id, "stacks of c"}, T0 + 1300ms);
  const auto& r = h.LastAs<msg::StacksResult>(2);
  CHECK(r.request_id == 77);
  CHECK(r.run_id == "job7");
  CHECK(r.nodes == std::vector<std::string>{"stacks of a", "stacks of c"});
  CHECK(r.missing == std::vector<std::string>{"d (its session ended)"});
}

TEST_CASE("engine: nodes that do not answer by the deadline are named missing",
          "[engine][stacks]") {
  Harness h;
  h.Join(1, "a", T0);
  h.Join(2, "b", T0);
  CHECK(h.engine.AskStacks("job7", 5, 3s, T0 + 1s).ok());
  const auto id = h.LastAs<msg::StacksRequest>(1).request_id;
  CHECK(h.LastAs<msg::StacksRequest>(1).reason == crun::kStacksCommandReason);
  h.engine.OnMessage(2, msg::StacksReply{id, "stacks of b"}, T0 + 2s);
  h.Heartbeat(1, T0 + 2s);  // a is alive, only silent about its stacks
  h.Heartbeat(2, T0 + 2s);
  h.engine.OnTick(T0 + 3900ms);
  CHECK(h.stacks_done.empty());
  h.Tick(T0 + 4s);
  REQUIRE(h.stacks_done.size() == 1);
  CHECK(h.stacks_done[0].first == 5);
  CHECK(h.stacks_done[0].second.nodes == std::vector<std::string>{"stacks of b"});
  CHECK(h.stacks_done[0].second.missing == std::vector<std::string>{"a (no answer in time)"});
  h.engine.OnMessage(1, msg::StacksReply{id, "late"}, T0 + 5s);  // after the answer: dropped
  CHECK(h.stacks_done.size() == 1);
  CHECK(h.LastIs<msg::StacksRequest>(1));  // the round runs on
}

TEST_CASE(
    "engine: stacks of an unknown or gathering job are refused at once, answers past the "
    "size bound are named missing",
    "[engine][stacks]") {
  Harness h;
  CHECK(h.engine.AskStacks("nope", 1, 3s, T0).message() == "no job with run id 'nope'");
  h.Join(1, "a", T0);
  CHECK(h.engine.AskStacks("job7", 1, 3s, T0).message() ==
        "job 'job7' has no running workers (it is gathering)");
  h.engine.OnMessage(1, msg::StacksWanted{3, "hung", 1000}, T0);
  CHECK(h.LastAs<msg::StacksResult>(1).missing ==
        std::vector<std::string>{"job 'job7' has no running workers (it is gathering)"});
  h.Join(2, "b", T0);
  REQUIRE(h.engine.AskStacks("job7", 2, 3s, T0 + 1s).ok());
  const auto id = h.LastAs<msg::StacksRequest>(1).request_id;
  h.engine.OnMessage(1, msg::StacksReply{id, std::string(Engine::kMaxStacksBytes - 10, 'x')},
                     T0 + 1s);
  h.engine.OnMessage(2, msg::StacksReply{id, std::string(100, 'y')}, T0 + 1s);
  REQUIRE(h.stacks_done.size() == 1);
  CHECK(h.stacks_done[0].second.nodes.size() == 1);
  REQUIRE(h.stacks_done[0].second.missing.size() == 1);
  CHECK(h.stacks_done[0].second.missing[0].rfind("b (its stacks did not fit", 0) == 0);
}

namespace {

// An engine's metrics, and options that count into them.
struct Metered {
  crun::metrics::Registry registry;
  crun::rdzv::EngineMetrics metrics{registry};
  crun::rdzv::EngineOptions Options(std::size_t keep_finished_jobs = 64) {
    crun::rdzv::EngineOptions o;
    o.metrics = &metrics;
    o.keep_finished_jobs = keep_finished_jobs;
    return o;
  }
};

}  // namespace

TEST_CASE("engine: metrics count rounds, failures by cause, refusals and outcomes", "[engine]") {
  using crun::testing::SampleValue;
  Metered m;
  auto& registry = m.registry;
  Harness h(m.Options());
  auto value = [&](const std::string& series) {
    h.engine.RefreshMetrics(T0 + 10s);
    return SampleValue(registry.Render(), series);
  };
  h.Join(1, "a", T0);
  CHECK(value("crun_rendezvous_jobs{phase=\"gathering\"}") == 1);
  CHECK(value("crun_rendezvous_job_nodes{run_id=\"job7\",state=\"joined\"}") == 1);
  h.Join(2, "b", T0 + 250ms);  // round 0 forms 0.25 s after the first join
  CHECK(value("crun_rendezvous_jobs{phase=\"running\"}") == 1);
  CHECK(value("crun_rendezvous_jobs{phase=\"gathering\"}") == 0);
  CHECK(value("crun_rendezvous_agents_connected") == 2);
  CHECK(value("crun_rendezvous_job_nodes{run_id=\"job7\",state=\"member\"}") == 2);
  CHECK(value("crun_rendezvous_job_world_size{run_id=\"job7\"}") == 4);
  CHECK(value("crun_rendezvous_rounds_total{run_id=\"job7\"}") == 1);
  CHECK(value("crun_rendezvous_round_formation_seconds_bucket{le=\"0.1\"}") == 0);
  CHECK(value("crun_rendezvous_round_formation_seconds_bucket{le=\"0.25\"}") == 1);
  CHECK(value("crun_rendezvous_round_formation_seconds_sum") == Approx(0.25));
  h.Heartbeat(1, T0 + 1s);
  h.Heartbeat(2, T0 + 1s);
  CHECK(value("crun_rendezvous_heartbeats_total{run_id=\"job7\"}") == 2);

  // A worker fails: one restart spent; the re-joins form round 1 in 0.5 s.
  h.Fail(2, "b", 3, 7, T0 + 2s);
  CHECK(value("crun_rendezvous_failures_total{run_id=\"job7\",cause=\"exit_code\"}") == 1);
  CHECK(value("crun_rendezvous_failures_total{run_id=\"job7\",cause=\"signal\"}") == 0);
  CHECK(value("crun_rendezvous_restarts_total{run_id=\"job7\"}") == 1);
  h.Join(1, "a", T0 + 2s + 100ms);
  h.Join(2, "b", T0 + 2s + 500ms);
  CHECK(value("crun_rendezvous_rounds_total{run_id=\"job7\"}") == 2);
  CHECK(value("crun_rendezvous_round_formation_seconds_bucket{le=\"0.5\"}") == 2);
  CHECK(value("crun_rendezvous_round_formation_seconds_count") == 2);

  // A session ends mid-round: a node lost, no restart spent.
  h.engine.OnSessionClosed(2, T0 + 3s);
  CHECK(value("crun_rendezvous_failures_total{run_id=\"job7\",cause=\"node_lost\"}") == 1);
  CHECK(value("crun_rendezvous_restarts_total{run_id=\"job7\"}") == 1);
  CHECK(value("crun_rendezvous_agents_connected") == 1);

  // A join with other settings and one of another protocol version are refused, by reason.
  h.Join(3, "c", T0 + 3s, {.max = 4});
  h.Join(4, "d", T0 + 3s, {.version = 9});
  CHECK(value("crun_rendezvous_refused_total{reason=\"settings_mismatch\"}") == 1);
  CHECK(value("crun_rendezvous_refused_total{reason=\"protocol_version\"}") == 1);
  CHECK(value("crun_rendezvous_refused_total{reason=\"duplicate_node\"}") == 0);

  // b comes back, a round forms; a's worker is killed with the budget spent: the job fails.
  h.Join(1, "a", T0 + 3s);
  h.Join(5, "b", T0 + 3s + 10ms);
  REQUIRE(h.LastIs<msg::Assignment>(5));
  msg::FailureReport r;
  r.host = "a";
  r.failures.emplace_back().signal = 9;
  r.failures.back().oom = "killed by the kernel's OOM killer";
  h.engine.OnMessage(1, r, T0 + 4s);
  CHECK(value("crun_rendezvous_failures_total{run_id=\"job7\",cause=\"oom\"}") == 1);
  CHECK(value("crun_rendezvous_jobs_finished_total{outcome=\"failed\"}") == 1);
  CHECK(value("crun_rendezvous_jobs_finished_total{outcome=\"succeeded\"}") == 0);
  CHECK(value("crun_rendezvous_jobs{phase=\"failed\"}") == 1);

  // A second job whose node goes silent: heartbeat_timeout.
  h.Join(11, "x", T0, {.min = 1, .max = 2, .run = "job8"});
  h.Join(12, "y", T0, {.min = 1, .max = 2, .run = "job8"});
  for (auto t = 1s; t <= 5s; t += 1s) {
    h.Heartbeat(11, T0 + t);
    if (auto w = h.engine.NextWake(); w && *w <= T0 + t) h.engine.OnTick(T0 + t);
  }
  CHECK(value("crun_rendezvous_failures_total{run_id=\"job8\",cause=\"heartbeat_timeout\"}") == 1);
  CHECK(value("crun_rendezvous_failures_total{run_id=\"job8\",cause=\"node_lost\"}") == 0);
}

TEST_CASE("engine: a forgotten job's series go, a reused run id counts from 0", "[engine]") {
  using crun::testing::SampleValue;
  Metered m;
  auto& registry = m.registry;
  Harness h(m.Options(0));
  const JoinSpec one{.min = 1, .max = 1, .nproc = 1, .max_restarts = 0};
  h.Join(1, "a", T0, one);
  h.Succeed(1, T0 + 1s);
  CHECK(h.Finished(1).success);
  CHECK(SampleValue(registry.Render(), "crun_rendezvous_rounds_total{run_id=\"job7\"}") == 1);
  h.engine.OnSessionClosed(1, T0 + 2s);  // nobody left, nothing kept: forgotten
  h.engine.RefreshMetrics(T0 + 10s);
  const std::string page = registry.Render();
  CHECK(page.find("job7") == std::string::npos);
  CHECK(SampleValue(page, "crun_rendezvous_jobs_finished_total{outcome=\"succeeded\"}") == 1);
  CHECK(SampleValue(page, "crun_rendezvous_jobs{phase=\"succeeded\"}") == 0);

  // Kept jobs: a new job of an ended run id replaces it, its series from 0.
  Metered kept;
  auto& r2 = kept.registry;
  Harness k(kept.Options(8));
  k.Join(1, "a", T0, one);
  k.Fail(1, "a", 0, 1, T0 + 1s);
  k.engine.OnSessionClosed(1, T0 + 2s);
  CHECK(SampleValue(r2.Render(),
                    "crun_rendezvous_failures_total{run_id=\"job7\",cause=\"exit_code\"}") == 1);
  k.Join(2, "a", T0 + 3s, one);
  CHECK(SampleValue(r2.Render(),
                    "crun_rendezvous_failures_total{run_id=\"job7\",cause=\"exit_code\"}") == 0);
  CHECK(SampleValue(r2.Render(), "crun_rendezvous_rounds_total{run_id=\"job7\"}") == 1);
}

TEST_CASE("engine: a failure report's cause is its first failure's", "[engine]") {
  using crun::rdzv::FailureCause;
  msg::FailureReport r;
  CHECK(std::string(FailureCause(r)) == "exit_code");  // no detail: an exit
  auto& f = r.failures.emplace_back();
  f.exit_code = 2;
  CHECK(std::string(FailureCause(r)) == "exit_code");
  f.exit_code.reset();
  f.signal = 9;
  CHECK(std::string(FailureCause(r)) == "signal");
  f.oom = "killed by the OOM killer";
  CHECK(std::string(FailureCause(r)) == "oom");
  f.hang = "no progress for 3 s";
  CHECK(std::string(FailureCause(r)) == "hang");
  r.failures.emplace_back().exit_code = 1;  // later failures do not decide
  CHECK(std::string(FailureCause(r)) == "hang");
}

TEST_CASE("engine: a node that failed its health check is counted and named, never joined",
          "[engine][health]") {
  using crun::testing::SampleValue;
  Metered m;
  Harness h(m.Options());
  h.Join(1, "a", T0, {.min = 1, .max = 2});
  auto sick = Harness::JoinMessage("c", {.min = 1, .max = 2});
  sick.unhealthy = "gpu: GPU 1 (GPU-b) has 2 uncorrectable ECC errors since the driver loaded";
  h.engine.OnMessage(3, sick, T0 + 100ms);
  CHECK(h.inbox[3].empty());  // no assignment, no refusal: it leaves next
  h.engine.OnMessage(3, msg::Leave{"exit code 87"}, T0 + 101ms);
  h.engine.OnSessionClosed(3, T0 + 102ms);
  h.Tick(T0 + 1s);  // the last call: a round of a alone
  CHECK(h.Assignment(1).world_size == 2);
  const auto status = h.engine.Status("job7", T0 + 1s);
  const auto& job = status.jobs.at(0);
  CHECK(job.unhealthy_reports == 1);
  REQUIRE(job.nodes.size() == 2);
  CHECK(job.nodes[1].node_id == "c");
  CHECK(job.nodes[1].state == "unhealthy");
  CHECK(job.nodes[1].reason == sick.unhealthy);
  CHECK(job.lost_hosts.empty());  // it never joined: not a loss
  h.engine.RefreshMetrics(T0 + 10s);
  CHECK(SampleValue(m.registry.Render(),
                    "crun_rendezvous_unhealthy_nodes_total{run_id=\"job7\"}") == 1);
  // Healthy again later (a fresh crun on that node): it joins, and is no longer shown unhealthy.
  h.Join(4, "c", T0 + 2s, {.min = 1, .max = 2});
  const auto again = h.engine.Status("job7", T0 + 2s).jobs.at(0);
  CHECK(std::none_of(again.nodes.begin(), again.nodes.end(),
                     [](const msg::NodeStatus& n) { return n.state == "unhealthy"; }));
  CHECK(again.unhealthy_reports == 1);
}

TEST_CASE("engine: slow ranks are judged job-wide and named to every node, with their host",
          "[engine][stragglers]") {
  using crun::testing::SampleValue;
  using std::chrono::microseconds;
  Metered m;
  Harness h(m.Options());
  h.Join(1, "a", T0);  // ranks 0, 1
  h.Join(2, "b", T0);  // ranks 2, 3: both slow, equal to each other
  const int round = h.Assignment(1).round;
  auto beat = [&](SessionId s, std::int64_t window, int first_rank, microseconds us, int r) {
    msg::Heartbeat b{2, {}, {}, r};
    b.compute.push_back({first_rank, window, us});
    b.compute.push_back({first_rank + 1, window, us});
    h.engine.OnMessage(s, b, T0 + 1s);
  };
  // A round's figures from an earlier round are not this one's.
  for (std::int64_t w = 0; w < 5; ++w) beat(2, w, 2, microseconds(50'000), round - 1);
  for (std::int64_t w = 0; w < 4; ++w) {
    beat(1, w, 0, microseconds(20'000), round);
    beat(2, w, 2, microseconds(50'000), round);
  }
  CHECK_FALSE(h.LastIs<msg::Stragglers>(1));
  beat(1, 4, 0, microseconds(20'000), round);
  beat(2, 4, 2, microseconds(50'000), round);  // the fifth window over: named
  for (SessionId s : {1, 2}) {
    const auto& named = h.LastAs<msg::Stragglers>(s);
    CHECK(named.round == round);
    REQUIRE(named.changes.size() == 2);
    for (const auto& v : named.changes) {
      CHECK(v.host == "b");
      CHECK(v.change.named);
      CHECK(v.change.ratio == Approx(2.5));
      CHECK(v.change.window == 4);
    }
    CHECK(named.changes[0].change.rank + named.changes[1].change.rank == 5);
  }
  const auto status = h.engine.Status("job7", T0 + 1s).jobs.at(0);
  CHECK(status.nodes.at(0).stragglers.empty());
  CHECK(status.nodes.at(1).stragglers.size() == 2);
  h.engine.RefreshMetrics(T0 + 10s);
  CHECK(SampleValue(m.registry.Render(), "crun_rendezvous_stragglers_total{run_id=\"job7\"}") == 2);
  // A new round starts over: nobody named.
  h.Fail(1, "a", 0, 1, T0 + 2s);
  h.Join(1, "a", T0 + 3s);
  h.Join(2, "b", T0 + 3s);
  CHECK(h.Assignment(1).round > round);
  const auto after = h.engine.Status("job7", T0 + 3s).jobs.at(0);
  CHECK(after.nodes.at(1).stragglers.empty());
}

TEST_CASE("engine: a node's figures count for its own ranks only", "[engine][stragglers]") {
  using std::chrono::microseconds;
  Harness h;
  h.Join(1, "a", T0);  // ranks 0, 1
  h.Join(2, "b", T0);  // ranks 2, 3
  const int round = h.Assignment(1).round;
  // Node a speaks for every rank, b's as slow ones; b says nothing. Were a's word taken for b's
  // ranks, every rank would have reported and ranks 2 and 3 would be named in window 4.
  for (std::int64_t w = 0; w < 8; ++w) {
    msg::Heartbeat b{2, {}, {}, round};
    for (int rank = 0; rank < 4; ++rank) {
      b.compute.push_back({rank, w, microseconds(rank < 2 ? 20'000 : 50'000)});
    }
    h.engine.OnMessage(1, b, T0 + 1s);
  }
  CHECK_FALSE(h.LastIs<msg::Stragglers>(1));
  CHECK_FALSE(h.LastIs<msg::Stragglers>(2));
  const auto status = h.engine.Status("job7", T0 + 1s).jobs.at(0);
  CHECK(status.nodes.at(1).stragglers.empty());
}

TEST_CASE("engine: a node that leaves is lost with the reason it gave", "[engine]") {
  Harness h;
  h.Join(1, "a", T0, {.min = 1, .max = 3});
  h.Join(2, "b", T0, {.min = 1, .max = 3});
  h.Join(3, "c", T0, {.min = 1, .max = 3});
  h.engine.OnMessage(2, msg::Leave{"excluded: slow rank 3: 2.4x the others' median"}, T0 + 1s);
  CHECK(h.Stop(1).reason ==
        "node b (b) was lost: it left: excluded: slow rank 3: 2.4x the others' median");
  CHECK_FALSE(h.Stop(1).spends_restart);
  CHECK(h.LastIs<msg::StopAndRejoin>(3));
}

namespace {

// A node's ledger as its crun sends it: `training` ms of training after `starting` ms of
// starting, launched at wall time 1,000,000 ms.
std::string LedgerJson(const std::string& node, crun::goodput::Ms starting,
                       crun::goodput::Ms training, bool finished = false) {
  auto l = crun::goodput::Ledger::Launched(node, node, 1, 1'000'000);
  l.Joining(1'000'000);
  l.Assigned(1'000'000, false, 0);
  l.WorkersRunning(1'000'000);
  l.Progress(1'000'000 + starting, 0, 1);
  l.Progress(1'000'000 + starting + training, 0, 2);
  if (finished) l.Finished(1'000'000 + starting + training);
  return crun::goodput::ToJson(l.Settled()).dump();
}

}  // namespace

TEST_CASE("engine: nodes' goodput ledgers make the job's, in status, metrics and at the end",
          "[engine][goodput]") {
  Metered m;
  Harness h(m.Options());
  h.Join(1, "a", T0);
  h.Join(2, "b", T0);
  h.engine.OnTick(T0 + 1s);
  REQUIRE(h.LastIs<msg::Assignment>(1));
  CHECK_FALSE(h.engine.Status("job7", T0 + 1s).jobs.at(0).goodput);  // none sent yet
  h.engine.OnMessage(1, msg::Goodput{LedgerJson("a", 1000, 9000)}, T0 + 10s);
  h.engine.OnMessage(2, msg::Goodput{LedgerJson("b", 3000, 7000)}, T0 + 10s);
  h.engine.OnMessage(2, msg::Goodput{"{not json"}, T0 + 10s);  // ignored, the last one stays
  // 2 s later: both still train; their ledgers are carried on to now.
  const auto job = h.engine.Status("job7", T0 + 12s).jobs.at(0);
  REQUIRE(job.goodput);
  CHECK(job.goodput->known);
  CHECK(job.goodput->ratio == Approx(9000.0 / 12000.0));  // b started for 3 s of 12
  CHECK(job.goodput->incidents == 0);
  REQUIRE(job.nodes.size() == 2);
  REQUIRE(job.nodes[0].goodput);
  CHECK(job.nodes[0].goodput->ratio == Approx(11000.0 / 12000.0));
  h.engine.RefreshMetrics(T0 + 12s);
  CHECK(crun::testing::SampleValue(m.registry.Render(),
                                   "crun_rendezvous_job_goodput_seconds{run_id=\"job7\","
                                   "category=\"starting\"}") == 3);
  // A daemon that restarted has what the nodes send their new sessions: the same figures.
  Metered m2;
  Harness again(m2.Options());
  again.Join(1, "a", T0);
  again.Join(2, "b", T0);
  again.engine.OnTick(T0 + 1s);
  again.engine.OnMessage(1, msg::Goodput{LedgerJson("a", 1000, 9000)}, T0 + 10s);
  again.engine.OnMessage(2, msg::Goodput{LedgerJson("b", 3000, 7000)}, T0 + 10s);
  CHECK(again.engine.Status("job7", T0 + 12s).jobs.at(0).goodput->ratio == job.goodput->ratio);
  // The end: every node gets every node's last ledger, to combine the job's.
  h.engine.OnMessage(1, msg::Goodput{LedgerJson("a", 1000, 11000, true)}, T0 + 12s);
  h.Succeed(1, T0 + 12s);
  h.Succeed(2, T0 + 12s);
  const auto& end = h.Finished(1);
  REQUIRE(end.goodput.size() == 2);
  CHECK(end.goodput[0].find("\"node\":\"a\"") != std::string::npos);
  CHECK(end.goodput[0].find("\"finished\":true") != std::string::npos);
}
