// The launch options' values, parsed once: ParseLaunchValues turns every option that is text in
// LaunchOptions (numbers, durations, lists, specs, --rdzv-conf) into what it means, with the
// PET_* values already merged by the command line and torchrun's variables that stand in for a
// flag (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE) read where no
// flag is given. It checks each value on its own; PlanLaunch (launch_plan.h) then only decides,
// from these values and the machine. An error names the flag (or variable) and the value.
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

struct LaunchValues {
  NodeRange nnodes;
  int max_restarts = 0;
  int max_restarts_without_progress = rdzv::kDefaultMaxRestartsWithoutProgress;
  int node_rank = 0;
  int master_port = -1;  // -1: not given (a fresh free port per attempt)
  RdzvConf rdzv_conf;
  ContractSet contracts;
  std::vector<std::string> warm_modules;     // --warm-modules: module names, checked
  bool snapshots = true;                     // --snapshots on
  bool snapshot_replicas = true;             // --snapshot-replicas on
  agent::SnapshotDiskOptions snapshot_disk;  // --checkpoint-dir and its options, checked
  std::vector<int> signals;                  // --signals-to-handle, as given
  std::chrono::milliseconds shutdown_timeout{30'000};
  std::chrono::milliseconds hang_timeout{0};  // 0: hangs are not watched
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
