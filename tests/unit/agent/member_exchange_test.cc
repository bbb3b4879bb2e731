// The static rendezvous's exchange of addresses and ports (agent/rendezvous/member_exchange.h):
// the members as tables of participants, the bad words one may publish, and the exchange
// itself over a MemoryStore with participants as threads, in random orders.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <thread>

#include "agent/rendezvous/member_exchange.h"
#include "rendezvous/store/memory_store.h"

using crun::ContractSet;
using crun::Millis;
using crun::StatusCode;
using crun::agent::EncodeParticipant;
using crun::agent::ExchangeKey;
using crun::agent::ExchangeOptions;
using crun::agent::MembersOf;
using crun::agent::Participant;
using crun::agent::RoundMember;

namespace {

ContractSet Contracts(const char* list) { return crun::ParseContracts(list).value(); }
// Each worker's own port (TF_CONFIG) and the node's JAX coordinator.
const ContractSet kTfJax = Contracts("tensorflow,jax");
const ContractSet kAllThree = Contracts("tensorflow,jax,horovod");
const ContractSet kTf = Contracts("tensorflow");

Participant Make(int index, int node, int local_rank, int nproc, std::vector<std::uint16_t> ports) {
  Participant p;
  p.index = index;
  p.node = node;
  p.local_rank = local_rank;
  p.nproc = nproc;
  p.host = "host" + std::to_string(node);
  p.address = "10.0.0." + std::to_string(node + 1);
  p.ports = std::move(ports);
  return p;
}

}  // namespace

TEST_CASE("static nodes: one member each, in node order, whatever order they came in") {
  // Two nodes of 2 workers, each with one port beyond its workers' (JAX's coordinator).
  auto members =
      MembersOf({Make(1, 1, 0, 2, {2000, 2001, 2002}), Make(0, 0, 0, 2, {1000, 1001, 1002})},
                kTfJax);
  REQUIRE(members.ok());
  REQUIRE(members->size() == 2);
  CHECK((*members)[0].host == "host0");
  CHECK((*members)[0].address == "10.0.0.1");
  CHECK((*members)[0].nproc == 2);
  CHECK((*members)[0].ports == std::vector<std::uint16_t>{1000, 1001, 1002});
  CHECK((*members)[1].ports == std::vector<std::uint16_t>{2000, 2001, 2002});
}

TEST_CASE("Slurm tasks: a node's tasks make one member, the extras of its local rank 0 last") {
  // srun -N2 --ntasks-per-node=2 (block): tasks 0,1 on node 0 and 2,3 on node 1; each task
  // reserved its worker's port and two beyond (JAX's and Horovod's).
  std::vector<Participant> tasks = {Make(0, 0, 0, 1, {100, 101, 102}),
                                    Make(1, 0, 1, 1, {110, 111, 112}),
                                    Make(2, 1, 0, 1, {200, 201, 202}),
                                    Make(3, 1, 1, 1, {210, 211, 212})};
  std::mt19937 random(7);
  for (int order = 0; order < 24; ++order) {
    std::shuffle(tasks.begin(), tasks.end(), random);
    auto members = MembersOf(tasks, kAllThree);
    REQUIRE(members.ok());
    REQUIRE(members->size() == 2);
    CHECK((*members)[0].nproc == 2);
    CHECK((*members)[0].ports == std::vector<std::uint16_t>{100, 110, 101, 102});
    CHECK((*members)[1].nproc == 2);
    CHECK((*members)[1].ports == std::vector<std::uint16_t>{200, 210, 201, 202});
  }
}

