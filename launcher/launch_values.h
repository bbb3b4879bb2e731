// The launch options' values, parsed once: ParseLaunchValues turns every option that is text in
// LaunchOptions (numbers, durations, lists, specs, --rdzv-conf) into what it means, with the
// PET_* values already merged by the command line and torchrun's variables that stand in for a
// flag (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE) read where no
// flag is given. It checks each value on its own; PlanLaunch (launch_plan.h) then only decides,
// from these values and the machine. An error names the flag (or variable) and the value.
// The parsers of one flag's text (ParseNnodes, ParseRdzvConf, ...) live here with it;
// launch_options.h holds the text and the command line's table.
#pragma once

#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/agent_options.h"
#include "agent/snapshots/snapshot_options.h"
#include "base/status.h"
#include "launcher/getenv.h"
#include "launcher/launch_options.h"
#include "launcher/numa_binding.h"
#include "rendezvous/contracts/contract_set.h"
#include "rendezvous/rules/rules.h"

namespace crun::launcher {

// The largest node rank crun takes, from --node-rank or a pod's index.
inline constexpr int kMaxNodeRank = rdzv::kMaxNodes;

// ---- the value parsers: one flag's text, checked, as a value ----

// A run id names files and directories: 1 to 128 of letters, digits and "._-:@+=", not
// starting with '.' or '-'.
Status CheckRunId(const std::string& id);

struct NodeRange {
  int min = 1;
  int max = 1;
};
// "N" or "MIN:MAX", 1 <= MIN <= MAX <= 100000.
StatusOr<NodeRange> ParseNnodes(const std::string& v);

// A whole number in [min, max] for `flag`: "--max-restarts '-1': expected a whole number >= 0".
StatusOr<int> ParseFlagInt(const std::string& flag, const std::string& v, int min, int max);
// Seconds for `flag`: finite, >= 0, at most 30 days.
StatusOr<double> ParseFlagSeconds(const std::string& flag, const std::string& v);

// torchrun's Std spec: "3" for every local rank, or "0:1,1:2" per local rank (others 0).
// Values are bitmasks: 1 stdout, 2 stderr, 3 both.
struct StdSpec {
  int all = 0;                             // for every local rank, unless `ranks` is given
  std::vector<std::pair<int, int>> ranks;  // (local rank, value)
  // One value per local rank 0..nproc-1; ranks not on this node are left out.
  std::vector<int> For(int nproc) const;
};
StatusOr<StdSpec> ParseStdSpec(const std::string& flag, const std::string& spec);
// "0,2": local ranks (--local-ranks-filter), each a whole number >= 0.
StatusOr<std::vector<int>> ParseRankList(const std::string& list);
// Each of `ranks` in 0..nproc-1, or an error naming the first that is not.
Status CheckLocalRanks(const std::vector<int>& ranks, int nproc);
// "SIGTERM,SIGINT": signals crun may handle (not SIGKILL or SIGSTOP).
StatusOr<std::vector<int>> ParseSignals(const std::string& list);
// torchrun's duplicate filters: comma-separated substrings, ",," a literal comma.
std::vector<std::string> ParseFilters(const std::string& list);

// --rdzv-conf: torchrun's keys (times in seconds) plus crun's. Unknown keys are not errors
// (torchrun ignores them): they come back in `ignored` for a warning. A backend's own keys
// (launcher/backends/backend.h) are kept as text for its plan.
struct RdzvConf {
  std::optional<double> join_timeout, last_call_timeout, close_timeout, heartbeat_interval,
      heartbeat_timeout, read_timeout, reconnect_timeout;
  std::optional<double> connect_timeout;  // how long the rendezvous may take to answer at first
  std::optional<int> keep_alive_max_attempt;
  std::optional<bool> is_host;
  std::string node_id;
  std::map<std::string, std::string> backend_keys;  // of `backend_keys`, as given
  std::vector<std::string> ignored;
};
StatusOr<RdzvConf> ParseRdzvConf(const std::string& text,
                                 const std::set<std::string>& backend_keys = {});

// Seconds (as the flags give them) as a duration.
std::chrono::milliseconds Millis(double seconds);

// How long a silent node stays in the job: heartbeat_timeout when given; else, as torchrun's
// c10d backend means its keys, keep_alive_max_attempt missed heartbeats of keep_alive_interval
// (defaults 3 and 1 s) when either is given; else `fallback`.
std::chrono::milliseconds HeartbeatTimeout(const RdzvConf& conf,
                                           std::chrono::milliseconds fallback);

struct LaunchValues {
  // The job's settings, which every backend takes as they are (rendezvous/rules/settings.h):
  // --nnodes, --max-restarts, --max-restarts-without-progress, --contract and --rdzv-conf's
  // join_timeout, last_call_timeout and heartbeat timeout.
  rdzv::Settings settings;
  int node_rank = 0;
  int master_port = -1;  // -1: not given (a fresh free port per attempt)
  RdzvConf rdzv_conf;
  std::vector<std::string> warm_modules;     // --warm-modules: module names, checked
  bool snapshots = true;                     // --snapshots on
  bool snapshot_replicas = true;             // --snapshot-replicas on
  agent::SnapshotDiskOptions snapshot_disk;  // --checkpoint-dir and its options, checked
  std::vector<int> signals;                  // --signals-to-handle, as given
  std::chrono::milliseconds shutdown_timeout{30'000};
  std::chrono::milliseconds hang_timeout{0};  // 0: hangs are not watched
  int hang_after_steps = 0;                   // 0: off; else within hang_timeout
  std::chrono::milliseconds progress_after{300'000};
  // --health-check: the specs as given (one per line of PET_HEALTH_CHECK), parsed by the plan,
  // which knows where nvidia-smi is; each one's deadline.
  std::vector<std::string> health_checks;
  std::chrono::milliseconds health_check_timeout{60'000};
  agent::StragglerAction straggler_action = agent::StragglerAction::kWarn;
  StdSpec redirects, tee;
  std::vector<int> console_ranks;  // --local-ranks-filter (checked against nproc by the plan)
  std::vector<std::string> stdout_filters, stderr_filters;
  bool torchelastic_events = false;            // --event-log-handler console
  std::optional<std::string> prefix_template;  // the flag, else torchrun's variable
  std::optional<NumaMode> numa;
};

// `given`: the flags on the command line (GivenFlags); `backend_conf_keys`: the --rdzv-conf keys
// of some backend, kept as text for its plan (BackendConfKeys).
StatusOr<LaunchValues> ParseLaunchValues(const LaunchOptions& o, const std::set<std::string>& given,
                                         const Getenv& getenv,
                                         const std::set<std::string>& backend_conf_keys);

}  // namespace crun::launcher
