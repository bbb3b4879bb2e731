// The launcher's command line: torchrun 2.x's options (both spellings, PET_* fallbacks) and
// crun's own, as typed, and the parsers that turn each value into what it means. Parsers are
// pure: they read nothing but their arguments, and an error names the flag and the value.
// RunLaunch (launch_command.cc) validates everything with them before it creates anything.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/security.h"
#include "base/status.h"
#include "rendezvous/rules/rules.h"

namespace crun::launcher {

// --metrics-port and --metrics-host (docs/observability.md), on every crun that serves metrics.
struct MetricsFlags {
  std::optional<std::uint16_t> port;  // no endpoint unless given
  std::string host = "127.0.0.1";
};

// Values as given; numbers stay text until their parser has checked them.
struct LaunchOptions {
  std::string nnodes = "1:1";
  std::string nproc_per_node = "1";
  bool standalone = false;
  // The job settings with a flag of their own (rdzv::SettingFields: --max-restarts, ...), by
  // field name: their text as given; absent, their default.
  std::map<std::string, std::string> settings;
  std::string progress_after = "300";       // seconds: an attempt this old progressed
  std::vector<std::string> health_checks;   // --health-check, repeatable (docs/health.md)
  std::string health_check_timeout = "60";  // seconds, each check's
  std::string unhealthy_nodes_file;         // where a node that fails one notes its host
  std::string straggler_action = "warn";    // slow ranks (docs/health.md)
  std::string monitor_interval = "0.1";     // accepted for compatibility: crun does not poll
  std::string start_method = "spawn";       // accepted for compatibility: crun always execs
  std::string role = "default";
  bool module = false;
  bool no_python = false;
  bool run_path = false;
  std::string snapshots = "on";              // --snapshots: the node's snapshot store
  std::string snapshot_memory = "/dev/shm";  // --snapshot-memory: the tmpfs it uses
  std::string checkpoint_dir;                // --checkpoint-dir: snapshots also on disk
  std::string checkpoint_every = "100";      // --checkpoint-every STEPS
  std::string checkpoint_keep = "2";         // --checkpoint-keep K
  std::string resume_from_disk = "on";       // --resume-from-disk on|off
  std::string snapshot_replicas = "on";      // --snapshot-replicas on|off
  bool warm = false;         // --warm: Python workers forked from a template (docs/warm.md)
  std::string warm_modules;  // --warm-modules: imported by the template besides torch's
  std::string contract =
      "torch";  // --contract: other frameworks' variables (agent/frameworks/contracts.h)
  bool virtual_local_rank = false;
  std::string local_addr;
  std::string rdzv_id = "none";
  std::string rdzv_backend;   // empty: crun's dynamic backend with an endpoint, else static
  std::string rdzv_endpoint;  // host[:port]
  std::string rdzv_conf;      // key=value,...
  std::string master_addr = "127.0.0.1";
  std::string master_port;  // empty: a fresh free port per attempt
  std::string node_rank = "0";
  std::string shutdown_timeout;    // empty: TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30 s (14 in a pod)
  std::string hang_timeout = "0";  // seconds without progress; 0: hangs are not watched
  std::string hang_after_steps = "0";  // that many longest steps without progress; 0: off
  std::string signals = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  std::string log_level = "warn";
  std::string log_dir;
  std::string redirects = "0";
  std::string tee = "0";
  std::string local_ranks_filter;
  std::string log_line_prefix_template;  // empty: TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE
  std::string duplicate_stdout_filters, duplicate_stderr_filters;
  std::string event_log_handler = "null";
  std::string logs_specs;    // torchrun's plugin hook: only its default is accepted
  std::string numa_binding;  // empty: none
  std::string print_completion;
  bool slurm = false;                // one crun per node of a Slurm job step (launcher/slurm.h)
  bool slurm_direct = false;         // one crun per worker: each Slurm task is one worker
  int slurm_port = 0;                // 0: the step's default port
  crun::SecurityFlags security;      // job token and TLS of the rendezvous service
  MetricsFlags metrics;              // this node's /metrics endpoint
  std::string goodput_file;          // where the goodput ledger goes at the job's end
  std::vector<std::string> command;  // script and its arguments
};

// CLI11 checks with short messages: "--max-connections: '-1' is not a whole number from 0 to
// 1000000" rather than a range written out to 300 digits or a wrapped-around unsigned.
CLI::Validator WholeNumber(std::int64_t min, std::int64_t max);
CLI::Validator PositiveSeconds();

// `what` says what the page shows, for the help: "the store's statistics".
void AddMetricsFlags(CLI::App* app, MetricsFlags* f, const std::string& what);

// Declares every option on `app`, bound to `o`.
void AddLaunchOptions(CLI::App& app, LaunchOptions& o);

// The longest a flag's seconds may be: 30 days (beyond it clocks overflow nothing useful).
inline constexpr double kMaxFlagSeconds = 30 * 86'400.0;

// Every long option the launcher knows, both spellings ("--nproc-per-node", "--nproc_per_node").
std::vector<std::string> KnownLongOptions(const CLI::App& app);

// For a word that looks like an option but is none: "unknown option '--nproc-per-nodes' (did
// you mean --nproc-per-node?)". `word` may carry "=value".
std::string UnknownOptionMessage(const std::string& word, const std::vector<std::string>& known);

// A shell completion script for bash, zsh or tcsh listing `known`.
StatusOr<std::string> CompletionScript(const std::string& shell,
                                       const std::vector<std::string>& known);

}  // namespace crun::launcher
