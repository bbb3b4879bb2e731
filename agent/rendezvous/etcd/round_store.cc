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

}  // namespace crun::agent
