#include "launcher/rendezvous_command.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <memory>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "agent/rendezvous/service_rendezvous.h"
#include "base/numbers.h"
#include "base/proc.h"
#include "crun/v1/rendezvous.grpc.pb.h"
#include "launcher/backends/backend.h"
#include "launcher/launch_options.h"
#include "launcher/logging.h"
#include "launcher/security_flags.h"
#include "rendezvous/rules/stragglers.h"
#include "rendezvous/service/grpc_service.h"
#include "rendezvous/service/proto_messages.h"
#include "rendezvous/store_server/store_server.h"

namespace crun::launcher {
namespace {

struct RendezvousCommandOptions {
  rdzv::ServiceOptions service;
  crun::SecurityFlags security;
  bool insecure = false;
  std::string log_level = "info";
  std::string udp_heartbeats = "on";
  MetricsFlags metrics;
};

int RunRendezvous(RendezvousCommandOptions o) {
  auto security = crun::LoadSecurity(o.security, "service");
  if (!security.ok()) {
    std::fprintf(stderr, "crun rendezvous: %s\n", security.status().message().c_str());
    return 2;
  }
  o.service.security = std::move(security).value();
  o.service.durable = true;  // it outlives jobs: its agents wait for it across a restart
  o.service.udp_heartbeats = o.udp_heartbeats == "on";
  if (o.metrics.port) {
    http::HttpServerOptions mo;
    mo.host = o.metrics.host;
    mo.port = *o.metrics.port;
    o.service.metrics = mo;
  }
  if (o.service.security.token.empty() && !o.insecure && !crun::LoopbackOnly(o.service.host)) {
    std::fprintf(stderr,
                 "crun rendezvous: refusing to serve %s without a job token: anyone who can "
                 "reach port %u could join, stop or read the jobs. Give the token with "
                 "--token-file (or CRUN_TOKEN_FILE / CRUN_TOKEN) on the daemon and every node, "
                 "bind a loopback address, or say --insecure on a network you trust "
                 "(docs/security.md)\n",
                 o.service.host.c_str(), static_cast<unsigned>(o.service.port));
    return 2;
  }
  SetUpLogging("rendezvous", o.log_level);
  if (o.service.security.token.empty() && !crun::LoopbackOnly(o.service.host)) {
    spdlog::warn("--insecure: serving {} without a job token", o.service.host);
  }
  RaiseDescriptorLimit();
  std::signal(SIGPIPE, SIG_IGN);
  boost::asio::io_context io;
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  auto service = rdzv::RendezvousService::Start(o.service);
  if (!service.ok()) {
    spdlog::error("{}", service.status().message());
    return 1;
  }
  signals.async_wait([&](const boost::system::error_code& ec, int signo) {
    if (ec) return;
    spdlog::info("stopping on {}", signo == SIGINT ? "SIGINT" : "SIGTERM");
  });
  std::printf("crun rendezvous listening on %s\n",
              crun::FormatEndpoint(o.service.host, (*service)->port()).c_str());
  if (o.service.metrics) {
    std::printf("crun rendezvous metrics on %s\n", (*service)->metrics_url().c_str());
  }
  std::fflush(stdout);
  // As crun store does: the pages only start-up touched go back (base/proc.h).
  spdlog::debug("gave back {} KiB of start-up pages", ReleaseStartupPages() / 1024);
  io.run();  // until a signal
  (*service)->Stop();
  return 0;
}

struct StatusCommandOptions {
  Backends backends;  // those `crun status` can ask
  StatusQuery query;
  bool json = false;
  bool watch = false;
  double interval = 2;
  long count = 0;  // --watch: refreshes before it ends; 0: until Ctrl-C
};

std::string Age(std::int64_t ms) {
  if (ms < 1000) return std::to_string(ms) + " ms";
  return std::to_string(ms / 1000) + "." + std::to_string(ms % 1000 / 100) + " s";
}

// The jobs, from the backend's entry; exit code and message on failure.
// *final: an answer that asking again will not change (a refusal).
int FetchStatus(const StatusCommandOptions& o, const StatusFetch& fetch, v1::StatusResponse* resp,
                std::string* target, bool* final) {
  if (const int code = fetch(o.query, resp, target, final); code != 0) return code;
  // Watched, a job not there yet may come: the table says "no jobs" until it does.
  if (!o.query.run_id.empty() && resp->jobs_size() == 0 && !o.watch) {
    std::fprintf(stderr, "crun status: %s knows no job with run id '%s'\n", target->c_str(),
                 o.query.run_id.c_str());
    return 1;
  }
  return 0;
}

// "rank 3 2.5x, rank 2 1.8x": a node's ranks named slow now (docs/health.md); "-": none.
std::string SlowRanksCell(const v1::NodeStatus& n) {
  std::string out;
  for (const auto& v : n.stragglers()) {
    out += fmt::format("{}rank {} {:.1f}x", out.empty() ? "" : ", ", v.rank(), v.ratio());
  }
  return out.empty() ? "-" : out;
}

nlohmann::json StragglersJson(const v1::NodeStatus& n) {
  auto out = nlohmann::json::array();
  for (const auto& v : n.stragglers()) {
    out.push_back({{"rank", v.rank()},
                   {"ratio", v.ratio()},
                   {"first_step", v.window() * rdzv::kStepWindow},
                   {"last_step", (v.window() + 1) * rdzv::kStepWindow - 1}});
  }
  return out;
}

// A ledger's figures (docs/observability.md, "Goodput"); null where none came.
nlohmann::json GoodputJson(bool has, const v1::GoodputFigures& g) {
  if (!has) return nullptr;
  nlohmann::json seconds = nlohmann::json::object();
  for (const auto& s : g.seconds()) seconds[s.category()] = s.seconds();
  return {{"known", g.known()},
          {"ratio", g.known() ? nlohmann::json(g.ratio()) : nlohmann::json(nullptr)},
          {"seconds", std::move(seconds)},
          {"incidents", g.incidents()},
          {"summary", g.summary()}};
}

// "96.2 %"; "unknown" where the workers report no progress; "-" where no ledger came.
std::string GoodputCell(bool has, const v1::GoodputFigures& g) {
  if (!has) return "-";
  if (!g.known()) return "unknown";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %%", g.ratio() * 100.0);
  return buf;
}

nlohmann::json JobsJson(const v1::StatusResponse& resp) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& j : resp.jobs()) {
    nlohmann::json job{{"run_id", j.run_id()},
                       {"phase", j.phase()},
                       {"round", j.round()},
                       {"restarts_used", j.restarts_used()},
                       {"max_restarts", j.max_restarts()},
                       {"min_nodes", j.min_nodes()},
                       {"max_nodes", j.max_nodes()},
                       {"world_size", j.world_size()},
                       {"last_failure", j.last_failure()},
                       {"lost_hosts",
                        std::vector<std::string>(j.lost_hosts().begin(), j.lost_hosts().end())},
                       {"unhealthy_reports", j.unhealthy_reports()},
                       {"goodput", GoodputJson(j.has_goodput(), j.goodput())}};
    job["nodes"] = nlohmann::json::array();
    for (const auto& n : j.nodes()) {
      job["nodes"].push_back(
          {{"node_id", n.node_id()},
           {"host", n.host()},
           {"state", n.state()},
           {"group_rank", n.group_rank()},
           {"nproc", n.nproc()},
           {"last_heartbeat_ms_ago", n.last_heartbeat_ms_ago()},
           {"snapshot_bytes", n.snapshot_bytes()},
           {"snapshot_step",
            n.has_snapshot_step() ? nlohmann::json(n.snapshot_step()) : nlohmann::json(nullptr)},
           {"disk_step",
            n.has_disk_step() ? nlohmann::json(n.disk_step()) : nlohmann::json(nullptr)},
           {"reason", n.reason()},
           {"stragglers", StragglersJson(n)},
           {"goodput", GoodputJson(n.has_goodput(), n.goodput())}});
    }
    out.push_back(job);
  }
  return out;
}

