// The etcd rendezvous's roles, each alone (agent/rendezvous/etcd/): the assignment a node reads
// from the decider's job document (a table, no etcd), and against a real etcd (Debian's
// etcd-server) this node's lease and key, and the round's store its group rank 0 serves and
// publishes.
#include <catch2/catch.hpp>

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
using crun::agent::EtcdSelf;
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

EtcdSelf Self(const std::string& id, int nproc) {
  return EtcdSelf{"run7", "trainer", id, nproc, 4, false};
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

TEST_CASE("etcd roles: a node's assignment from the job document", "[etcd_roles]") {
  const auto doc = Round3();
  struct Row {
    std::string node;
    int nproc;
    bool in_round, spare;
    int group_rank, base_rank;
    bool hosts_store;
  };
  for (const Row& row :
       {Row{"a", 2, true, false, 0, 0, true}, Row{"b", 3, true, false, 1, 2, false},
        Row{"c", 1, true, false, 2, 5, false}, Row{"d", 2, true, true, 0, 0, false},
        Row{"x", 2, false, false, 0, 0, false}}) {
    INFO(row.node);
    const auto g = EtcdAssignment(doc, Self(row.node, row.nproc));
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
  auto doc = Round3();
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
  doc.state.round = 4;
  auto next = store.Serve(doc, records, lease.id(), Clock::now() + Ms(5000));
  REQUIRE(next.ok());
  CHECK(store.serving(4));
  CHECK_FALSE(store.serving(3));
  auto fourth = client->Get(keys.store(4), Clock::now() + Ms(5000));
  REQUIRE(fourth.ok());
  CHECK(fourth->kvs.size() == 1);

  // A lease etcd no longer knows: the store is not published, and the error names the round.
  REQUIRE(lease.Revoke(Clock::now() + Ms(5000)).ok());
  doc.state.round = 5;
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
  const auto before = read();
  const auto now = crun::rdzv::TimePoint::clock::now();
  auto first = crun::agent::DecideAndWrite(*client, keys, before, now, Clock::now() + Ms(5000));
  REQUIRE(first.error.ok());
  REQUIRE(first.unanswered.ok());
  CHECK(first.written_revision > 0);  // both joined, max reached: a round formed
  CHECK_FALSE(first.log.empty());
  const auto after = read();
  REQUIRE(after.count(keys.state()) == 1);
  CHECK(after.at(keys.state()).mod_revision == first.written_revision);

  // A decider that has not seen that write (its mirror is the one before) cannot overwrite it.
  auto stale = crun::agent::DecideAndWrite(*client, keys, before, now, Clock::now() + Ms(5000));
  CHECK(stale.error.ok());
  CHECK(stale.written_revision == 0);
  CHECK(read().at(keys.state()).mod_revision == first.written_revision);

  // A document this crun cannot read ends the job rather than being overwritten.
  REQUIRE(client->Put(keys.state(), "{not json", 0, Clock::now() + Ms(5000)).ok());
  auto corrupt = crun::agent::DecideAndWrite(*client, keys, read(), now, Clock::now() + Ms(5000));
  CHECK_FALSE(corrupt.error.ok());
  CHECK(corrupt.written_revision == 0);
}
