// The etcd rendezvous's roles, each alone (agent/rendezvous/etcd/): the assignment a node reads
// from the decider's job document (a table, no etcd), and against a real etcd (Debian's
// etcd-server) this node's lease and key, and the round's store its group rank 0 serves and
// publishes.
#include <catch2/catch.hpp>

#include <set>

#include "agent/rendezvous/etcd/assignment.h"
#include "agent/rendezvous/etcd/decider.h"
#include "agent/rendezvous/etcd/election.h"
#include "agent/rendezvous/etcd/node_lease.h"
#include "agent/rendezvous/etcd/round_store.h"
#include "rendezvous/store/tcp_store_client.h"
#include "tests/unit/etcd/etcd_process.h"

namespace {

using crun::agent::EtcdAssignment;
using crun::agent::EtcdNodeLease;
using crun::agent::EtcdRoundStore;
using crun::agent::RoundSelf;
using crun::etcd::Clock;
using Ms = std::chrono::milliseconds;

crun::rdzv::Member Member(const std::string& id, int nproc) {
  crun::rdzv::Member m;
  m.node.node_id = id;
  m.node.host = "host-" + id;
  m.node.address = "10.0.0." + std::to_string(id[0] - 'a' + 1);
  m.node.nproc = nproc;
  m.node.ports = {static_cast<std::uint16_t>(30000 + nproc)};
  return m;
}

// Round 3 of a job: members a (2 workers), b (3), c (1) in group-rank order; d waits as a spare.
crun::etcd::JobDoc Round3() {
  crun::etcd::JobDoc doc;
  doc.gathering = 5;
  doc.world_size = 6;
  doc.state.round = 3;
  doc.state.restarts_used = 2;
  doc.state.members = {Member("a", 2), Member("b", 3), Member("c", 1)};
  crun::rdzv::NodeDescription spare;
  spare.node_id = "d";
  doc.state.spares = {spare};
  return doc;
}

RoundSelf Self(const std::string& id, int nproc) {
  return RoundSelf{"run7", "trainer", id, nproc, 4, false};
}

std::shared_ptr<crun::etcd::Client> Connect(const crun::testing::EtcdProcess& etcd) {
  crun::etcd::ClientOptions o;
  o.endpoints = {etcd.endpoint()};
  auto c = crun::etcd::Client::Connect(o, Clock::now() + std::chrono::seconds(20));
  REQUIRE(c.ok());
  return *c;
}

crun::etcd::NodeRecord Record(const std::string& id, std::vector<std::string> addresses = {}) {
  crun::etcd::NodeRecord r;
  r.node.node_id = id;
  r.node.host = "host-" + id;
  r.addresses = std::move(addresses);
  return r;
}

// Every key of the run, as a decider's mirror holds them.
crun::etcd::Mirror ReadAll(crun::etcd::Client& client, const crun::etcd::Keys& keys) {
  crun::etcd::Mirror m;
  auto all = client.GetPrefix(keys.prefix, Clock::now() + Ms(5000));
  REQUIRE(all.ok());
  for (auto& kv : all->kvs) m[kv.key] = kv;
  return m;
}

auto In(Ms ms) {
  return [ms] { return Clock::now() + ms; };
}

// A real etcd, a client, and run7's keys.
struct Etcd {
  crun::testing::EtcdProcess process;
  std::shared_ptr<crun::etcd::Client> client = Connect(process);
  const crun::etcd::Keys keys{"/crun/rdzv", "run7"};

  // A node's lease and key, registered (TTL 5 s).
  std::unique_ptr<EtcdNodeLease> Registered(const crun::etcd::NodeRecord& r) {
    auto lease = std::make_unique<EtcdNodeLease>(client, keys, "run7", r, std::chrono::seconds(5));
    REQUIRE(lease->Register(In(Ms(5000)), Clock::now()).ok());
    return lease;
  }
};

}  // namespace

