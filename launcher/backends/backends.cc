#include <unistd.h>

#include <algorithm>

#include <CLI/CLI.hpp>

#include "base/host_addresses.h"
#include "base/spelling.h"
#include "launcher/backends/backend.h"
#include "launcher/backends/etcd.h"
#include "launcher/backends/service.h"
#include "launcher/backends/static.h"
#include "launcher/plan.h"

namespace crun::launcher {
namespace {

// "crun (or c10d)": an entry's spellings, for messages.
std::string Spellings(const Backend& b) {
  std::string out = b.name;
  for (std::size_t i = 0; i < b.aliases.size(); ++i)
    out += (i == 0 ? " (or " : ", ") + b.aliases[i];
  return b.aliases.empty() ? out : out + ")";
}

// "a, b or c".
std::string Either(const std::vector<std::string>& items) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += i + 1 == items.size() ? " or " : ", ";
    out += items[i];
  }
  return out;
}

}  // namespace

Backends DefaultBackends() {
  return {ServiceBackend(), EtcdBackend(), EtcdV2Refused(), StaticBackend()};
}

const Backend* DefaultBackend(const Backends& backends, Backend::Default d) {
  for (const Backend& b : backends) {
    if (b.by_default == d) return &b;
  }
  return nullptr;
}

const Backend* FindBackend(const Backends& backends, const std::string& name) {
  for (const Backend& b : backends) {
    if (b.name == name || std::count(b.aliases.begin(), b.aliases.end(), name) != 0) return &b;
  }
  return nullptr;
}

StatusOr<const Backend*> ChooseBackend(const Backends& backends, const std::string& given,
                                       const std::string& flag,
                                       const std::function<bool(const Backend&)>& usable) {
  const Backend* b = FindBackend(backends, given);
  if (b != nullptr && !b->refusal.empty())
    return InvalidArgument(flag + " " + given + ": " + b->refusal);
  if (b != nullptr && (!usable || usable(*b))) return b;
  std::vector<std::string> expected, names;
  for (const Backend& e : backends) {
    if (!e.refusal.empty() || (usable && !usable(e))) continue;
    expected.push_back(Spellings(e));
    names.push_back(e.name);
    names.insert(names.end(), e.aliases.begin(), e.aliases.end());
  }
  std::string message = flag + " '" + given + "': expected " + Either(expected);
  if (const std::string best = ClosestName(given, names); !best.empty() && b == nullptr) {
    message += " (did you mean " + best + "?)";
  }
  return InvalidArgument(message);
}

std::set<std::string> BackendConfKeys(const Backends& backends) {
  std::set<std::string> keys;
  for (const Backend& b : backends) keys.insert(b.conf_keys.begin(), b.conf_keys.end());
  return keys;
}

void DescribeBackends(CLI::App& app, const Backends& backends) {
  std::string backend_help, conf_help;
  for (const Backend& b : backends) {
    if (!b.refusal.empty()) continue;
    backend_help += (backend_help.empty() ? "" : "; ") + Spellings(b) + ": " + b.help;
    if (!b.conf_help.empty()) conf_help += "; with " + b.name + ": " + b.conf_help;
  }
  const Backend* with = DefaultBackend(backends, Backend::Default::kWithEndpoint);
  const Backend* without = DefaultBackend(backends, Backend::Default::kWithoutEndpoint);
  if (with != nullptr && without != nullptr) {
    backend_help +=
        " (default: " + with->name + " when an endpoint is given, else " + without->name + ")";
  }
  app.get_option("--rdzv-backend")->description(backend_help);
  CLI::Option* conf = app.get_option("--rdzv-conf");
  conf->description(conf->get_description() + conf_help);
}

std::string DefaultNodeId(const std::string& host_name, const Endpoint& endpoint) {
  const std::string addr = LocalAddressToward(endpoint.host, endpoint.port);
  const std::string pid = "#" + std::to_string(::getpid());
  if (addr.empty() || LoopbackOnly(addr)) return host_name + pid;
  return host_name + "@" + addr + pid;
}

Status PlanDynamicSettings(LaunchPlan& p) {
  const RdzvConf& conf = p.values.rdzv_conf;
  const rdzv::Settings& settings = p.values.settings;
  CRUN_RETURN_IF_ERROR(settings.Validate());
  p.heartbeat_interval = conf.heartbeat_interval ? Millis(*conf.heartbeat_interval)
                                                 : std::min(std::chrono::milliseconds(1000),
                                                            settings.heartbeat_timeout / 3);
  if (p.heartbeat_interval >= settings.heartbeat_timeout) {
    return InvalidArgument("--rdzv-conf: heartbeat_interval (" +
                           std::to_string(p.heartbeat_interval.count()) +
                           " ms) must be shorter than heartbeat_timeout (" +
                           std::to_string(settings.heartbeat_timeout.count()) + " ms)");
  }
  return Status::Ok();
}

std::string DynamicRunId(const LaunchOptions& o) {
  return o.rdzv_id == "none" ? std::string("default") : o.rdzv_id;
}

}  // namespace crun::launcher
