// The job's progress on this node, in one place (AgentView::progress): every local rank's
// heartbeats and step records (base/step_records.h) and the snapshots saved. Whoever sees
// progress tells it here; whoever needs it listens or reads the count:
//   - crash-loop watching reads the count (an attempt that made none, docs/health.md);
//   - the straggler watch listens to step records;
//   - the goodput ledger listens to all three (rendezvous/goodput).
// Runs on the agent's event loop, as its listeners do.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "base/step_records.h"

namespace crun::agent {

class JobProgress {
 public:
  struct Listener {  // each part may be null
    std::function<void(int local_rank)> on_beat;
    std::function<void(int local_rank, const StepRecord&)> on_step;
    // A snapshot was saved; `node_step`: the newest step every local rank holds, if known.
    std::function<void(std::optional<std::int64_t> node_step)> on_saved;
  };

  // Listens for the job's life: a feature adds itself when it is made.
  void Listen(Listener l) { listeners_.push_back(std::move(l)); }

  // Worker `local_rank` wrote `beats` beats (a record counts as one) and `records`.
  void Heard(int local_rank, int beats, const std::vector<StepRecord>& records) {
    if (beats > 0) {
      count_ += static_cast<std::uint64_t>(beats);
      for (const auto& l : listeners_) {
        if (l.on_beat) l.on_beat(local_rank);
      }
    }
    for (const StepRecord& r : records) {
      for (const auto& l : listeners_) {
        if (l.on_step) l.on_step(local_rank, r);
      }
    }
  }

  // `saves` more snapshots were saved.
  void Saved(std::uint64_t saves, std::optional<std::int64_t> node_step) {
    if (saves == 0) return;
    count_ += saves;
    for (const auto& l : listeners_) {
      if (l.on_saved) l.on_saved(node_step);
    }
  }

  // Beats and saves so far, of every attempt.
  std::uint64_t count() const { return count_; }

 private:
  std::uint64_t count_ = 0;
  std::vector<Listener> listeners_;
};

}  // namespace crun::agent
