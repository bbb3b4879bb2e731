// etcd as far as the decider can tell (rendezvous/etcd/job.h's Decide): a mirror of keys with
// their revisions and leases, Decide at invented times, and its writes applied the way a
// transaction would apply them. Shared by the tables of tests/unit/etcd/.
#pragma once

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <string>

#include "rendezvous/etcd/job.h"

namespace {

using crun::etcd::Decide;
using crun::etcd::Decision;
using crun::etcd::Keys;
using crun::etcd::Mirror;
using crun::etcd::NodeRecord;
using crun::etcd::Op;
using crun::etcd::Report;
using Ms = std::chrono::milliseconds;

const auto kT0 = crun::rdzv::TimePoint(std::chrono::hours(1000));
const auto kWall0 = crun::etcd::WallClock::time_point(std::chrono::hours(500'000));

// etcd, as far as Decide can tell: keys with create and mod revisions, leases by id.
struct Etcd {
  Keys keys{"/crun/rdzv", "job1"};
  Mirror kv;
  std::int64_t revision = 1;

  void Put(const std::string& key, const std::string& value, std::int64_t lease = 0) {
    ++revision;
    auto& e = kv[key];
    if (e.create_revision == 0) e.create_revision = revision;
    e.key = key;
    e.value = value;
    e.mod_revision = revision;
    e.lease = lease;
  }
  void Delete(const std::string& key) {
    ++revision;
    kv.erase(key);
  }
  void DeletePrefix(const std::string& prefix) {
    ++revision;
    for (auto it = kv.lower_bound(prefix); it != kv.end() && it->first.rfind(prefix, 0) == 0;) {
      it = kv.erase(it);
    }
  }
  void AddNode(const std::string& id, const std::string& host, int nproc, int min_nodes,
               int max_nodes, int max_restarts = 0, std::int64_t lease = 100,
               const char* contracts = "torch", int max_repeated_failures = 0) {
    NodeRecord r;
    r.node.node_id = id;
    r.node.host = host;
    r.node.nproc = nproc;
    r.addresses = {"10.0.0." + std::to_string(kv.size() + 1)};
    r.settings.min_nodes = min_nodes;
    r.settings.max_nodes = max_nodes;
    r.settings.max_restarts = max_restarts;
    r.settings.max_repeated_failures = max_repeated_failures;
    r.settings.contracts = crun::ParseContracts(contracts).value();
    Put(keys.node(id), crun::etcd::EncodeNode(r), lease);
  }
  // Bound to the agent's lease, as agents write it.
  void JoinNode(const std::string& id) { Put(keys.join(id), std::to_string(Gathering()), 100); }
  int Gathering() const {
    auto j = kv.find(keys.job());  // what agents read
    if (j == kv.end()) return 0;
    return nlohmann::json::parse(j->second.value).at("gathering").get<int>();
  }
  // Nodes a and b (2:2) have formed round 0.
  void FormTwo() {
    AddNode("a", "host-a", 1, 2, 2);
    AddNode("b", "host-b", 1, 2, 2);
    JoinNode("a");
    JoinNode("b");
    Step(std::chrono::milliseconds(0));
  }
  // Node a alone (1:1) has formed round 0 and reported success; not decided on yet.
  void OneSucceeded() {
    AddNode("a", "host-a", 1, 1, 1);
    JoinNode("a");
    Step(std::chrono::milliseconds(0));
    Succeed("a");
  }
  void Succeed(const std::string& id) {
    Put(keys.report(Gathering(), id), crun::etcd::EncodeReport(Report{true, "", 0, ""}));
  }
  nlohmann::json Job() const { return nlohmann::json::parse(kv.at(keys.state()).value); }
  nlohmann::json Public() const { return nlohmann::json::parse(kv.at(keys.job()).value); }

  // Decides at `now` and applies the decision as the transaction would (when it still
  // compares equal).
  Decision Step(Ms at) { return Apply(Decide(keys, kv, kT0 + at, kWall0 + at)); }
  // Applies a decision as the transaction would (when it still compares equal).
  Decision Apply(Decision d) {
    REQUIRE(d.error.ok());
    if (!d.write) return d;
    REQUIRE(d.ops.size() + 1 <= crun::etcd::kMaxTxnOps);  // etcd would refuse the transaction
    auto job = kv.find(keys.state());
    const std::int64_t current = job == kv.end() ? 0 : job->second.mod_revision;
    REQUIRE(current == d.job_mod_revision);
    for (const auto& op : d.rank_ops) {  // first, as DecideAndWrite writes them
      REQUIRE(op.kind == Op::Kind::kPut);
      Put(op.key, op.value, op.lease);
    }
    Put(keys.state(), d.job_json, d.job_lease);
    for (const auto& op : d.ops) {
      switch (op.kind) {
        case Op::Kind::kPut:
          if (op.keep_value) {
            REQUIRE(kv.count(op.key) == 1);  // etcd fails the transaction otherwise
            Put(op.key, kv.at(op.key).value, op.lease);
          } else {
            Put(op.key, op.value, op.lease);
          }
          break;
        case Op::Kind::kDelete:
          Delete(op.key);
          break;
        case Op::Kind::kDeletePrefix:
          DeletePrefix(op.key);
          break;
        default:
          FAIL("Decide reads nothing");
      }
    }
    return d;
  }
};

}  // namespace