TEST_CASE("etcd roles: a node's assignment from the job document and its ranks/ record",
          "[etcd_roles]") {
  auto doc = Round3();
  doc.ranks_token = "t3";
  struct Row {
    std::string node;
    int nproc;
    crun::etcd::RankRecord place;
    bool in_round, spare;
    int group_rank, base_rank;
    bool hosts_store;
  };
  for (const Row& row : {
           Row{"a", 2, {"t3", 3, false, 0, 3, 0}, true, false, 0, 0, true},
           Row{"b", 3, {"t3", 3, false, 1, 3, 2}, true, false, 1, 2, false},
           Row{"c", 1, {"t3", 3, false, 2, 3, 5}, true, false, 2, 5, false},
           Row{"d", 2, {"t3", 3, true, 0, 3, 0}, true, true, 0, 0, false},
           // Another decision's record (a newer round on its way, or this node's join not
           // taken yet), or another round's: not this round's place.
           Row{"x", 2, {"t2", 3, false, 1, 3, 2}, false, false, 0, 0, false},
           Row{"y", 2, {"t3", 2, false, 1, 3, 2}, false, false, 0, 0, false},
       }) {
    INFO(row.node);
    const auto g = EtcdAssignment(doc, row.place, Self(row.node, row.nproc));
    REQUIRE(g.has_value() == row.in_round);
    if (!g) continue;
    CHECK(g->spare == row.spare);
    CHECK(g->group_rank == row.group_rank);
    CHECK(g->base_rank == row.base_rank);
    CHECK(crun::agent::HostsRoundStore(*g) == row.hosts_store);
    CHECK(g->run_id == "run7");
    CHECK(g->role == "trainer");
    CHECK(g->round == 3);
    CHECK(g->restart_count == 2);
    CHECK(g->max_restarts == 4);
    CHECK(g->local_world_size == row.nproc);
    CHECK(g->world_size == 6);
    CHECK(g->group_world_size == 3);
    REQUIRE(g->members.size() == 3);  // every member's address and ports, in rank order
    CHECK(g->members[1].address == "10.0.0.2");
    CHECK(g->members[1].ports == std::vector<std::uint16_t>{30003});
    CHECK(g->master_port == 0);  // the store's address is its host's to publish
  }
  // Without ports a/job lists no members: the assignment has none (as from the service).
  doc.state.members.clear();
  const auto g = EtcdAssignment(doc, {"t3", 3, false, 1, 3, 2}, Self("b", 3));
  REQUIRE(g.has_value());
  CHECK(g->members.empty());
  CHECK(g->group_world_size == 3);
  // A document of a crun before ranks/ records names no decision: nothing is taken from it.
  doc.ranks_token.clear();
  CHECK_FALSE(EtcdAssignment(doc, {"", 3, false, 1, 3, 2}, Self("b", 3)).has_value());
}

TEST_CASE("etcd roles: this node's lease and key", "[etcd_roles]") {
  Etcd etcd;
  auto& client = etcd.client;
  const auto& keys = etcd.keys;
  const auto held = etcd.Registered(Record("n1"));
  EtcdNodeLease& first = *held;
  CHECK(first.id() != 0);
  CHECK(first.interval() == Ms(1666));
  auto key = client->Get(keys.node("n1"), Clock::now() + Ms(5000));
  REQUIRE(key.ok());
  REQUIRE(key->kvs.size() == 1);
  CHECK(key->kvs[0].lease == first.id());  // the key goes when the lease does
  CHECK(key->kvs[0].create_revision == first.node_revision());
  CHECK(first.KeepAlive(Clock::now() + Ms(5000), nullptr) == EtcdNodeLease::Beat::kAlive);

  // The registration's write sent again after a lost answer finds the key there: bound to its
  // own lease, it is its own earlier try (done); bound to another, another agent's.
  const auto again =
      client->Txn({{keys.node("n1"), crun::etcd::Compare::Target::kCreateRevision, 0, ""}},
                  {{crun::etcd::Op::Kind::kPut, keys.node("n1"), "x", first.id()}},
                  {{crun::etcd::Op::Kind::kGet, keys.node("n1"), "", 0}}, Clock::now() + Ms(5000));
  REQUIRE(again.ok());
  CHECK(crun::agent::RegisteredEarlier(*again, first.id()));
  CHECK_FALSE(crun::agent::RegisteredEarlier(*again, first.id() + 1));
  CHECK_FALSE(crun::agent::RegisteredEarlier(*again, 0));
  crun::etcd::TxnResult none;  // the key was gone: nothing read
  none.reads.emplace_back();
  CHECK_FALSE(crun::agent::RegisteredEarlier(none, first.id()));

  // Another agent with the same node id waits for the key, then is refused, naming it.
  EtcdNodeLease second(client, keys, "run7", Record("n1"), std::chrono::seconds(5));
  const auto start = Clock::now();
  const auto taken = second.Register(In(Ms(5000)), Clock::now() + Ms(600));
  REQUIRE_FALSE(taken.ok());
  CHECK(Clock::now() - start >= Ms(600));
  CHECK_THAT(taken.message(), Catch::Contains("another agent holds node id 'n1' in run 'run7'"));
  CHECK_THAT(taken.message(), Catch::Contains(keys.node("n1")));

  // The first leaves: its key goes with its lease, and a keep-alive learns it is lost.
  REQUIRE(first.Revoke(Clock::now() + Ms(5000)).ok());
  CHECK(first.KeepAlive(Clock::now() + Ms(5000), nullptr) == EtcdNodeLease::Beat::kLost);
  REQUIRE(second.Register(In(Ms(5000)), Clock::now()).ok());

  // etcd gone: the keep-alive is unanswered, and says why.
  etcd.process.Kill();
  crun::Status why;
  CHECK(second.KeepAlive(Clock::now() + Ms(500), &why) == EtcdNodeLease::Beat::kUnanswered);
  CHECK_FALSE(why.ok());
}

