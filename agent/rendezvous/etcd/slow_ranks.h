// The etcd rendezvous's slow-rank role (rendezvous/etcd/stragglers.h: the keys and the pure
// judge): every node puts its ranks' figures at each keep-alive; the decider folds every put its
// watch delivers into the running round's detector and writes the verdicts; every node passes on
// the verdicts on its round that it has not said yet. Runs on the etcd thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "agent/health/straggler_exchange.h"
#include "rendezvous/etcd/client.h"
#include "rendezvous/etcd/job.h"
#include "rendezvous/etcd/stragglers.h"

namespace crun::agent {

class EtcdSlowRanks {
 public:
  EtcdSlowRanks(const etcd::Keys& keys, rdzv::StragglerSettings settings)
      : keys_(keys), judge_(settings) {}

  // The decider: a key its watch delivered, kept in order for its next pass when it is a put
  // of a node's figures.
  void Queue(const etcd::KeyValue& kv);
  // The decider: the puts queued, folded into the detector of `mirror`'s running round; the
  // verdicts written when they changed.
  void Judge(etcd::Client& client, const etcd::Mirror& mirror, etcd::Clock::time_point deadline);
  // Every node: its figures, bound to its lease.
  void Send(etcd::Client& client, const std::string& node_id, const etcd::NodeFigures& put,
            std::int64_t lease, etcd::Clock::time_point deadline);
  // Every node: the verdicts on round `round` in `mirror` it has not passed on yet.
  std::vector<SlowRankVerdict> Unsaid(const etcd::Mirror& mirror, int round);
  // A new round: nothing said in it yet.
  void NewRound() { said_.clear(); }

 private:
  static constexpr std::size_t kMaxQueuedFigures = 100'000;
  etcd::Keys keys_;
  etcd::FigureJudge judge_;
  std::vector<std::pair<std::string, std::string>> figures_;  // (node id, value) since a pass
  std::set<int> said_;  // ranks this node has said are slow in its round
};

}  // namespace crun::agent