TEST_CASE("participants that do not make whole nodes are refused, naming them") {
  struct Case {
    const char* what;
    std::vector<Participant> all;
    const char* says;
  };
  const Case cases[] = {
      {"a missing node",
       {Make(0, 0, 0, 1, {1}), Make(1, 2, 0, 1, {2})},
       "node 1 has no participant"},
      {"a node without local rank 0", {Make(0, 0, 1, 1, {1})}, "node 0 starts at local rank 1"},
      {"a repeated local rank",
       {Make(0, 0, 0, 1, {1}), Make(1, 0, 0, 1, {2})},
       "participant 1 runs local rank 0 of node 0 where local rank 1 was next"},
      {"a gap in local ranks",
       {Make(0, 0, 0, 1, {1}), Make(1, 0, 2, 1, {2})},
       "participant 1 runs local rank 2"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    auto members = MembersOf(c.all, kTf);
    REQUIRE_FALSE(members.ok());
    CHECK_THAT(members.status().message(), Catch::Contains(c.says));
  }
}

TEST_CASE("what a participant publishes is read back, and garbage is named") {
  const Participant p = Make(3, 1, 1, 2, {4000, 4001, 4002});
  auto back = crun::agent::DecodeParticipant(EncodeParticipant(p), 3, kTfJax);
  REQUIRE(back.ok());
  CHECK(back->index == 3);
  CHECK(back->node == 1);
  CHECK(back->local_rank == 1);
  CHECK(back->nproc == 2);
  CHECK(back->host == "host1");
  CHECK(back->address == "10.0.0.2");
  CHECK(back->ports == p.ports);
  const std::pair<const char*, const char*> bad[] = {
      {"not json", "not a JSON object"},
      {"[1,2]", "not a JSON object"},
      {R"({"node":-1,"local_rank":0,"nproc":1,"host":"h","address":"a","ports":[1]})",
       "no valid node"},
      {R"({"node":0,"local_rank":0,"nproc":1,"host":"h","ports":[1]})", "no host, address"},
      {R"({"node":0,"local_rank":0,"nproc":1,"host":"h","address":"a","ports":[70000]})",
       "a port that is not one (70000)"},
      {R"({"node":0,"local_rank":0,"nproc":2,"host":"h","address":"a","ports":[1]})",
       "1 reserved ports for 2 workers where --contract torch,tensorflow,jax needs 3"},
      {R"({"node":0,"local_rank":0,"nproc":1,"host":"h","address":"a","ports":[1,2,3]})",
       "3 reserved ports for 1 worker where --contract torch,tensorflow,jax needs 2"},
  };
  for (const auto& [text, says] : bad) {
    INFO(text);
    auto got = crun::agent::DecodeParticipant(text, 5, kTfJax);
    REQUIRE_FALSE(got.ok());
    CHECK_THAT(got.status().message(), Catch::Contains("participant 5 published"));
    CHECK_THAT(got.status().message(), Catch::Contains(says));
  }
}

TEST_CASE("node ports without worker ports: jax and horovod on nodes of several workers") {
  // Static nodes of 2 and 3 workers: JAX's coordinator and Horovod's rendezvous are the node's,
  // so each node publishes two ports whatever its workers (issue 46: `participant 0 published 1
  // ports for 2 workers`).
  const ContractSet jax_horovod = Contracts("jax,horovod");
  auto nodes =
      MembersOf({Make(0, 0, 0, 2, {1000, 1001}), Make(1, 1, 0, 3, {2000, 2001})}, jax_horovod);
  REQUIRE(nodes.ok());
  CHECK((*nodes)[0].ports == std::vector<std::uint16_t>{1000, 1001});
  CHECK((*nodes)[1].nproc == 3);
  CHECK((*nodes)[1].ports == std::vector<std::uint16_t>{2000, 2001});
  // Slurm tasks of one node: only its local rank 0's node ports are kept.
  const ContractSet horovod = Contracts("horovod");
  auto tasks = MembersOf({Make(1, 0, 1, 1, {110}), Make(0, 0, 0, 1, {100})}, horovod);
  REQUIRE(tasks.ok());
  REQUIRE(tasks->size() == 1);
  CHECK((*tasks)[0].nproc == 2);
  CHECK((*tasks)[0].ports == std::vector<std::uint16_t>{100});
  // What each node publishes is read back against the same layout.
  for (const int nproc : {1, 2, 3}) {
    const Participant p = Make(0, 0, 0, nproc, {4000, 4001});
    CHECK(crun::agent::DecodeParticipant(EncodeParticipant(p), 0, jax_horovod).ok());
  }
}

TEST_CASE("every participant gets the same members, in whatever order they publish") {
  std::mt19937 random(11);
  for (int trial = 0; trial < 50; ++trial) {
    crun::MemoryStore store;
    const int n = 1 + trial % 4;
    std::vector<int> order(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
    std::shuffle(order.begin(), order.end(), random);
    std::vector<crun::StatusOr<std::vector<RoundMember>>> got(static_cast<std::size_t>(n),
                                                              crun::InternalError("not run"));
    std::vector<std::thread> threads;
    for (int i : order) {
      threads.emplace_back([&, i] {
        ExchangeOptions e;
        e.contracts = kTf;  // one port a worker
        e.round = trial;
        e.participants = n;
        e.timeout = Millis(20000);
        const auto port = static_cast<std::uint16_t>(1000 + i);
        got[static_cast<std::size_t>(i)] =
            crun::agent::ExchangeMembers(store, Make(i, i, 0, 1, {port}), e);
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < n; ++i) {
      const auto& g = got[static_cast<std::size_t>(i)];
      REQUIRE(g.ok());
      REQUIRE(static_cast<int>(g->size()) == n);
      for (int m = 0; m < n; ++m) {
        CHECK((*g)[static_cast<std::size_t>(m)].ports ==
              std::vector<std::uint16_t>{static_cast<std::uint16_t>(1000 + m)});
      }
    }
  }
}

TEST_CASE("an exchange whose peers never publish times out naming them, a stop ends it") {
  crun::MemoryStore store;
  ExchangeOptions e;
  e.contracts = kTf;  // one port a worker
  e.round = 4;
  e.participants = 3;
  e.who = "node";
  e.timeout = Millis(300);
  REQUIRE(store.Set(ExchangeKey(4, 2), EncodeParticipant(Make(2, 2, 0, 1, {9}))).ok());
  auto got = crun::agent::ExchangeMembers(store, Make(0, 0, 0, 1, {7}), e);
  REQUIRE_FALSE(got.ok());
  CHECK(got.status().code() == StatusCode::kTimeout);
  CHECK_THAT(got.status().message(), Catch::Contains("round 4: no ports from node 1 within 0.3 s"));

  std::atomic<bool> stop{true};
  e.stop = &stop;
  e.timeout = Millis(600000);
  got = crun::agent::ExchangeMembers(store, Make(0, 0, 0, 1, {7}), e);
  REQUIRE_FALSE(got.ok());
  CHECK(got.status().code() == StatusCode::kAborted);
}

TEST_CASE("a round's keys are its own: an earlier round's words are not read") {
  crun::MemoryStore store;
  REQUIRE(store.Set(ExchangeKey(0, 1), EncodeParticipant(Make(1, 1, 0, 1, {5}))).ok());
  ExchangeOptions e;
  e.contracts = kTf;  // one port a worker
  e.round = 1;
  e.participants = 2;
  e.timeout = Millis(200);
  auto got = crun::agent::ExchangeMembers(store, Make(0, 0, 0, 1, {7}), e);
  REQUIRE_FALSE(got.ok());
  CHECK_THAT(got.status().message(), Catch::Contains("round 1: no ports from node 1"));
}

TEST_CASE("a crun watching its round hears who began the next, a stop ends the watch") {
  crun::MemoryStore store;
  std::atomic<bool> stop{false};
  crun::StatusOr<crun::agent::RoundBegun> heard = crun::InternalError("not run");
  std::thread watcher([&] { heard = crun::agent::WatchForRound(store, 3, stop); });
  // Participant 1 begins round 3 (its exchange says so first); its peers have not published.
  ExchangeOptions e;
  e.contracts = kTf;  // one port a worker
  e.round = 3;
  e.participants = 2;
  e.timeout = Millis(100);
  // It began it after its workers failed: the watcher hears the failure, to weigh it too.
  e.after = crun::rdzv::Failure{"rank 1 failed", "rank 1 (local rank 0) failed with exit code 1",
                                "ValueError: x", "exit 1 @ rank 1", true};
  auto got = crun::agent::ExchangeMembers(store, Make(1, 1, 0, 1, {5}), e);
  CHECK(got.status().code() == StatusCode::kTimeout);
  watcher.join();
  REQUIRE(heard.ok());
  CHECK(heard->index == 1);
  REQUIRE(heard->after.has_value());
  CHECK(heard->after->way == "exit 1 @ rank 1");
  CHECK(heard->after->before_progress);
  CHECK(heard->after->last_line == "ValueError: x");
  // What a crun before failures were told wrote: the index alone; garbage is refused by key.
  const auto bare = crun::agent::DecodeBegun("k", "4");
  REQUIRE(bare.ok());
  CHECK(bare->index == 4);
  CHECK_FALSE(bare->after.has_value());
  CHECK_THAT(crun::agent::DecodeBegun("k", "4\n{").status().message(),
             Catch::StartsWith("k: the failure after which the round began is unreadable"));
  CHECK_FALSE(crun::agent::DecodeBegun("k", "x").ok());

  stop = true;
  auto stopped = crun::agent::WatchForRound(store, 4, stop);
  CHECK(stopped.status().code() == StatusCode::kAborted);
}