TEST_CASE("etcd roles: group rank 0 serves the round's store and publishes it", "[etcd_roles]") {
  Etcd etcd;
  auto& client = etcd.client;
  const auto& keys = etcd.keys;
  const auto held = etcd.Registered(Record("a"));
  EtcdNodeLease& lease = *held;
  // The members' records: every one on loopback, so this test's client is admitted.
  crun::etcd::Mirror records;
  for (const char* id : {"a", "b", "c"}) {
    records[keys.node(id)].value = crun::etcd::EncodeNode(Record(id, {"127.0.0.1"}));
  }
  EtcdRoundStore store(client, keys, "127.0.0.1");
  crun::etcd::RoundHistory doc{3, 6, {"a", "b", "c"}, {"d"}};
  auto endpoint = store.Serve(doc, records, lease.id(), Clock::now() + Ms(5000));
  REQUIRE(endpoint.ok());
  CHECK(store.serving(3));
  auto published = client->Get(keys.store(3), Clock::now() + Ms(5000));
  REQUIRE(published.ok());
  REQUIRE(published->kvs.size() == 1);
  CHECK(published->kvs[0].value == *endpoint);
  CHECK(published->kvs[0].lease == lease.id());  // gone with its host
  const auto parsed = crun::ParseEndpoint(*endpoint, 0);
  REQUIRE(parsed.ok());
  crun::TcpStoreClientOptions c;
  c.host = parsed->host;
  c.port = parsed->port;
  c.connect_timeout = Ms(5000);
  c.timeout = Ms(5000);
  auto worker = crun::TcpStoreClient::Connect(c);
  REQUIRE(worker.ok());
  REQUIRE((*worker)->Set("k", "v").ok());

  // The same round again: the same store. The next: a new one, published under its round.
  CHECK(*store.Serve(doc, records, lease.id(), Clock::now() + Ms(5000)) == *endpoint);
  doc.round = 4;
  auto next = store.Serve(doc, records, lease.id(), Clock::now() + Ms(5000));
  REQUIRE(next.ok());
  CHECK(store.serving(4));
  CHECK_FALSE(store.serving(3));
  auto fourth = client->Get(keys.store(4), Clock::now() + Ms(5000));
  REQUIRE(fourth.ok());
  CHECK(fourth->kvs.size() == 1);

  // A lease etcd no longer knows: the store is not published, and the error names the round.
  REQUIRE(lease.Revoke(Clock::now() + Ms(5000)).ok());
  doc.round = 5;
  auto refused = store.Serve(doc, records, lease.id(), Clock::now() + Ms(5000));
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(), Catch::Contains("cannot publish round 5's store"));
  CHECK_FALSE(store.serving(5));
}

