// Slow ranks (docs/health.md, "Slow ranks"): the step records this node's workers write on
// their heartbeat pipes, folded into windows of steps. Where the rendezvous judges job-wide (the
// service), the figures go to it and its verdicts come back; else the pure detector
// (rendezvous/rules/stragglers.h) judges them among this node's ranks. A rank of this node
// named is said once, with its host and ratio, and again when it is back at speed.
#include <spdlog/spdlog.h>

#include <optional>

#include "agent/features/job_feature.h"
#include "rendezvous/rules/stragglers.h"

namespace crun::agent {
namespace {

class StragglerWatch final : public JobFeature {
 public:
  explicit StragglerWatch(AgentView& agent)
      : agent_(agent), exchange_(agent.stragglers ? *agent.stragglers : own_) {
    agent.progress.Listen(
        {nullptr, [this](int local_rank, const StepRecord& r) { OnStep(local_rank, r); }, nullptr});
  }
  ~StragglerWatch() override { exchange_.on_verdicts = nullptr; }
  StragglerWatch(const StragglerWatch&) = delete;
  StragglerWatch& operator=(const StragglerWatch&) = delete;

  // Each attempt starts over: its ranks, its steps.
  void BeforeStart(AttemptStartContext& c) override {
    const int nproc = agent_.options.nproc;
    // The rendezvous said at this round's assignment whether a judge sees every node's figures;
    // the node judges its own ranks only where none does.
    state_.reset();
    if (!exchange_.job_wide) state_.emplace().world_size = nproc;
    windows_.clear();
    for (int r = 0; r < nproc; ++r) windows_.emplace_back(r);
    // RANK of this crun's first worker (local rank first_local_rank).
    first_rank_ = c.group.base_rank + agent_.options.first_local_rank;
    if (agent_.meters != nullptr) agent_.meters->SlowRanksReset();
    exchange_.round = c.group.round;
    exchange_.outbox.clear();
    exchange_.on_verdicts = [this](const std::vector<SlowRankVerdict>& verdicts) {
      for (const auto& v : verdicts) Say(v.change, v.host);
    };
  }

 private:
  // Windows are per worker of this crun, in order; the detector here and the service see each
  // by its RANK.
  void OnStep(int local_rank, const StepRecord& r) {
    const int i = local_rank - agent_.options.first_local_rank;
    if (i < 0 || i >= static_cast<int>(windows_.size()) || !r.compute_us) return;
    auto sample =
        windows_[static_cast<std::size_t>(i)].Add(r.step, std::chrono::microseconds(*r.compute_us));
    if (!sample) return;
    if (!state_) {
      sample->rank = first_rank_ + i;
      exchange_.Queue(*sample);
      return;
    }
    for (rdzv::StragglerChange change :
         rdzv::OnComputeSample(*state_, *sample, agent_.options.stragglers)) {
      change.rank += first_rank_;
      Say(change, agent_.options.host_name);
    }
  }

  // A change of one of this crun's ranks is said here; the node that runs a rank says its own.
  void Say(const rdzv::StragglerChange& change, const std::string& host) {
    const int i = change.rank - first_rank_;
    if (i < 0 || i >= static_cast<int>(windows_.size())) return;
    const int local = i + agent_.options.first_local_rank;
    if (agent_.meters != nullptr) agent_.meters->SlowRank(change.rank, change.named, change.ratio);
    if (change.named) {
      spdlog::warn("crun: slow rank on {} (local rank {}): {}", host, local,
                   rdzv::DescribeStraggler(change));
      if (agent_.options.straggler_action == StragglerAction::kExclude) {
        agent_.leave_job(lifecycle::NodeLeaves::Why::kExcluded,
                         "slow " + rdzv::DescribeStraggler(change) +
                             " (--straggler-action exclude)");
      } else if (agent_.options.straggler_action == StragglerAction::kRestart) {
        agent_.fail_rank(local, rdzv::DescribeSlowness(change));
      }
    } else {
      spdlog::warn("crun: rank {} on {} is no longer slow: {}", change.rank, host,
                   rdzv::DescribeStraggler(change));
    }
  }

  AgentView& agent_;
  StragglerExchange own_;  // where the rendezvous has none: this node judges alone
  StragglerExchange& exchange_;
  std::optional<rdzv::StragglerState> state_;  // where this node judges alone
  std::vector<rdzv::ComputeWindows> windows_;
  int first_rank_ = 0;
};

}  // namespace

std::unique_ptr<JobFeature> MakeStragglerWatch(AgentView& agent) {
  if (agent.options.straggler_action == StragglerAction::kOff) return nullptr;
  return std::make_unique<StragglerWatch>(agent);
}

}  // namespace crun::agent
