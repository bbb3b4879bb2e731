#include "agent/observe/agent_metrics.h"

namespace crun::agent {
namespace {

const std::vector<std::string> kLabels{"run_id", "node", "role"};

std::vector<std::string> With(std::vector<std::string> names, const std::string& extra) {
  names.push_back(extra);
  return names;
}

std::vector<std::string> Values(const AgentMetricLabels& l) { return {l.run_id, l.node, l.role}; }

std::vector<std::string> Values(const AgentMetricLabels& l, const std::string& extra) {
  auto v = Values(l);
  v.push_back(extra);
  return v;
}

// Seconds from a failure to the replacements running: the stop (milliseconds, or the grace
// of a worker that ignores SIGTERM) plus the rendezvous (the last call of elastic jobs).
std::vector<double> RecoveryBuckets() {
  auto b = metrics::LatencyBuckets();
  b.insert(b.end(), {120, 300});
  return b;
}

}  // namespace

const char* ExitCauseOf(const ExitStatus& status, bool hung, bool oom, bool stopping) {
  if (hung) return kExitHang;
  if (oom) return kExitOom;
  if (status.success()) return kExitSuccess;
  if (stopping) return kExitStopped;  // crun's stop, not the worker's own failure
  return status.signaled ? kExitSignal : kExitCode;
}

AgentMetrics::AgentMetrics(metrics::Registry& r, const AgentMetricLabels& l)
    : exits_(r.AddCounter("crun_agent_worker_exits_total",
                          "This node's worker exits, by cause: success, exit_code, signal, "
                          "oom, hang, stopped (by crun), launch (could not start)",
                          With(kLabels, "cause"))),
      straggler_ratio_(r.AddGauge("crun_agent_straggler_ratio",
                                  "This node's ranks named slow now (docs/health.md), by RANK: "
                                  "the rank's compute time per step over the other ranks' "
                                  "median in the window that named it",
                                  With(kLabels, "rank"))),
      labels_(Values(l)) {
  AddWorkerFamilies(r, l);
  AddAttemptFamilies(r, l);
  AddSnapshotFamilies(r);
  for (const char* cause :
       {kExitSuccess, kExitCode, kExitSignal, kExitOom, kExitHang, kExitStopped, kExitLaunch}) {
    exits_.With(Values(l, cause));  // shown from 0
  }
}

metrics::Counter* AgentMetrics::Counter(metrics::Registry& r, const char* name, const char* help) {
  return &r.AddCounter(name, help, kLabels).With(labels_);
}

metrics::Gauge* AgentMetrics::Gauge(metrics::Registry& r, const char* name, const char* help) {
  return &r.AddGauge(name, help, kLabels).With(labels_);
}

// The workers by state, the health gate and slow ranks.
void AgentMetrics::AddWorkerFamilies(metrics::Registry& r, const AgentMetricLabels& l) {
  auto& workers = r.AddGauge("crun_agent_workers",
                             "This node's workers, by state: running, stopping (being stopped "
                             "by crun), exited (in the current attempt)",
                             With(kLabels, "state"));
  workers_running = &workers.With(Values(l, "running"));
  workers_stopping = &workers.With(Values(l, "stopping"));
  workers_exited = &workers.With(Values(l, "exited"));
  auto& health = r.AddCounter("crun_agent_health_checks_total",
                              "Health gates run before a join (--health-check), by result: "
                              "passed, failed",
                              With(kLabels, "result"));
  stragglers_ = Counter(r, "crun_agent_stragglers_total",
                        "This node's ranks named slow (--straggler-action)");
  health_passed_ = &health.With(Values(l, "passed"));
  health_failed_ = &health.With(Values(l, "failed"));
  health_seconds_ = &r.AddHistogram("crun_agent_health_check_seconds",
                                    "How long each health gate took, every check at once", kLabels,
                                    RecoveryBuckets())
                         .With(labels_);
}

// Restarts, rounds, recovery, the workers' output and the rendezvous.
void AgentMetrics::AddAttemptFamilies(metrics::Registry& r, const AgentMetricLabels& l) {
  restarts = Counter(r, "crun_agent_restarts_total",
                     "Restarts of the job's worker groups: TORCHELASTIC_RESTART_COUNT of this "
                     "node's latest workers");
  rounds = Counter(r, "crun_agent_rounds_total",
                   "Attempts started on this node (rounds in which it ran workers)");
  recovery = &r.AddHistogram("crun_agent_recovery_seconds",
                             "Time from a failure this node saw (one of its workers', or the "
                             "stop the rendezvous pushed) to its replacement workers running",
                             kLabels, RecoveryBuckets())
                  .With(labels_);
  auto& bytes =
      r.AddCounter("crun_agent_log_bytes_total",
                   "Bytes of the workers' output crun read, by stream", With(kLabels, "stream"));
  stdout_bytes = &bytes.With(Values(l, "stdout"));
  stderr_bytes = &bytes.With(Values(l, "stderr"));
  last_rendezvous_time = Gauge(r, "crun_agent_last_rendezvous_timestamp_seconds",
                               "When this node last got an assignment (Unix time)");
  last_rendezvous_duration = Gauge(r, "crun_agent_last_rendezvous_duration_seconds",
                                   "How long this node's last rendezvous took, from its join to "
                                   "its assignment");
  auto& seconds = r.AddCounter("crun_agent_goodput_seconds_total",
                               "This node's wall time by where it went (docs/observability.md, "
                               "\"Goodput\"): training, redone, starting, detecting, restarting, "
                               "reloading, waiting; settled up to the workers' last progress",
                               With(kLabels, "category"));
  for (goodput::Category c : goodput::kAllCategories) {
    goodput_seconds_[static_cast<std::size_t>(c)] =
        &seconds.With(Values(l, std::string(goodput::NameOf(c))));
  }
  goodput_ratio_ = Gauge(r, "crun_agent_goodput_ratio",
                         "This node's goodput: its time training new steps over its wall time");
}

// The node's snapshot memory, its copies on disk and on the next node.
void AgentMetrics::AddSnapshotFamilies(metrics::Registry& r) {
  snapshot_bytes = Gauge(r, "crun_agent_snapshot_bytes",
                         "Memory this node's crun holds for snapshots of its workers' state "
                         "(two buffers per local rank, charged to crun's cgroup)");
  snapshot_saves = Counter(r, "crun_agent_snapshot_saves_total",
                           "Snapshots this node's workers saved into crun's memory");
  snapshot_loads = Counter(r, "crun_agent_snapshot_loads_total",
                           "Loads of a snapshot this node's crun answered");
  snapshot_refusals = Counter(r, "crun_agent_snapshot_refusals_total",
                              "Snapshot buffers refused for want of room (tmpfs, cgroup, memory)");
  snapshot_corrupt = Counter(r, "crun_agent_snapshot_corrupt_total",
                             "Snapshots found changed since they were saved (a failed checksum), "
                             "not loaded");
  snapshot_disk_writes = Counter(r, "crun_agent_snapshot_disk_writes_total",
                                 "Snapshot files this node's crun wrote to --checkpoint-dir");
  snapshot_disk_skipped =
      Counter(r, "crun_agent_snapshot_disk_skipped_total",
              "Steps chosen for disk and not written: the last one was still being written, or "
              "the next save began while it was copied");
  snapshot_disk_failures = Counter(r, "crun_agent_snapshot_disk_failures_total",
                                   "Snapshot writes to --checkpoint-dir that failed");
  snapshot_disk_restores = Counter(r, "crun_agent_snapshot_disk_restores_total",
                                   "Snapshots this node's crun read back from --checkpoint-dir");
  snapshot_disk_step = Gauge(r, "crun_agent_snapshot_disk_step",
                             "The newest step this node's crun wrote to --checkpoint-dir");
  snapshot_replicas_sent = Counter(r, "crun_agent_snapshot_replicas_sent_total",
                                   "Snapshots this node copied to the next node of its round");
  snapshot_replica_failures =
      Counter(r, "crun_agent_snapshot_replica_failures_total",
              "Snapshots that did not reach the next node (it was gone, slow or refused them)");
  snapshot_replicas_received =
      Counter(r, "crun_agent_snapshot_replicas_received_total",
              "Snapshot copies this node received from the previous node and kept");
  snapshot_replica_refusals =
      Counter(r, "crun_agent_snapshot_replica_refusals_total",
              "Connections to this node's snapshot copies refused: no proof of the job's token");
  snapshot_replica_bytes = Gauge(r, "crun_agent_snapshot_replica_bytes",
                                 "Bytes of the other nodes' snapshot copies this node holds");
}

void AgentMetrics::Exit(const char* cause) {
  auto v = labels_;
  v.push_back(cause);
  exits_.With(v).Inc();
}

void AgentMetrics::HealthChecked(bool passed, std::chrono::steady_clock::duration took) {
  (passed ? health_passed_ : health_failed_)->Inc();
  health_seconds_->Observe(std::chrono::duration<double>(took).count());
}

void AgentMetrics::SlowRank(int rank, bool named, double ratio) {
  auto values = labels_;
  values.push_back(std::to_string(rank));
  if (!named) return straggler_ratio_.Remove(values);
  stragglers_->Inc();
  straggler_ratio_.With(values).Set(ratio);
}

void AgentMetrics::Goodput(const goodput::Totals& settled, double ratio) {
  for (goodput::Category c : goodput::kAllCategories) {
    goodput_seconds_[static_cast<std::size_t>(c)]->Mirror(
        static_cast<double>(goodput::At(settled, c)) / 1000.0);
  }
  goodput_ratio_->Set(ratio);
}

void AgentMetrics::SlowRanksReset() { straggler_ratio_.RemoveWhere(0, labels_.front()); }

}  // namespace crun::agent