TEST_CASE("etcd roles: the first to stand decides, another once its lease is gone",
          "[etcd_roles]") {
  Etcd etcd;
  auto& client = etcd.client;
  const auto& keys = etcd.keys;
  const auto held_a = etcd.Registered(Record("a"));
  const auto held_b = etcd.Registered(Record("b"));
  EtcdNodeLease& a = *held_a;
  EtcdNodeLease& b = *held_b;
  auto decider = [&] { return crun::etcd::Decider(keys, ReadAll(*client, keys)); };
  CHECK(decider().empty());
  REQUIRE(crun::agent::StandAsDecider(*client, keys, "a", a.id(), Clock::now() + Ms(5000)).ok());
  REQUIRE(crun::agent::StandAsDecider(*client, keys, "b", b.id(), Clock::now() + Ms(5000)).ok());
  CHECK(decider() == "a");  // b lost the race: the key was there
  REQUIRE(a.Revoke(Clock::now() + Ms(5000)).ok());
  CHECK(decider().empty());  // gone with a's lease
  REQUIRE(crun::agent::StandAsDecider(*client, keys, "b", b.id(), Clock::now() + Ms(5000)).ok());
  CHECK(decider() == "b");
  // Standing while another decides writes nothing, whatever the lease.
  REQUIRE(crun::agent::StandAsDecider(*client, keys, "a", a.id(), Clock::now() + Ms(5000)).ok());
  CHECK(decider() == "b");
  // Standing on a lease etcd no longer knows, when nobody decides: NotFound, which the agent
  // takes as "this node's lease ran out".
  REQUIRE(b.Revoke(Clock::now() + Ms(5000)).ok());
  CHECK(crun::agent::StandAsDecider(*client, keys, "a", a.id(), Clock::now() + Ms(5000)).code() ==
        crun::StatusCode::kNotFound);
  CHECK(decider().empty());
}

TEST_CASE("etcd roles: the decider writes the job only over the revision it read", "[etcd_roles]") {
  crun::testing::EtcdProcess etcd;
  auto client = Connect(etcd);
  const crun::etcd::Keys keys("/crun/rdzv", "run7");
  std::vector<std::unique_ptr<EtcdNodeLease>> leases;
  for (const char* id : {"a", "b"}) {
    auto r = Record(id, {"127.0.0.1"});
    r.settings.min_nodes = 2;
    r.settings.max_nodes = 2;
    leases.push_back(
        std::make_unique<EtcdNodeLease>(client, keys, "run7", r, std::chrono::seconds(5)));
    REQUIRE(leases.back()->Register(In(Ms(5000)), Clock::now()).ok());
    REQUIRE(client
                ->Put(keys.join(id), crun::etcd::EncodeJoin({0, {}}), leases.back()->id(),
                      Clock::now() + Ms(5000))
                .ok());
  }
  auto read = [&] { return ReadAll(*client, keys); };
  const auto now = crun::rdzv::TimePoint::clock::now();
  REQUIRE(crun::agent::StandAsDecider(*client, keys, "a", leases[0]->id(), Clock::now() + Ms(5000))
              .ok());
  const auto before = read();
  auto first =
      crun::agent::DecideAndWrite(*client, keys, before, "a", now, Clock::now() + Ms(5000));
  REQUIRE(first.error.ok());
  REQUIRE(first.unanswered.ok());
  CHECK(first.written_revision > 0);  // both joined, max reached: a round formed
  CHECK_FALSE(first.log.empty());
  const auto after = read();
  REQUIRE(after.count(keys.state()) == 1);
  CHECK(after.at(keys.state()).mod_revision == first.written_revision);

  // A decider that has not seen that write (its mirror is the one before) cannot overwrite it.
  auto stale =
      crun::agent::DecideAndWrite(*client, keys, before, "a", now, Clock::now() + Ms(5000));
  CHECK(stale.error.ok());
  CHECK(stale.written_revision == 0);
  CHECK(read().at(keys.state()).mod_revision == first.written_revision);

  // A document this crun cannot read ends the job rather than being overwritten.
  REQUIRE(client->Put(keys.state(), "{not json", 0, Clock::now() + Ms(5000)).ok());
  auto corrupt =
      crun::agent::DecideAndWrite(*client, keys, read(), "a", now, Clock::now() + Ms(5000));
  CHECK_FALSE(corrupt.error.ok());
  CHECK(corrupt.written_revision == 0);
}

