#include "agent/rendezvous/etcd/node_lease.h"

#include <algorithm>
#include <thread>

namespace crun::agent {

using Millis = std::chrono::milliseconds;

EtcdNodeLease::EtcdNodeLease(std::shared_ptr<etcd::Client> client, etcd::Keys keys,
                             std::string run_id, etcd::NodeRecord record, std::chrono::seconds ttl)
    : client_(std::move(client)),
      keys_(std::move(keys)),
      run_id_(std::move(run_id)),
      record_(std::move(record)),
      ttl_(ttl) {}

Status EtcdNodeLease::Register(const std::function<etcd::Clock::time_point()>& deadline,
                               etcd::Clock::time_point wait_until,
                               const std::vector<etcd::Op>& with) {
  CRUN_ASSIGN_OR_RETURN(id_, client_->Grant(ttl_, deadline()));
  const std::string& node_id = record_.node.node_id;
  const std::string key = keys_.node(node_id);
  std::vector<etcd::Op> ops{{etcd::Op::Kind::kPut, key, etcd::EncodeNode(record_), id_},
                            {etcd::Op::Kind::kDelete, keys_.refusal(node_id), "", 0}};
  for (auto op : with) {
    op.lease = id_;
    ops.push_back(std::move(op));
  }
  while (true) {
    CRUN_ASSIGN_OR_RETURN(const auto txn,
                          client_->Txn({{key, etcd::Compare::Target::kCreateRevision, 0, ""}}, ops,
                                       {{etcd::Op::Kind::kGet, key, "", 0}}, deadline()));
    if (txn.succeeded) {
      node_revision_ = txn.revision;
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
