// The health gate (docs/health.md): before each join, the node's checks (--health-check) run
// at once; the join waits for them. A node that passes joins; one that fails leaves the job
// before it joins (AgentView::leave_job), to be requeued without it.
#include "agent/features/job_feature.h"
#include "agent/health/health_checks.h"

namespace crun::agent {
namespace {

class HealthGate final : public JobFeature {
 public:
  explicit HealthGate(AgentView& agent) : agent_(agent) {}
  HealthGate(const HealthGate&) = delete;
  HealthGate& operator=(const HealthGate&) = delete;

  void BeforeJoin(JoinGate& gate) override {
    run_ = RunHealthGate(agent_.io, agent_.workers.children(), agent_.options.health,
                         [this, pass = gate.Hold()](const HealthVerdict& v) {
                           run_.reset();
                           if (agent_.meters) agent_.meters->HealthChecked(v.ok(), v.took);
                           if (v.ok()) return pass();
                           agent_.leave_job(lifecycle::NodeLeaves::Why::kUnhealthy, v.Describe());
                         });
  }

  void OnFinish(int /*exit_code*/) override {
    if (run_) run_->Cancel();
  }

 private:
  AgentView& agent_;
  std::shared_ptr<HealthGateRun> run_;  // the gate under way, before a join
};

}  // namespace

std::unique_ptr<JobFeature> MakeHealthGate(AgentView& agent) {
  if (agent.options.health.checks.empty()) return nullptr;
  return std::make_unique<HealthGate>(agent);
}

}  // namespace crun::agent
