// Prometheus metrics at /metrics (observe/agent_metrics.h, docs/observability.md), served on
// the agent's event loop from the job's start until its end. The series count what the
// agent's hooks tell: rounds, restarts, each worker's exit by cause, the time from the first
// failure or stop to the replacements running, and the bytes the workers wrote.
#include "agent/features/job_feature.h"
#include "agent/observe/agent_metrics.h"
#include "base/fd_writer.h"
#include "metrics/endpoint.h"

namespace crun::agent {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

class MetricsEndpoint final : public JobFeature {
 public:
  explicit MetricsEndpoint(AgentView& agent)
      : agent_(agent), registry_(*agent.registry), meters_(*agent.meters) {}

  // The endpoint; an error names its address.
  Status Prepare() override {
    registry_.OnScrape([this] { Refresh(); });
    auto started = metrics::ServeMetrics(
        agent_.io, *agent_.options.metrics, [this] { return registry_.Render(); }, &agent_.pages);
    if (!started.ok()) return started.status();
    server_ = std::move(started).value();
    FdWriter::Stderr().Write("crun: metrics on " + server_->url() + "\n");
    return Status::Ok();
  }

  // Every stream goes through crun, to count its bytes.
  void ConfigureStreams(StreamOptions& s) override {
    s.pump_all = true;
    s.stdout_bytes = meters_.stdout_bytes;
    s.stderr_bytes = meters_.stderr_bytes;
  }

  void OnRound(Clock::duration waited) override {
    meters_.last_rendezvous_time->Set(
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
    meters_.last_rendezvous_duration->Set(Seconds(waited));
  }

  void OnLaunched(const std::vector<WorkerStart>& starts) override {
    for (const auto& s : starts) {
      if (!s.launch.started) meters_.Exit(kExitLaunch);
    }
  }

  void OnAttemptStarted() override {
    meters_.rounds->Inc();
    meters_.restarts->Mirror(agent_.group.restart_count);
    if (interrupted_at_) meters_.recovery->Observe(Seconds(Clock::now() - *interrupted_at_));
    interrupted_at_.reset();
  }

  void OnWorkerExited(const WorkerEnd& e) override {
    if (e.stops_group && !interrupted_at_) interrupted_at_ = Clock::now();
    const bool oom = e.failure != nullptr && !e.failure->oom.empty();
    meters_.Exit(ExitCauseOf(e.exit, e.hung, oom, e.stopping));
  }

  void OnRestarting(const StopNotice&) override {
    if (!interrupted_at_) interrupted_at_ = Clock::now();
  }

  void OnFinish(int) override {
    if (server_) server_->Stop();
  }

 private:
  // What the page shows of the workers' states, read at each scrape.
  void Refresh() {
    const bool stopping = agent_.lifecycle.phase == lifecycle::Phase::kStopping;
    const int running = agent_.workers.running();
    meters_.workers_running->Set(stopping ? 0 : running);
    meters_.workers_stopping->Set(stopping ? running : 0);
    meters_.workers_exited->Set(agent_.workers.exited());
  }

  AgentView& agent_;
  metrics::Registry& registry_;  // the agent's
  AgentMetrics& meters_;
  std::unique_ptr<http::HttpServer> server_;
  // The first failure or stop seen since the workers last started (recovery_seconds).
  std::optional<Clock::time_point> interrupted_at_;
};

}  // namespace

std::unique_ptr<JobFeature> MakeMetricsEndpoint(AgentView& agent) {
  if (!agent.options.metrics || agent.registry == nullptr) return nullptr;
  return std::make_unique<MetricsEndpoint>(agent);
}

}  // namespace crun::agent