TEST_CASE("etcd roles: each node's place is written in transactions etcd takes, by the decider",
          "[etcd_roles]") {
  // 200 nodes (more than etcd's 128 operations a transaction), all on one lease here.
  Etcd etcd;
  auto& client = etcd.client;
  const auto& keys = etcd.keys;
  auto lease = client->Grant(std::chrono::seconds(30), Clock::now() + Ms(5000));
  REQUIRE(lease.ok());
  constexpr int kNodes = 200;
  auto id = [](int i) { return "n" + std::to_string(1000 + i); };
  for (int i = 0; i < kNodes; ++i) {
    auto r = Record(id(i), {"127.0.0.1"});
    r.settings.min_nodes = kNodes;
    r.settings.max_nodes = kNodes;
    REQUIRE(client->Put(keys.node(id(i)), crun::etcd::EncodeNode(r), *lease, In(Ms(5000))()).ok());
    REQUIRE(client->Put(keys.join(id(i)), crun::etcd::EncodeJoin({0, {}}), *lease, In(Ms(5000))())
                .ok());
  }
  REQUIRE(crun::agent::StandAsDecider(*client, keys, id(0), *lease, In(Ms(5000))()).ok());
  const auto now = crun::rdzv::TimePoint::clock::now();
  // A node that does not decide (it lost its place, say) writes no record and no job.
  auto intruder = crun::agent::DecideAndWrite(*client, keys, ReadAll(*client, keys), id(7), now,
                                              In(Ms(5000))());
  CHECK(intruder.written_revision == 0);
  auto none = client->GetPrefix(keys.ranks(), In(Ms(5000))());
  REQUIRE(none.ok());
  CHECK(none->kvs.empty());
  CHECK(ReadAll(*client, keys).count(keys.state()) == 0);

  auto decided = crun::agent::DecideAndWrite(*client, keys, ReadAll(*client, keys), id(0), now,
                                             In(Ms(5000))());
  REQUIRE(decided.unanswered.ok());
  REQUIRE(decided.written_revision > 0);
  const auto all = ReadAll(*client, keys);
  auto job = crun::etcd::DecodeJob(all.at(keys.job()).value, now, crun::etcd::WallClock::now());
  REQUIRE(job.ok());
  CHECK(job->state.phase == crun::rdzv::Phase::kRunning);
  CHECK(job->state.members.empty());  // no ports: each node reads its own record
  std::set<int> ranks;
  for (int i = 0; i < kNodes; ++i) {
    const auto& kv = all.at(keys.rank(id(i)));
    CHECK(kv.lease == *lease);
    CHECK(kv.mod_revision < all.at(keys.job()).mod_revision);  // before the round is announced
    auto place = crun::etcd::DecodeRank(id(i), kv.value);
    REQUIRE(place.ok());
    const auto g = EtcdAssignment(*job, *place, Self(id(i), 1));
    REQUIRE(g.has_value());
    CHECK(g->group_world_size == kNodes);
    ranks.insert(g->group_rank);
  }
  CHECK(ranks.size() == static_cast<std::size_t>(kNodes));
}

TEST_CASE("assignment: one builder for every backend, one role", "[assignment]") {
  using crun::agent::MakeGroupAssignment;
  using crun::agent::RoundPlace;
  const RoundSelf self{"run7", "trainer", "n1", 4, 3, true};
  // A member of round 2: its place, the role's world the job's, its nproc its local world.
  auto g = MakeGroupAssignment(self,
                               RoundPlace{.group_rank = 1,
                                          .group_world_size = 3,
                                          .world_size = 12,
                                          .base_rank = 4,
                                          .round = 2,
                                          .restart_count = 1},
                               {{"h0", "10.0.0.1", 4, {}}, {"h1", "10.0.0.2", 4, {}}});
  CHECK(g.run_id == "run7");
  CHECK(g.role == "trainer");
  CHECK(g.local_world_size == 4);
  CHECK(g.role_world_size == 12);
  CHECK(g.base_role_rank == 4);
  CHECK(g.max_restarts == 3);
  CHECK(g.virtual_local_rank);
  CHECK(g.round == 2);
  CHECK(g.restart_count == 1);
  CHECK(g.members.size() == 2);
  CHECK_FALSE(g.spare);
  // A Slurm task says its step's local world; a spare stands outside the ranks.
  CHECK(MakeGroupAssignment(self, RoundPlace{.local_world_size = 8}).local_world_size == 8);
  const auto spare = MakeGroupAssignment(self, RoundPlace{.world_size = 12, .spare = true});
  CHECK(spare.spare);
  CHECK(spare.base_rank == 0);
  CHECK(spare.role_world_size == 12);
}