// "400.0 MiB, step 1234, disk 1200": what a node's snapshot store holds; "-": nothing.
std::string SnapshotsCell(const v1::NodeStatus& n) {
  if (n.snapshot_bytes() == 0) return "-";
  std::string out = FormatBytes(n.snapshot_bytes());
  if (n.has_snapshot_step()) out += ", step " + std::to_string(n.snapshot_step());
  if (n.has_disk_step()) out += ", disk " + std::to_string(n.disk_step());
  return out;
}

std::string JobsTable(const v1::StatusResponse& resp, const std::string& target) {
  std::string out;
  auto line = [&out](const char* fmt, auto... args) {
    char buf[1024];
    std::snprintf(buf, sizeof buf, fmt, args...);
    out += buf;
  };
  if (resp.jobs_size() == 0) line("no jobs at %s\n", target.c_str());
  for (const auto& j : resp.jobs()) {
    line("job %s: %s, round %d, nodes %d:%d, world size %d, restarts %d of %d\n",
         j.run_id().c_str(), j.phase().c_str(), j.round(), j.min_nodes(), j.max_nodes(),
         j.world_size(), j.restarts_used(), j.max_restarts());
    if (!j.last_failure().empty()) line("  last failure: %s\n", j.last_failure().c_str());
    if (j.lost_hosts_size() > 0) {
      std::string lost;
      for (const auto& h : j.lost_hosts()) lost += (lost.empty() ? "" : ", ") + h;
      line("  lost: %s\n", lost.c_str());
    }
    if (j.unhealthy_reports() > 0) {
      line("  health checks failed: %d\n", j.unhealthy_reports());
    }
    if (j.has_goodput()) line("  %s\n", j.goodput().summary().c_str());
    line("  %-24s %-20s %-10s %5s %6s  %-14s  %-8s  %-24s  %s\n", "NODE", "HOST", "STATE", "RANK",
         "NPROC", "LAST HEARTBEAT", "GOODPUT", "SNAPSHOTS", "SLOW RANKS");
    for (const auto& n : j.nodes()) {
      line("  %-24s %-20s %-10s %5s %6d  %-14s  %-8s  %-24s  %s\n", n.node_id().c_str(),
           n.host().c_str(), n.state().c_str(),
           n.group_rank() < 0 ? "-" : std::to_string(n.group_rank()).c_str(), n.nproc(),
           n.state() == "member" ? (Age(n.last_heartbeat_ms_ago()) + " ago").c_str() : "-",
           GoodputCell(n.has_goodput(), n.goodput()).c_str(), SnapshotsCell(n).c_str(),
           SlowRanksCell(n).c_str());
      if (!n.reason().empty()) line("    %s\n", n.reason().c_str());
    }
  }
  return out;
}

