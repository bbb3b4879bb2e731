// The rendezvous daemon's metrics (crun_rendezvous_* in docs/observability.md). The engine
// counts events into them on its own thread (rounds, failures by cause, refusals, heartbeats,
// outcomes) and sets what it holds (jobs by phase, agents, each job's nodes and restarts) in
// Refresh, which the service runs before each scrape on that same thread.
//
// Per-job series carry the run id and go when the engine forgets the job (evicted after it
// ended, or replaced by a new job of the same run id): their number follows the jobs the
// daemon holds, bounded per family by kJobSeries (the rest go to the "other" series).
#pragma once

#include <string>
#include <string_view>

#include "metrics/registry.h"
#include "rendezvous/goodput/job_ledger.h"
#include "rendezvous/service/messages.h"

namespace crun::rdzv {

inline constexpr std::size_t kJobSeries = 4096;

// Why a round stopped or a job ended, as the failures_total "cause" label says it.
inline constexpr char kCauseExitCode[] = "exit_code";
inline constexpr char kCauseSignal[] = "signal";
inline constexpr char kCauseOom[] = "oom";
inline constexpr char kCauseHang[] = "hang";
inline constexpr char kCauseSlow[] = "slow_rank";
inline constexpr char kCauseNodeLost[] = "node_lost";
inline constexpr char kCauseHeartbeat[] = "heartbeat_timeout";

// The cause of a node's worker failure report: its first failure's (hang, slow_rank, oom,
// signal or exit_code).
const char* FailureCause(const msg::FailureReport& report);

// Why a call or a join was refused: refused_total's "reason" label.
inline constexpr char kRefusedNoToken[] = "token_missing";
inline constexpr char kRefusedWrongToken[] = "token_wrong";
inline constexpr char kRefusedVersion[] = "protocol_version";
inline constexpr char kRefusedBadJoin[] = "bad_join";  // no run/node id, invalid settings
inline constexpr char kRefusedMismatch[] = "settings_mismatch";
inline constexpr char kRefusedDuplicate[] = "duplicate_node";
inline constexpr char kRefusedEnded[] = "job_ended";
inline constexpr char kRefusedMalformed[] = "malformed";  // a Session message that does not parse

class EngineMetrics {
 public:
  explicit EngineMetrics(metrics::Registry& registry);

  // One job's series that the engine updates on hot paths (no lookup per heartbeat).
  struct JobSeries {
    metrics::Counter* heartbeats = nullptr;
    metrics::Counter* rounds = nullptr;
    metrics::Counter* restarts = nullptr;
    metrics::Gauge* members = nullptr;
    metrics::Gauge* spares = nullptr;
    metrics::Gauge* joined = nullptr;
    metrics::Gauge* world_size = nullptr;
  };
  JobSeries ForJob(const std::string& run_id);
  // Every series of the run id goes (its job was forgotten).
  void Forget(const std::string& run_id);

  void RoundFormed(JobSeries& job, double seconds_gathering);
  void Failure(const std::string& run_id, std::string_view cause);
  void Refused(std::string_view reason);
  void Finished(bool success);
  // A node failed its health gate and stayed out of the job (docs/health.md).
  void Unhealthy(const std::string& run_id);
  // The job-wide detector named a rank slow (docs/health.md, "Slow ranks").
  void StragglerNamed(const std::string& run_id);
  // The job's goodput ledger as of a scrape (docs/observability.md, "Goodput"), combined from
  // its nodes'; `known`: its workers report progress (else no ratio is shown).
  void Goodput(const std::string& run_id, const goodput::Totals& totals, bool known);
  // Run ids that have series (for tests: the jobs the engine holds).
  std::size_t held_runs() const { return rounds_.size(); }

  // Set at each scrape, by whoever knows them.
  metrics::Family<metrics::Gauge>& jobs;              // {phase}
  metrics::Family<metrics::Gauge>& agents;            // bound sessions
  metrics::Family<metrics::Gauge>& sessions;          // gRPC streams open
  metrics::Family<metrics::Counter>& sessions_total;  // gRPC streams opened

 private:
  metrics::Family<metrics::Counter>& finished_;
  metrics::Family<metrics::Counter>& refused_;
  metrics::Family<metrics::Counter>& heartbeats_;
  metrics::Family<metrics::Counter>& rounds_;
  metrics::Family<metrics::Histogram>& formation_;
  metrics::Family<metrics::Counter>& failures_;
  metrics::Family<metrics::Counter>& restarts_;
  metrics::Family<metrics::Counter>& unhealthy_;
  metrics::Family<metrics::Counter>& stragglers_;
  metrics::Family<metrics::Gauge>& nodes_;
  metrics::Family<metrics::Gauge>& world_size_;
  metrics::Family<metrics::Gauge>& goodput_seconds_;
  metrics::Family<metrics::Gauge>& goodput_ratio_;
};

}  // namespace crun::rdzv
