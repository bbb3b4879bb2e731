#include "launcher/launch_values.h"

#include <cctype>
#include <cstring>
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
  CRUN_ASSIGN_OR_RETURN(const NodeRange nodes, ParseNnodes(o.nnodes));
  v.settings.min_nodes = nodes.min;
  v.settings.max_nodes = nodes.max;
  for (const auto& f : rdzv::SettingFields()) {  // those with a flag of their own
    const auto given = f.flags == nullptr ? o.settings.end() : o.settings.find(f.name);
    if (given == o.settings.end()) continue;
    const std::string flag(f.flags, std::strcspn(f.flags, ","));
    CRUN_ASSIGN_OR_RETURN(const int value,
                          ParseFlagInt(flag, given->second, static_cast<int>(f.min),
                                       static_cast<int>(f.max)));
    f.set(v.settings, value);
  }
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
  CRUN_ASSIGN_OR_RETURN(v.hang_after_steps,
                        ParseFlagInt("--hang-after-steps", o.hang_after_steps, 0, 1000));
  if (v.hang_after_steps > 0 && v.hang_timeout.count() <= 0) {
    return InvalidArgument("--hang-after-steps " + o.hang_after_steps +
                           " needs --hang-timeout: the longest a hang may go unseen, whatever "
                           "the steps say");
  }
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
  const RdzvConf& conf = v.rdzv_conf;
  if (conf.join_timeout) v.settings.join_timeout = Millis(*conf.join_timeout);
  if (conf.last_call_timeout) v.settings.last_call_timeout = Millis(*conf.last_call_timeout);
  v.settings.heartbeat_timeout = HeartbeatTimeout(conf, v.settings.heartbeat_timeout);
  CRUN_ASSIGN_OR_RETURN(v.settings.contracts, agent::ParseContracts(o.contract));
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

// ---- the value parsers ----

namespace {

std::vector<std::string> Split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, sep)) out.push_back(item);
  return out;
}

}  // namespace

Status CheckRunId(const std::string& id) {
  const bool ok = !id.empty() && id.size() <= 128 && id[0] != '.' && id[0] != '-' &&
                  std::all_of(id.begin(), id.end(), [](unsigned char c) {
                    return std::isalnum(c) != 0 || std::strchr("._-:@+=", c) != nullptr;
                  });
  if (ok) return Status::Ok();
  const std::string shown = id.size() > 40 ? id.substr(0, 40) + "..." : id;
  return InvalidArgument("--rdzv-id '" + shown + "' (" + std::to_string(id.size()) +
                         " characters): a run id is 1 to 128 letters, digits and ._-:@+=, not "
                         "starting with '.' or '-'");
}

StatusOr<NodeRange> ParseNnodes(const std::string& v) {
  const auto colon = v.find(':');
  const std::string lo = v.substr(0, colon);
  const std::string hi = colon == std::string::npos ? lo : v.substr(colon + 1);
  const auto min = ParseInteger(lo, 1, rdzv::kMaxNodes);
  const auto max = ParseInteger(hi, 1, rdzv::kMaxNodes);
  if (!min || !max || *max < *min) {
    return InvalidArgument("--nnodes '" + v + "': expected N or MIN:MAX with 1 <= MIN <= MAX <= " +
                           std::to_string(rdzv::kMaxNodes));
  }
  return NodeRange{static_cast<int>(*min), static_cast<int>(*max)};
}

StatusOr<int> ParseFlagInt(const std::string& flag, const std::string& v, int min, int max) {
  if (auto n = ParseInteger(v, min, max)) return static_cast<int>(*n);
  return InvalidArgument(flag + " '" + v + "': expected a whole number from " +
                         std::to_string(min) + " to " + std::to_string(max));
}

StatusOr<double> ParseFlagSeconds(const std::string& flag, const std::string& v) {
  if (auto s = ParseNumber(v, 0, kMaxFlagSeconds)) return *s;
  return InvalidArgument(flag + " '" + v + "': expected a number of seconds from 0 to " +
                         std::to_string(static_cast<long>(kMaxFlagSeconds)) + " (30 days)");
}