// Waits up to `d` for SIGINT or SIGTERM (blocked by the caller); true when one came.
bool WaitForStop(std::chrono::milliseconds d) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + d;
  while (true) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds(0)) return false;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    const int got = ::sigtimedwait(&set, nullptr, &ts);
    if (got == SIGINT || got == SIGTERM) return true;
    if (got < 0 && errno == EAGAIN) return false;  // the interval passed
  }
}

// --watch: the table redrawn in place every --interval (a terminal), or, with --json, one
// JSON line per refresh. A service that stops answering is shown as such and asked again;
// refusals and bad flags end it. Ctrl-C or SIGTERM ends it with 0; --count refreshes with
// the last one's status.
int WatchStatus(const StatusCommandOptions& o, const StatusFetch& fetch) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &stop, nullptr);  // taken by sigtimedwait, between refreshes
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  const auto interval = std::chrono::milliseconds(static_cast<long>(o.interval * 1000));
  int last = 0;  // the last refresh's code: --count's exit status
  for (long n = 0; o.count == 0 || n < o.count; ++n) {
    v1::StatusResponse resp;
    std::string target;
    // The fetch's own error lines go to stderr; a watched screen keeps only the last.
    bool final = false;
    const int code = FetchStatus(o, fetch, &resp, &target, &final);
    if (code == 2 || final) return code;  // a bad flag or a refusal does not get better
    const auto now = std::chrono::system_clock::now();
    const std::time_t t = std::chrono::system_clock::to_time_t(now);
    char when[32];
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
    if (o.json) {
      nlohmann::json line{{"time", when}};
      if (code == 0) {
        line["jobs"] = JobsJson(resp);
      } else {
        line["error"] = "no answer from " + (target.empty() ? o.query.endpoint : target);
      }
      std::printf("%s\n", line.dump().c_str());
    } else {
      std::string screen = tty ? "\x1b[H\x1b[2J" : "";  // home, clear: redrawn in place
      char every[64];
      std::snprintf(every, sizeof every, "Every %g s: ", o.interval);
      screen += every + std::string("crun status ") + (target.empty() ? o.query.endpoint : target) +
                "    " + when + "\n\n";
      const bool last_refresh = o.count != 0 && n + 1 >= o.count;
      screen += code == 0      ? JobsTable(resp, target)
                : last_refresh ? "no answer\n"
                               : "no answer (asking again)\n";
      std::fputs(screen.c_str(), stdout);
      if (!tty) std::fputs("\n", stdout);
    }
    std::fflush(stdout);
    last = code;
    if (o.count != 0 && n + 1 >= o.count) break;
    if (WaitForStop(interval)) return 0;  // stopped by the user
  }
  return last;
}

int RunStatus(const StatusCommandOptions& o) {
  SetUpLogging("status", "warn");  // gRPC's own lines go to debug, not onto the terminal
  auto backend = ChooseBackend(o.backends, o.query.backend, "--rdzv-backend",
                               [](const Backend& b) { return b.status != nullptr; });
  if (!backend.ok()) {
    std::fprintf(stderr, "crun status: %s\n", backend.status().message().c_str());
    return 2;
  }
  const StatusFetch& fetch = (*backend)->status;
  if (o.watch) return WatchStatus(o, fetch);
  v1::StatusResponse resp;
  std::string target;
  bool final = false;
  if (const int code = FetchStatus(o, fetch, &resp, &target, &final); code != 0) return code;
  if (o.json) {
    std::printf("%s\n", JobsJson(resp).dump(2).c_str());
    return 0;
  }
  std::fputs(JobsTable(resp, target).c_str(), stdout);
  return 0;
}

}  // namespace

void AddRendezvousCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<RendezvousCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "rendezvous", "Run the rendezvous daemon: agents of many jobs (run ids) join it over gRPC");
  o->service.host = "0.0.0.0";
  o->service.port = 29400;
  cmd->add_option("--host", o->service.host,
                  "Address to bind (gRPC and the jobs' worker stores); '::' for IPv6 too")
      ->capture_default_str();
  cmd->add_option("--port", o->service.port, "gRPC port; 0 picks a free one")
      ->check(WholeNumber(0, 65535))
      ->capture_default_str();
  cmd->add_option("--advertise-addr", o->service.advertise_addr,
                  "MASTER_ADDR given to workers (default: the address each agent dialed)");
  cmd->add_option("--keep-finished-jobs", o->service.keep_finished_jobs,
                  "Ended jobs kept for `crun status`")
      ->check(WholeNumber(0, 1'000'000))
      ->capture_default_str();
  cmd->add_option("--log-level", o->log_level, "trace, debug, info, warn, error or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))
      ->capture_default_str();
  cmd->add_option("--udp-heartbeats", o->udp_heartbeats,
                  "Take agents' heartbeats as datagrams on the same port's UDP (about a tenth "
                  "of a stream message's CPU; docs/rendezvous.md, \"Heartbeats\"); off: every "
                  "beat on its gRPC stream")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  AddSecurityFlags(cmd, &o->security);
  cmd->add_flag("--insecure", o->insecure,
                "Serve a non-loopback address without a job token (a trusted network only)")
      ->group("Security");
  AddMetricsFlags(cmd, &o->metrics, "the jobs' run ids, nodes and failures");
  cmd->callback([o, exit_code] { *exit_code = RunRendezvous(*o); });
}

void AddStatusCommand(CLI::App& app, int* exit_code, const Backends& backends) {
  auto o = std::make_shared<StatusCommandOptions>();
  for (const Backend& b : backends) {
    if (b.status) o->backends.push_back(b);
  }
  StatusQuery& q = o->query;
  // --rdzv-backend and --rdzv-endpoint say what each backend asks; its own flags follow.
  std::string backend_help, endpoint_help;
  for (const Backend& b : o->backends) {
    std::string aliases;
    for (const auto& a : b.aliases) aliases += (aliases.empty() ? "" : ", ") + a;
    backend_help += (backend_help.empty() ? "" : "; ") + b.name +
                    (aliases.empty() ? "" : " (alias " + aliases + ")") + ": " + b.status_help;
    const bool first = b.by_default == Backend::Default::kWithEndpoint;
    const std::string said = first ? b.endpoint_help : "with " + b.name + ", " + b.endpoint_help;
    endpoint_help = first ? said + (endpoint_help.empty() ? "" : "; " + endpoint_help)
                          : endpoint_help + (endpoint_help.empty() ? "" : "; ") + said;
  }
  if (const Backend* b = DefaultBackend(o->backends, Backend::Default::kWithEndpoint)) {
    q.backend = b->name;
  }
  CLI::App* cmd = app.add_subcommand("status", "Show the jobs a rendezvous service coordinates");
  cmd->add_option("--rdzv-backend,--rdzv_backend", q.backend, backend_help)->capture_default_str();
  cmd->add_option("--rdzv-endpoint,--rdzv_endpoint", q.endpoint, endpoint_help)->required();
  cmd->add_option("--rdzv-id,--rdzv_id", q.run_id, "Only this job");
  for (const Backend& b : o->backends) {
    for (const StatusFlag& f : b.status_flags) {
      if (!f.default_value.empty()) q.flags[f.name] = f.default_value;
      CLI::Option* opt = cmd->add_option(f.name, q.flags[f.name], f.help);
      if (!f.default_value.empty()) opt->capture_default_str();
    }
  }
  cmd->add_flag("--json", o->json,
                "Machine-readable output (with --watch: one JSON line per refresh)");
  cmd->add_flag("--watch", o->watch,
                "Refresh the table in place every --interval until Ctrl-C (like watch/top)");
  cmd->add_option("--interval", o->interval, "--watch: seconds between refreshes")
      ->check(PositiveSeconds())
      ->capture_default_str();
  cmd->add_option("--count", o->count, "--watch: stop after this many refreshes (0: never)")
      ->check(WholeNumber(0, 1'000'000'000))
      ->capture_default_str();
  cmd->add_option("--timeout", q.timeout, "Seconds to wait for the answer")
      ->check(PositiveSeconds())
      ->capture_default_str();
  AddSecurityFlags(cmd, &q.security);
  cmd->callback([o, exit_code] { *exit_code = RunStatus(*o); });
}

}  // namespace crun::launcher
