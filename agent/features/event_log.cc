// --event-log-handler console (docs/cli.md): torchelastic's lifecycle events as JSON lines on
// stderr (observe/torchelastic_events.h): each round, the workers' health and exits, restarts
// and the job's end.
#include "agent/features/job_feature.h"
#include "agent/observe/torchelastic_events.h"

namespace crun::agent {
namespace {

class EventLog final : public JobFeature {
 public:
  explicit EventLog(AgentView& agent) : agent_(agent), events_(agent.options.host_name) {}

  void OnRound(std::chrono::steady_clock::duration) override {
    const GroupAssignment& g = agent_.group;
    events_.Emit("torchelastic.rendezvous.round", "AGENT",
                 {{"round", g.round},
                  {"spare", g.spare},
                  {"group_world_size", g.group_world_size},
                  {"world_size", g.world_size},
                  {"master_addr", g.master_addr},
                  {"master_port", g.master_port}},
                 g);
  }

  void OnAttemptStarted() override {
    const GroupAssignment& g = agent_.group;
    nlohmann::json pids = nlohmann::json::array();
    for (const auto& w : agent_.workers.workers()) pids.push_back(w.pid);
    events_.Emit("torchelastic.worker.status.HEALTHY", "AGENT",
                 {{"state", "HEALTHY"},
                  {"round", g.round},
                  {"world_size", g.world_size},
                  {"first_rank", g.base_rank + agent_.options.first_local_rank},
                  {"pids", pids}},
                 g);
  }

  void OnWorkerExited(const WorkerEnd& e) override {
    events_.WorkerStatus(e.worker, e.exit.success() ? "SUCCEEDED" : "FAILED", agent_.group);
  }

  void OnRestarting(const StopNotice& stop) override {
    events_.Emit("torchelastic.agent.restart", "AGENT",
                 {{"reason", stop.reason}, {"spends_restart", stop.spends_restart}}, agent_.group);
  }

  void OnFinish(int code) override {
    const char* state = code == 0 ? "SUCCEEDED" : "FAILED";
    events_.Emit(std::string("torchelastic.worker.status.") + state, "AGENT",
                 {{"state", state}, {"exit_code", code}}, agent_.group);
  }

 private:
  AgentView& agent_;
  TorchelasticEvents events_;
};

}  // namespace

std::unique_ptr<JobFeature> MakeEventLog(AgentView& agent) {
  if (!agent.options.torchelastic_events) return nullptr;
  return std::make_unique<EventLog>(agent);
}

}  // namespace crun::agent