StatusOr<StdSpec> ParseStdSpec(const std::string& flag, const std::string& spec) {
  auto bad = [&] {
    return InvalidArgument(flag + " '" + spec +
                           "': expected 0-3 or local_rank:value,... (1 "
                           "stdout, 2 stderr, 3 both)");
  };
  StdSpec out;
  if (spec.find(':') == std::string::npos) {
    const auto v = ParseInteger(spec, 0, 3);
    if (!v) return bad();
    out.all = static_cast<int>(*v);
    return out;
  }
  for (const auto& item : Split(spec, ',')) {
    const auto colon = item.find(':');
    if (colon == std::string::npos) return bad();
    const auto lr = ParseInteger(item.substr(0, colon), 0, 1 << 20);
    const auto v = ParseInteger(item.substr(colon + 1), 0, 3);
    if (!lr || !v) return bad();
    out.ranks.emplace_back(static_cast<int>(*lr), static_cast<int>(*v));
  }
  return out;
}

std::vector<int> StdSpec::For(int nproc) const {
  std::vector<int> out(static_cast<std::size_t>(nproc), ranks.empty() ? all : 0);
  for (const auto& [lr, v] : ranks) {
    if (lr < nproc) out[static_cast<std::size_t>(lr)] = v;
  }
  return out;
}

StatusOr<std::vector<int>> ParseRankList(const std::string& list) {
  std::vector<int> out;
  for (const auto& item : Split(list, ',')) {
    if (item.empty()) continue;
    const auto lr = ParseInteger(item, 0, 1 << 20);
    if (!lr) return InvalidArgument("--local-ranks-filter: '" + item + "' is not a local rank");
    out.push_back(static_cast<int>(*lr));
  }
  return out;
}

Status CheckLocalRanks(const std::vector<int>& ranks, int nproc) {
  for (int lr : ranks) {
    if (lr >= nproc) {
      return InvalidArgument("--local-ranks-filter: '" + std::to_string(lr) +
                             "' is not a local rank in 0.." + std::to_string(nproc - 1));
    }
  }
  return Status::Ok();
}

StatusOr<std::vector<int>> ParseSignals(const std::string& list) {
  std::vector<int> out;
  for (const auto& name : Split(list, ',')) {
    if (name.empty()) continue;
    const int s = ParseSignal(name);
    if (s < 0 || s == SIGKILL || s == SIGSTOP) {
      return InvalidArgument("--signals-to-handle: '" + name + "' is not a signal crun can handle");
    }
    out.push_back(s);
  }
  return out;
}

std::vector<std::string> ParseFilters(const std::string& list) {
  std::vector<std::string> out;
  std::string current;
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (list[i] != ',') {
      current += list[i];
    } else if (i + 1 < list.size() && list[i + 1] == ',') {
      current += ',';  // ",," is a comma inside a filter
      ++i;
    } else {
      if (!current.empty()) out.push_back(current);
      current.clear();
    }
  }
  if (!current.empty()) out.push_back(current);
  return out;
}

namespace {

// The --rdzv-conf keys that take seconds, and where each goes.
using SecondsField = std::optional<double> RdzvConf::*;
constexpr std::pair<std::string_view, SecondsField> kSecondsKeys[] = {
    {"join_timeout", &RdzvConf::join_timeout},
    {"timeout", &RdzvConf::join_timeout},
    {"last_call_timeout", &RdzvConf::last_call_timeout},
    {"close_timeout", &RdzvConf::close_timeout},
    {"heartbeat_interval", &RdzvConf::heartbeat_interval},
    {"keep_alive_interval", &RdzvConf::heartbeat_interval},
    {"heartbeat_timeout", &RdzvConf::heartbeat_timeout},
    {"read_timeout", &RdzvConf::read_timeout},
    {"reconnect_timeout", &RdzvConf::reconnect_timeout},
    {"connect_timeout", &RdzvConf::connect_timeout},
};

// torchrun's get_as_bool: 1/true/t/yes/y and 0/false/f/no/n, in any case.
std::optional<bool> TorchrunBool(std::string v) {
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char ch) { return std::tolower(ch); });
  if (v == "1" || v == "true" || v == "t" || v == "yes" || v == "y") return true;
  if (v == "0" || v == "false" || v == "f" || v == "no" || v == "n") return false;
  return std::nullopt;
}

