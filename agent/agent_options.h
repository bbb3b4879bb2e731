// AgentOptions: what one node's agent (LocalAgent) is told to do: the workers' command and
// count, restarts and grace, logs and streams, the contracts, hangs and metrics. The launcher
// fills it from the command line (launcher/launch_plan.h); the agent's parts read it.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/frameworks/contracts.h"
#include "agent/health/health_checks.h"
#include "agent/snapshots/snapshot_options.h"
#include "base/security.h"
#include "http/http_server.h"
#include "rendezvous/rules/rules.h"
#include "rendezvous/rules/stragglers.h"

namespace crun::agent {

// What every series of the agent's metrics is labelled with (observe/agent_metrics.h).
struct AgentMetricLabels {
  std::string run_id;
  std::string node;
  std::string role;
};

enum class StragglerAction { kOff, kWarn, kRestart, kExclude };

struct AgentOptions {
  // The worker command line; "${local_rank}" in it is replaced per worker.
  std::vector<std::string> command;
  int nproc = 1;
  // Local ranks first_local_rank .. first_local_rank + nproc - 1 run here: 0 for a crun that
  // starts the whole node; SLURM_LOCALID for one crun per Slurm task (docs/slurm.md).
  int first_local_rank = 0;
  int max_restarts = 0;
  // Crash loops (docs/health.md): this many failures in a row, the same way and before any
  // progress, end the job with report::kExitDoNotRequeue (0: never). Progress is a step
  // heartbeat (CRUN_HEARTBEAT_FD) from any local rank, or an attempt older than progress_after.
  int max_restarts_without_progress = rdzv::kDefaultMaxRestartsWithoutProgress;
  std::chrono::milliseconds progress_after{300'000};
  std::chrono::milliseconds shutdown_timeout{30'000};
  // How long an attempt's leftovers may take to die after SIGKILL before the job ends rather
  // than start another attempt beside them (AttemptEdge).
  std::chrono::milliseconds edge_timeout{30'000};
  std::vector<int> forward_signals;  // empty: SIGTERM, SIGINT, SIGHUP, SIGQUIT
  std::string host_name;             // for reports
  std::string entrypoint;            // the script or program, for reports

  // Logs (docs/cli.md): <log_dir>/attempt_<n>/<local_rank>/{stdout,stderr}.log and
  // error.json, <log_dir>/failure.json. log_dir is this run's and this node's alone.
  // Bitmasks per local rank: 1 stdout, 2 stderr (absent ranks: 0).
  std::string log_dir;             // must exist
  std::vector<int> redirects;      // to the file only
  std::vector<int> tees;           // to the file and the console, prefixed
  std::vector<int> console_ranks;  // empty: every local rank reaches the console
  // ${role_name}, ${rank}, ${local_rank}, ${hostname} are replaced.
  std::string prefix_template = "[${role_name}${rank}]:";
  // Lines containing one of these are also written, prefixed, to
  // attempt_<n>/filtered_stdout.log (filtered_stderr.log): torchrun's duplicate filters.
  std::vector<std::string> stdout_filters, stderr_filters;
  // --event-log-handler console: lifecycle events as JSON lines on stderr (docs/cli.md).
  bool torchelastic_events = false;
  // --numa-binding: per local rank (index 0 is first_local_rank); empty: no binding.
  struct Binding {
    std::vector<int> cpus, mems;
  };
  std::vector<Binding> bindings;
  // How Python workers' interpreter was chosen ("/usr/bin/python3 (python3 on PATH ...)"),
  // for the report's hint when a module is missing; empty for native programs.
  std::string interpreter;
  // --warm (docs/warm.md): Python workers are forked from a template process that has
  // imported these modules ("name?": may be missing); empty: every worker starts cold.
  std::vector<std::string> warm_modules;
  // --contract (agent/frameworks/contracts.h): the other frameworks' variables each worker gets,
  // and the ports this node reserves at each join for them.
  ContractSet contracts;
  // The node's snapshot store (docs/checkpoints.md): workers save their training state into
  // memory crun holds across attempts (CRUN_SNAPSHOT_SOCKET); its buffers are unnamed files on
  // the tmpfs snapshot_memory.
  bool snapshots = true;
  std::string snapshot_memory = "/dev/shm";
  // --checkpoint-dir and its options: the snapshots chosen for disk, written off the
  // training path, and whether a load may resume from them.
  SnapshotDiskOptions snapshot_disk;
  // Whether snapshots are copied to the next node of each round of several nodes (replicas.h),
  // and the job's token and TLS that those copies are sent with (empty: none).
  bool snapshot_replicas = false;
  Security snapshot_security;
  // Shared with the rendezvous, which reports it in its heartbeats.
  std::shared_ptr<SnapshotFacts> snapshot_facts = std::make_shared<SnapshotFacts>();
  // crun's own TORCHELASTIC_ERROR_FILE (set by a scheduler): gets the root cause's error.
  std::string parent_error_file;

  // The health gate (docs/health.md): these checks run before every join (none: no gate). A
  // node that fails one does not join; it says why to the rendezvous and exits with
  // report::kExitRequeueWithoutNode, after appending its host name to unhealthy_nodes_file
  // (when set) for the scheduler's script; so does a node that leaves for a slow rank
  // (StragglerAction::kExclude).
  HealthGateOptions health;
  std::string unhealthy_nodes_file;
  // The goodput ledger's JSON (rendezvous/goodput/ledger_json.h), written at the job's end;
  // empty: none (docs/observability.md).
  std::string goodput_file;

  // Slow ranks (docs/health.md): what crun does with a rank whose compute time per step
  // (step records on CRUN_HEARTBEAT_FD) stays above the others', as `stragglers` judges it.
  StragglerAction straggler_action = StragglerAction::kWarn;
  rdzv::StragglerSettings stragglers;

  // Hangs (docs/hangs.md). A worker with no progress for hang_timeout is hung (0: not
  // watched): its output, its heartbeats (CRUN_HEARTBEAT_FD) and its file-timer requests are
  // progress. A hang is a failure of that rank: every rank's stacks are read, then the group is
  // stopped and restarted as for any failure.
  std::chrono::milliseconds hang_timeout{0};
  // A worker that reports steps is hung after this many times the longest step so far without
  // progress, within hang_timeout (agent/hangs/step_pace.h; 0: off).
  int hang_after_steps = 0;
  // torchelastic's file timer (TORCHELASTIC_ENABLE_FILE_TIMER=1): the server crun runs, on the
  // pipe timer_file (empty: <log_dir>/timer.pipe), given to workers as TORCHELASTIC_TIMER_FILE.
  bool file_timer = false;
  std::string timer_file;
  // How long each stack tool may take per rank.
  std::chrono::milliseconds stack_deadline{10'000};
  // crun's PATH, where the stack tools are looked for (and beside command[0] for py-spy).
  std::string tool_path;

  // Prometheus metrics at /metrics (agent_metrics.h, docs/observability.md), served on the
  // agent's event loop from Run() until the job ends; none when unset. The labels' node is
  // the rendezvous's node id. With metrics, every worker stream goes through crun (its bytes
  // are counted), as with hang_timeout.
  std::optional<http::HttpServerOptions> metrics;
  AgentMetricLabels metric_labels;
};

// Whether an attempt's progress is watched for crash loops: only a job that restarts has one.
inline bool WatchesCrashLoops(const AgentOptions& o) {
  return o.max_restarts > 0 && o.max_restarts_without_progress > 0;
}

}  // namespace crun::agent
