// The per-node crun's metrics (crun_agent_* in docs/observability.md): this node's workers by
// state, their exits by cause, restarts and rounds, the time from a failure to the
// replacements running, the bytes of output crun read, and the last rendezvous. Every series
// carries the job's run_id, this agent's node id and the workers' role: a process serves one
// job, so each family holds a handful of series (one per state, cause or stream).
// Counted on the agent's event loop, where the page is also rendered.
#pragma once

#include <array>
#include <chrono>
#include <string>

#include "agent/agent_options.h"
#include "agent/supervise/exit_status.h"
#include "metrics/registry.h"
#include "rendezvous/goodput/ledger.h"

namespace crun::agent {

// Why a worker exited: worker_exits_total's "cause".
inline constexpr char kExitSuccess[] = "success";
inline constexpr char kExitCode[] = "exit_code";   // a non-zero exit code
inline constexpr char kExitSignal[] = "signal";    // killed by a signal it was not sent by crun
inline constexpr char kExitOom[] = "oom";          // the kernel's OOM killer
inline constexpr char kExitHang[] = "hang";        // no progress for --hang-timeout
inline constexpr char kExitStopped[] = "stopped";  // crun stopped it (another's failure, a signal)
inline constexpr char kExitLaunch[] = "launch";    // could not be started

// The cause of one worker exit: `hung` (crun found it hung and stopped it), `oom` (the kernel's
// OOM killer took it), `stopping` (crun was stopping the group when it exited).
const char* ExitCauseOf(const ExitStatus& status, bool hung, bool oom, bool stopping);

class AgentMetrics {
 public:
  AgentMetrics(metrics::Registry& registry, const AgentMetricLabels& labels);

  // This node's series (valid while the registry lives).
  metrics::Gauge* workers_running;
  metrics::Gauge* workers_stopping;
  metrics::Gauge* workers_exited;
  metrics::Counter* restarts;  // mirrored: the job-wide count the rendezvous gives
  metrics::Counter* rounds;    // attempts started on this node
  metrics::Histogram* recovery;
  metrics::Counter* stdout_bytes;
  metrics::Counter* stderr_bytes;
  metrics::Gauge* last_rendezvous_time;      // seconds since the epoch
  metrics::Gauge* last_rendezvous_duration;  // join to assignment
  // The node's snapshot store (docs/checkpoints.md).
  metrics::Gauge* snapshot_bytes;       // memory crun holds for snapshots
  metrics::Counter* snapshot_saves;     // snapshots saved
  metrics::Counter* snapshot_loads;     // loads answered
  metrics::Counter* snapshot_refusals;  // saves refused: no room
  metrics::Counter* snapshot_corrupt;   // snapshots that failed their checksum
  // --checkpoint-dir: what the disk writer did.
  metrics::Counter* snapshot_disk_writes;        // files written
  metrics::Counter* snapshot_disk_skipped;       // chosen steps not written (writer busy, or torn)
  metrics::Counter* snapshot_disk_failures;      // writes that failed
  metrics::Counter* snapshot_disk_restores;      // snapshots read back from disk
  metrics::Gauge* snapshot_disk_step;            // the newest step written
  metrics::Counter* snapshot_replicas_sent;      // copies the next node kept
  metrics::Counter* snapshot_replica_failures;   // copies that did not reach it
  metrics::Counter* snapshot_replicas_received;  // copies kept for the previous node
  metrics::Counter* snapshot_replica_refusals;   // connections without the job's token
  metrics::Gauge* snapshot_replica_bytes;        // what the kept copies hold
  void Exit(const char* cause);
  // The health gate ran before a join (docs/health.md): passed or failed, in `took`.
  void HealthChecked(bool passed, std::chrono::steady_clock::duration took);
  // Slow ranks (docs/health.md): a rank of this node named slow, with its ratio, or cleared;
  // and every one cleared when an attempt starts over.
  void SlowRank(int rank, bool named, double ratio);
  void SlowRanksReset();
  // The goodput ledger (docs/observability.md, "Goodput"): this node's settled time by
  // category, and its goodput now (training over wall time, pending time counted).
  void Goodput(const goodput::Totals& settled, double ratio);

 private:
  // One series of a family labelled with this node's labels only.
  metrics::Counter* Counter(metrics::Registry& r, const char* name, const char* help);
  metrics::Gauge* Gauge(metrics::Registry& r, const char* name, const char* help);
  void AddWorkerFamilies(metrics::Registry& r, const AgentMetricLabels& l);
  void AddAttemptFamilies(metrics::Registry& r, const AgentMetricLabels& l);
  void AddSnapshotFamilies(metrics::Registry& r);

  metrics::Family<metrics::Counter>& exits_;
  metrics::Family<metrics::Gauge>& straggler_ratio_;
  metrics::Counter* stragglers_ = nullptr;
  metrics::Counter* health_passed_ = nullptr;
  metrics::Counter* health_failed_ = nullptr;
  metrics::Histogram* health_seconds_ = nullptr;
  std::array<metrics::Counter*, goodput::kCategories> goodput_seconds_{};
  metrics::Gauge* goodput_ratio_ = nullptr;
  std::vector<std::string> labels_;
};

}  // namespace crun::agent
