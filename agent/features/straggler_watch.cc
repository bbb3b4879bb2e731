// Slow ranks on this node (docs/health.md, "Slow ranks"): the step records its workers write on
// their heartbeat pipes, folded into windows of steps and judged by the pure detector
// (rendezvous/service/stragglers.h) among this node's ranks. A rank named is said once, with
// its host and ratio, and again when it is back at speed.
#include <spdlog/spdlog.h>

#include "agent/features/job_feature.h"
#include "rendezvous/service/stragglers.h"

namespace crun::agent {
namespace {

class StragglerWatch final : public JobFeature {
 public:
  explicit StragglerWatch(AgentView& agent) : agent_(agent) {}

  // Each attempt starts over: its ranks, its steps.
  void BeforeStart(AttemptStartContext& c) override {
    const int nproc = agent_.options.nproc;
    state_ = {};
    state_.world_size = nproc;
    windows_.clear();
    for (int r = 0; r < nproc; ++r) windows_.emplace_back(r);
    base_rank_ = c.group.base_rank;
    c.on_step = [this](int local_rank, const StepRecord& r) { OnStep(local_rank, r); };
  }

 private:
  // The detector's ranks are this crun's workers in order (0 .. nproc - 1); the messages
  // name each by its RANK and local rank.
  void OnStep(int local_rank, const StepRecord& r) {
    const int i = local_rank - agent_.options.first_local_rank;
    if (i < 0 || i >= static_cast<int>(windows_.size())) return;
    const auto sample =
        windows_[static_cast<std::size_t>(i)].Add(r.step, std::chrono::microseconds(r.compute_us));
    if (!sample) return;
    for (rdzv::StragglerChange change :
         rdzv::OnComputeSample(state_, *sample, agent_.options.stragglers)) {
      const int local = change.rank + agent_.options.first_local_rank;
      change.rank = base_rank_ + local;
      if (change.named) {
        spdlog::warn("crun: slow rank on {} (local rank {}): {}", agent_.options.host_name, local,
                     rdzv::DescribeStraggler(change));
      } else {
        spdlog::warn("crun: rank {} on {} is no longer slow: {}", change.rank,
                     agent_.options.host_name, rdzv::DescribeStraggler(change));
      }
    }
  }

  AgentView& agent_;
  rdzv::StragglerState state_;
  std::vector<rdzv::ComputeWindows> windows_;
  int base_rank_ = 0;
};

}  // namespace

std::unique_ptr<JobFeature> MakeStragglerWatch(AgentView& agent) {
  if (agent.options.straggler_action == StragglerAction::kOff) return nullptr;
  return std::make_unique<StragglerWatch>(agent);
}

}  // namespace crun::agent
