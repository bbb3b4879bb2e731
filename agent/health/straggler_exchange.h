// Slow ranks judged job-wide (docs/health.md, "Slow ranks"): what the straggler watch and a
// rendezvous that carries each node's figures to one judge (the service) share. The rendezvous
// sets `job_wide` when the judge says it judges (the service, in its assignment); the watch then
// queues its ranks' window figures in `outbox` instead of judging them among this node's ranks
// alone, the rendezvous sends them with its next heartbeat, and hands the judge's verdicts to
// `on_verdicts`. Everything runs on the agent's loop.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "rendezvous/rules/stragglers.h"

namespace crun::agent {

// A rank the judge named slow (or cleared), with the host of its node.
struct SlowRankVerdict {
  rdzv::StragglerChange change;  // its rank is the global RANK
  std::string host;
};

struct StragglerExchange {
  // Figures waiting for a heartbeat, at most this many (a heartbeat every second carries a few
  // per local rank; the oldest go first when the service is unreachable for long).
  static constexpr std::size_t kMaxOutbox = 4096;

  bool job_wide = false;  // set by the rendezvous that judges
  int round = 0;          // the round the figures in `outbox` are of
  std::vector<rdzv::ComputeSample> outbox;
  std::function<void(const std::vector<SlowRankVerdict>&)> on_verdicts;

  void Queue(const rdzv::ComputeSample& figure) {
    if (outbox.size() >= kMaxOutbox) outbox.erase(outbox.begin(), outbox.begin() + kMaxOutbox / 2);
    outbox.push_back(figure);
  }
};

}  // namespace crun::agent