// One key=value of --rdzv-conf into `c`; a key crun does not know goes to c.ignored.
Status SetRdzvKey(RdzvConf& c, const std::string& key, const std::string& value,
                  const std::set<std::string>& backend_keys) {
  if (backend_keys.count(key) != 0) {
    c.backend_keys[key] = value;
    return Status::Ok();
  }
  for (const auto& [name, field] : kSecondsKeys) {
    if (key != name) continue;
    const auto s = ParseNumber(value, 0, kMaxFlagSeconds);
    if (!s || *s <= 0) {
      return InvalidArgument("--rdzv-conf: " + key + "='" + value +
                             "' is not a number of seconds > 0 (at most 30 days)");
    }
    c.*field = *s;
    return Status::Ok();
  }
  if (key == "keep_alive_max_attempt") {
    const auto n = ParseInteger(value, 1, 1000);
    if (!n) {
      return InvalidArgument("--rdzv-conf: keep_alive_max_attempt='" + value +
                             "' is not a whole number from 1 to 1000");
    }
    c.keep_alive_max_attempt = static_cast<int>(*n);
  } else if (key == "is_host") {
    c.is_host = TorchrunBool(value);
    if (!c.is_host) {
      return InvalidArgument("--rdzv-conf: is_host='" + value + "' is not true or false");
    }
  } else if (key == "node_id") {
    c.node_id = value;
  } else if (key == "store_type") {
    if (value != "tcp") {
      return InvalidArgument("--rdzv-conf: store_type='" + value +
                             "': crun's rendezvous keeps its state in its own service and "
                             "gives workers a TCP store; only store_type=tcp is accepted");
    }
  } else if (key != "rank") {  // rank: the static backend's, which --node-rank sets
    c.ignored.push_back(key);
  }
  return Status::Ok();
}

}  // namespace

StatusOr<RdzvConf> ParseRdzvConf(const std::string& text,
                                 const std::set<std::string>& backend_keys) {
  RdzvConf c;
  if (text.empty()) return c;
  for (const auto& item : Split(text + ",", ',')) {  // the "," keeps a trailing empty item
    if (item.empty()) {
      // As torchrun: "a=1,,b=2" or ",,," is a mistake, not an empty option.
      return InvalidArgument("--rdzv-conf '" + text +
                             "': an empty item (expected "
                             "key=value,key=value)");
    }
    const auto eq = item.find('=');
    if (eq == std::string::npos) {
      return InvalidArgument("--rdzv-conf: '" + item + "' is not key=value");
    }
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key.empty()) return InvalidArgument("--rdzv-conf: '" + item + "' has no key");
    if (value.empty()) return InvalidArgument("--rdzv-conf: " + key + " has no value");
    CRUN_RETURN_IF_ERROR(SetRdzvKey(c, key, value, backend_keys));
  }
  return c;
}

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<long>(seconds * 1000));
}

std::chrono::milliseconds HeartbeatTimeout(const RdzvConf& conf,
                                           std::chrono::milliseconds fallback) {
  if (conf.heartbeat_timeout) return Millis(*conf.heartbeat_timeout);
  if (conf.heartbeat_interval || conf.keep_alive_max_attempt) {
    return Millis(conf.heartbeat_interval.value_or(1.0) * conf.keep_alive_max_attempt.value_or(3));
  }
  return fallback;
}

}  // namespace crun::launcher
