#include "agent/rendezvous/etcd/round_store.h"

#include <vector>

#include "base/endpoint.h"

namespace crun::agent {

StatusOr<std::string> EtcdRoundStore::Serve(const etcd::RoundHistory& history,
                                            const etcd::Mirror& records, std::int64_t lease,
                                            etcd::Clock::time_point deadline) {
  const int round = history.round;
  if (serving(round)) return published_;
  RoundStoreSpec spec;
  spec.world_size = history.world_size;
  for (const auto& id : history.nodes) {
    auto kv = records.find(keys_.node(id));
    if (kv == records.end()) continue;
    auto record = etcd::DecodeNode(id, kv->second.value);
    spec.members.push_back(record.ok() ? record->addresses : std::vector<std::string>{});
  }
  auto port = host_.Serve(round, spec);
  if (!port.ok()) {
    return Status(port.status().code(), "cannot serve round " + std::to_string(round) +
                                            "'s store: " + port.status().message());
  }
  const std::string endpoint = FormatEndpoint(advertise_, *port);
  if (Status put = client_->Put(keys_.store(round), endpoint, lease, deadline).status();
      !put.ok()) {
    host_.Stop();
    return Status(put.code(),
                  "cannot publish round " + std::to_string(round) + "'s store: " + put.message());
  }
  published_ = endpoint;
  return endpoint;
}

StatusOr<std::string> EtcdRoundStore::ServeRound(int round, const etcd::Mirror* decider_mirror,
                                                 std::int64_t lease,
                                                 etcd::Clock::time_point deadline) {
  if (serving(round)) return published_;
  etcd::Mirror read;
  if (decider_mirror == nullptr) {
    auto both = client_->Txn({},
                             {{etcd::Op::Kind::kGetPrefix, keys_.nodes(), "", 0},
                              {etcd::Op::Kind::kGet, keys_.round(round), "", 0}},
                             {}, deadline);
    if (!both.ok()) {
      return Status(both.status().code(), "cannot read the members' addresses for round " +
                                              std::to_string(round) +
                                              "'s store: " + both.status().message());
    }
    for (auto& kvs : both->reads) {
      for (auto& kv : kvs) read[kv.key] = std::move(kv);
    }
  }
  const etcd::Mirror& records = decider_mirror != nullptr ? *decider_mirror : read;
  auto history_kv = records.find(keys_.round(round));
  if (history_kv == records.end()) {
    return Status(StatusCode::kNotFound,
                  keys_.round(round) + " is missing: the round's members are not known");
  }
  auto history = etcd::DecodeRound(history_kv->second.value);
  if (!history.ok()) {
    return Status(history.status().code(),
                  keys_.round(round) + " cannot be read: " + history.status().message());
  }
  return Serve(*history, records, lease, deadline);
}

}  // namespace crun::agent
