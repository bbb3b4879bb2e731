#include "agent/rendezvous/etcd/slow_ranks.h"

#include <spdlog/spdlog.h>

namespace crun::agent {

void EtcdSlowRanks::Queue(const etcd::KeyValue& kv) {
  const std::string prefix = etcd::FiguresKey(keys_, "");
  if (kv.key.compare(0, prefix.size(), prefix) != 0) return;
  if (figures_.size() >= kMaxQueuedFigures) figures_.erase(figures_.begin());
  figures_.emplace_back(kv.key.substr(prefix.size()), kv.value);
}

void EtcdSlowRanks::Judge(etcd::Client& client, const etcd::Mirror& mirror,
                          etcd::Clock::time_point deadline) {
  auto queued = std::exchange(figures_, {});
  if (queued.empty()) return;
  auto job = mirror.find(keys_.state());  // with the members, which a/job may leave out
  if (job == mirror.end()) return;
  auto doc =
      etcd::DecodeJob(job->second.value, rdzv::TimePoint::clock::now(), etcd::WallClock::now());
  if (!doc.ok()) return;
  judge_.Follow(*doc);
  bool changed = false;
  for (const auto& [node, value] : queued) {
    auto put = etcd::DecodeFigures(node, value);
    if (!put.ok()) {
      spdlog::warn("etcd rendezvous: ignoring {}", put.status().message());
      continue;
    }
    changed = judge_.Fold(node, *put) || changed;
  }
  if (!changed) return;
  auto written =
      client.Put(etcd::StragglersKey(keys_), etcd::EncodeVerdicts(judge_.verdicts()), 0, deadline);
  if (!written.ok()) {
    spdlog::warn("etcd rendezvous: cannot write the slow ranks' verdicts: {}",
                 written.status().message());
  }
}

void EtcdSlowRanks::Send(etcd::Client& client, const std::string& node_id,
                         const etcd::NodeFigures& put, std::int64_t lease,
                         etcd::Clock::time_point deadline) {
  auto written =
      client.Put(etcd::FiguresKey(keys_, node_id), etcd::EncodeFigures(put), lease, deadline);
  if (!written.ok()) {
    spdlog::warn("etcd rendezvous: cannot send this node's slow-rank figures: {}",
                 written.status().message());
  }
}

std::vector<SlowRankVerdict> EtcdSlowRanks::Unsaid(const etcd::Mirror& mirror, int round) {
  auto kv = mirror.find(etcd::StragglersKey(keys_));
  if (kv == mirror.end()) return {};
  auto verdicts = etcd::DecodeVerdicts(kv->second.value);
  if (!verdicts.ok()) return {};
  std::vector<SlowRankVerdict> out;
  for (const auto& v : etcd::NewVerdicts(*verdicts, round, said_))
    out.push_back({v.change, v.host});
  return out;
}

}  // namespace crun::agent
