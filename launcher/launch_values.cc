#include "launcher/launch_values.h"

#include <cctype>
#include <map>

#include "agent/frameworks/contracts.h"
#include "base/numbers.h"
#include "base/spelling.h"
#include "base/text.h"
#include "launcher/kubernetes.h"

namespace crun::launcher {
namespace {

// The checks of values that need nothing else: a flag given empty (an unset shell variable,
// not "default"), the run id, torchrun's options whose other values name Python plugins.
Status CheckPlainValues(const LaunchOptions& o, const std::set<std::string>& given) {
  const std::pair<const char*, const std::string*> named[] =
      {{"--rdzv-endpoint", &o.rdzv_endpoint},
       {"--log-dir", &o.log_dir},
       {"--rdzv-id", &o.rdzv_id},
       {"--master-addr", &o.master_addr},
       {"--local-addr", &o.local_addr},
       {"--role", &o.role},
       {"--nproc-per-node", &o.nproc_per_node},
       {"--nnodes", &o.nnodes}};
  for (const auto& [flag, value] : named) {
    if (given.count(flag) != 0 && value->empty()) {
      return InvalidArgument(std::string(flag) + " is empty (an unset variable?)");
    }
  }
  CRUN_RETURN_IF_ERROR(CheckRunId(o.rdzv_id));
  CRUN_RETURN_IF_ERROR(ParseFlagSeconds("--monitor-interval", o.monitor_interval).status());
  if (o.start_method != "spawn" && o.start_method != "fork" && o.start_method != "forkserver") {
    return InvalidArgument("--start-method '" + o.start_method +
                           "': expected spawn, fork or forkserver");
  }
  if (o.event_log_handler != "null" && o.event_log_handler != "console") {
    return InvalidArgument("--event-log-handler '" + o.event_log_handler +
                           "': expected console or null (torchrun's other handlers are Python "
                           "plugins crun cannot load)");
  }
  if (!o.logs_specs.empty() && o.logs_specs != "DefaultLogsSpecs" && o.logs_specs != "default") {
    return InvalidArgument("--logs-specs '" + o.logs_specs +
                           "': torchrun loads log layouts from Python entry points, which crun "
                           "cannot run; only the default (DefaultLogsSpecs) is accepted — "
                           "crun's layout is in docs/cli.md, Logs");
  }
  return Status::Ok();
}

Status ParseNumbers(LaunchValues& v, const LaunchOptions& o) {
  CRUN_ASSIGN_OR_RETURN(v.nnodes, ParseNnodes(o.nnodes));
  CRUN_ASSIGN_OR_RETURN(v.max_restarts,
                        ParseFlagInt("--max-restarts", o.max_restarts, 0, 1'000'000));
  CRUN_ASSIGN_OR_RETURN(v.max_restarts_without_progress,
                        ParseFlagInt("--max-restarts-without-progress",
                                     o.max_restarts_without_progress, 0, 1'000'000));
  CRUN_ASSIGN_OR_RETURN(v.node_rank, ParseFlagInt("--node-rank", o.node_rank, 0, kMaxNodeRank));
  if (!o.master_port.empty()) {
    CRUN_ASSIGN_OR_RETURN(v.master_port, ParseFlagInt("--master-port", o.master_port, 0, 65535));
  }
  return Status::Ok();
}

// --shutdown-timeout, else TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30 s (14 s in a Kubernetes pod:
// kubernetes.h); --hang-timeout.
Status ParseDurations(LaunchValues& v, const LaunchOptions& o, const Getenv& getenv) {
  double seconds = InPod(getenv) ? kPodShutdownSeconds : 30;
  if (!o.shutdown_timeout.empty()) {
    CRUN_ASSIGN_OR_RETURN(seconds, ParseFlagSeconds("--shutdown-timeout", o.shutdown_timeout));
  } else if (auto env = EnvValue(getenv, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT")) {
    CRUN_ASSIGN_OR_RETURN(seconds, ParseFlagSeconds("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", *env));
  }
  v.shutdown_timeout = Millis(seconds);
  CRUN_ASSIGN_OR_RETURN(const double hang, ParseFlagSeconds("--hang-timeout", o.hang_timeout));
  v.hang_timeout = Millis(hang);
  CRUN_ASSIGN_OR_RETURN(const double progress,
                        ParseFlagSeconds("--progress-after", o.progress_after));
  v.progress_after = Millis(progress);
  CRUN_ASSIGN_OR_RETURN(const double health,
                        ParseFlagSeconds("--health-check-timeout", o.health_check_timeout));
  if (health <= 0) {
    return InvalidArgument("--health-check-timeout '" + o.health_check_timeout +
                           "': a health check needs a deadline above 0 seconds");
  }
  v.health_check_timeout = Millis(health);
  const std::map<std::string, agent::StragglerAction> actions =
      {{"off", agent::StragglerAction::kOff},
       {"warn", agent::StragglerAction::kWarn},
       {"restart", agent::StragglerAction::kRestart},
       {"exclude", agent::StragglerAction::kExclude}};
  if (auto a = actions.find(o.straggler_action); a != actions.end()) {
    v.straggler_action = a->second;
  } else {
    std::string why =
        "--straggler-action '" + o.straggler_action + "': expected warn, restart, exclude or off";
    if (auto best = ClosestName(o.straggler_action, {"warn", "restart", "exclude", "off"});
        !best.empty()) {
      why += " (did you mean " + best + "?)";
    }
    return InvalidArgument(why);
  }
  for (const auto& given : o.health_checks) {
    for (const auto& line : SplitLines(given)) {
      if (!Trim(line).empty()) v.health_checks.emplace_back(Trim(line));
    }
    if (Trim(given).empty()) {
      return InvalidArgument(
          "--health-check '': give gpu, disk[:SIZE], memory[:SIZE] or a "
          "command");
    }
  }
  return Status::Ok();
}

// --warm-modules: Python module names.
StatusOr<std::vector<std::string>> ParseWarmModules(const std::string& list) {
  std::vector<std::string> out;
  for (const auto& m : ParseFilters(list)) {
    if (m.empty() ||
        m.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                            "0123456789_.") != std::string::npos ||
        m.front() == '.' || m.back() == '.' || std::isdigit(static_cast<unsigned char>(m[0]))) {
      return InvalidArgument("--warm-modules: '" + m + "' is not a Python module name");
    }
    out.push_back(m);
  }
  return out;
}

// The workers' output: --redirects, --tee, --local-ranks-filter, the duplicate filters, the
// prefix template and the event log.
Status ParseOutput(LaunchValues& v, const LaunchOptions& o, const Getenv& getenv) {
  CRUN_ASSIGN_OR_RETURN(v.redirects, ParseStdSpec("--redirects", o.redirects));
  CRUN_ASSIGN_OR_RETURN(v.tee, ParseStdSpec("--tee", o.tee));
  CRUN_ASSIGN_OR_RETURN(v.console_ranks, ParseRankList(o.local_ranks_filter));
  v.stdout_filters = ParseFilters(o.duplicate_stdout_filters);
  v.stderr_filters = ParseFilters(o.duplicate_stderr_filters);
  v.torchelastic_events = o.event_log_handler == "console";
  const auto prefix = EnvValue(getenv, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
  if (!o.log_line_prefix_template.empty()) {
    v.prefix_template = o.log_line_prefix_template;
  } else if (prefix && !prefix->empty()) {
    v.prefix_template = *prefix;
  }
  return Status::Ok();
}

StatusOr<agent::SnapshotDiskOptions> ParseSnapshotDisk(const LaunchOptions& o, bool snapshots) {
  agent::SnapshotDiskOptions d;
  const auto every = ParseInteger(o.checkpoint_every, 1, INT32_MAX);
  if (!every) {
    return InvalidArgument("--checkpoint-every '" + o.checkpoint_every +
                           "' is not a whole number of steps from 1 to 2147483647");
  }
  const auto keep = ParseInteger(o.checkpoint_keep, 1, 1000);
  if (!keep) {
    return InvalidArgument("--checkpoint-keep '" + o.checkpoint_keep +
                           "' is not a whole number from 1 to 1000");
  }
  if (o.resume_from_disk != "on" && o.resume_from_disk != "off") {
    return InvalidArgument("--resume-from-disk '" + o.resume_from_disk +
                           "' is not valid: expected on or off");
  }
  d.every = static_cast<std::uint64_t>(*every);
  d.keep = static_cast<int>(*keep);
  d.resume = o.resume_from_disk == "on";
  d.dir = o.checkpoint_dir;
  if (!d.dir.empty() && !snapshots) {
    return InvalidArgument("--checkpoint-dir " + d.dir +
                           " writes the node's snapshots to disk, and --snapshots is off");
  }
  return d;
}

}  // namespace

StatusOr<LaunchValues> ParseLaunchValues(const LaunchOptions& o, const std::set<std::string>& given,
                                         const Getenv& getenv,
                                         const std::set<std::string>& backend_conf_keys) {
  LaunchValues v;
  CRUN_RETURN_IF_ERROR(CheckPlainValues(o, given));
  CRUN_RETURN_IF_ERROR(ParseNumbers(v, o));
  CRUN_ASSIGN_OR_RETURN(v.rdzv_conf, ParseRdzvConf(o.rdzv_conf, backend_conf_keys));
  CRUN_ASSIGN_OR_RETURN(v.contracts, agent::ParseContracts(o.contract));
  if (!o.warm && !o.warm_modules.empty()) return InvalidArgument("--warm-modules needs --warm");
  CRUN_ASSIGN_OR_RETURN(v.warm_modules, ParseWarmModules(o.warm_modules));
  if (o.snapshots != "on" && o.snapshots != "off") {
    return InvalidArgument("--snapshots '" + o.snapshots + "' is not valid: expected on or off");
  }
  v.snapshots = o.snapshots == "on";
  if (o.snapshot_replicas != "on" && o.snapshot_replicas != "off") {
    return InvalidArgument("--snapshot-replicas '" + o.snapshot_replicas +
                           "' is not valid: expected on or off");
  }
  v.snapshot_replicas = o.snapshot_replicas == "on" && v.snapshots;
  CRUN_ASSIGN_OR_RETURN(v.snapshot_disk, ParseSnapshotDisk(o, v.snapshots));
  CRUN_ASSIGN_OR_RETURN(v.signals, ParseSignals(o.signals));
  CRUN_RETURN_IF_ERROR(ParseDurations(v, o, getenv));
  CRUN_RETURN_IF_ERROR(ParseOutput(v, o, getenv));
  if (!o.numa_binding.empty()) {
    CRUN_ASSIGN_OR_RETURN(v.numa, ParseNumaMode(o.numa_binding));
  }
  return v;
}

}  // namespace crun::launcher
