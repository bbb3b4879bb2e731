#include "agent/rendezvous/etcd/node_lease.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <thread>

namespace crun::agent {

etcd::ClientOptions ClientOptionsOf(const EtcdRendezvousOptions& o) {
  etcd::ClientOptions co;
  co.endpoints = o.endpoints;
  co.security = o.security;
  co.user = o.user;
  co.password = o.password;
  co.keepalive_timeout = std::max(std::chrono::milliseconds(1'000), o.settings.heartbeat_timeout);
  co.probe = false;  // the node's first read proves that a member answers
  // Each node starts at a member of its own (its node id's hash): a thousand agents do not all
  // connect to, and queue on, the first endpoint.
  co.first_member = std::hash<std::string>{}(o.node_id);
  return co;
}

etcd::NodeRecord NodeRecordOf(const EtcdRendezvousOptions& o) {
  etcd::NodeRecord record;
  record.node.node_id = o.node_id;
  record.node.host = o.host;
  record.node.nproc = o.nproc;
  record.node.requested_rank = o.requested_rank;
  // Where other nodes' workers reach this one's (--contract): as its store is reached.
  record.node.address = o.advertise_addr.empty() ? o.host : o.advertise_addr;
  record.addresses = o.addresses;
  record.settings = o.settings;
  return record;
}

std::chrono::seconds LeaseTtl(const EtcdRendezvousOptions& o) {
  return std::chrono::seconds(
      std::max<long long>(1, static_cast<long long>(
                                 std::ceil(o.settings.heartbeat_timeout.count() / 1000.0))));
}

using Millis = std::chrono::milliseconds;

namespace {
// Leases one registration takes at most: each after the last ran out before the write came.
constexpr int kMaxGrants = 3;
}  // namespace

EtcdNodeLease::EtcdNodeLease(std::shared_ptr<etcd::Client> client, etcd::Keys keys,
                             std::string run_id, etcd::NodeRecord record, std::chrono::seconds ttl)
    : client_(std::move(client)),
      keys_(std::move(keys)),
      run_id_(std::move(run_id)),
      record_(std::move(record)),
      ttl_(ttl) {}

bool RegisteredEarlier(const etcd::TxnResult& failed, std::int64_t lease) {
  return !failed.succeeded && lease != 0 && !failed.reads.empty() &&
         !failed.reads.front().empty() && failed.reads.front().front().lease == lease;
}

Status EtcdNodeLease::Register(const std::function<etcd::Clock::time_point()>& deadline,
                               etcd::Clock::time_point wait_until,
                               const std::vector<etcd::Op>& with) {
  const std::string& node_id = record_.node.node_id;
  const std::string key = keys_.node(node_id);
  std::vector<etcd::Op> ops;
  const auto grant = [&]() -> Status {
    CRUN_ASSIGN_OR_RETURN(id_, client_->Grant(ttl_, deadline()));
    ops = {{etcd::Op::Kind::kPut, key, etcd::EncodeNode(record_), id_},
           {etcd::Op::Kind::kDelete, keys_.refusal(node_id), "", 0}};
    for (auto op : with) {
      op.lease = id_;
      ops.push_back(std::move(op));
    }
    return Status::Ok();
  };
  CRUN_RETURN_IF_ERROR(grant());
  int grants = 1;
  while (true) {
    auto txn = client_->Txn({{key, etcd::Compare::Target::kCreateRevision, 0, ""}}, ops,
                            {{etcd::Op::Kind::kGet, key, "", 0}}, deadline());
    if (!txn.ok() && txn.status().code() == StatusCode::kNotFound && grants < kMaxGrants) {
      // The lease ran out before the write came through (etcd too busy to answer within its
      // TTL): a new one, and the write again.
      CRUN_RETURN_IF_ERROR(grant());
      ++grants;
      continue;
    }
    CRUN_RETURN_IF_ERROR(txn.status());
    if (txn->succeeded) {
      node_revision_ = txn->revision;
      return Status::Ok();
    }
    if (RegisteredEarlier(*txn, id_)) {
      // The key, and everything written with it in the one transaction, is this node's.
      node_revision_ = txn->reads.front().front().create_revision;
      return Status::Ok();
    }
    if (etcd::Clock::now() >= wait_until) {
      return InvalidArgument("another agent holds node id '" + node_id + "' in run '" + run_id_ +
                             "' (" + key +
                             "), and its lease did not run out: give each node its own "
                             "--rdzv-conf node_id");
    }
    // Its lease runs out within the TTL: look again shortly (bounded by `wait_until`).
    std::this_thread::sleep_for(Millis(200));
  }
}

EtcdNodeLease::Beat EtcdNodeLease::KeepAlive(etcd::Clock::time_point deadline, Status* why) {
  auto ttl = client_->KeepAliveOnce(id_, deadline);
  if (ttl.ok()) return Beat::kAlive;
  if (ttl.status().code() == StatusCode::kNotFound) return Beat::kLost;
  if (why != nullptr) *why = ttl.status();
  return Beat::kUnanswered;
}

Status EtcdNodeLease::Revoke(etcd::Clock::time_point deadline) {
  if (id_ == 0) return Status::Ok();
  return client_->Revoke(id_, deadline);
}

Millis EtcdNodeLease::interval() const { return std::max(Millis(300), Millis(ttl_) / 3); }

}  // namespace crun::agent
