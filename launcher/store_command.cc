#include "launcher/store_command.h"

#include <csignal>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>

#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <spdlog/spdlog.h>

#include "base/proc.h"
#include "http/http_server.h"
#include "launcher/launch_options.h"
#include "launcher/logging.h"
#include "metrics/endpoint.h"
#include "rendezvous/store_server/store_metrics.h"
#include "rendezvous/store_server/store_server.h"

namespace crun::launcher {
namespace {

// The largest count or size any limit takes: 2^53, far beyond any machine, and still exact
// in the double CLI11 may hold it in.
constexpr std::int64_t kMaxCount = std::int64_t{1} << 53;

struct StoreCommandOptions {
  StoreServerOptions server;
  std::string log_level = "info";
  MetricsFlags metrics;
};

int RunStore(const StoreCommandOptions& options) {
  SetUpLogging("store", options.log_level);
  const auto descriptors = RaiseDescriptorLimit();
  boost::asio::io_context io;
  // Signals are caught from before the address is announced: whoever read it may stop us.
  std::signal(SIGPIPE, SIG_IGN);
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  boost::asio::signal_set usr1(io, SIGUSR1);
  auto server = StoreServer::Start(io, options.server);
  if (!server.ok()) {
    spdlog::error("{}", server.status().message());
    return 1;
  }
  metrics::Registry registry;
  std::unique_ptr<http::HttpServer> metrics_server;
  if (options.metrics.port) {
    // Rendered on this loop, where the store's statistics may be read.
    AddStoreMetrics(registry, [&] { return (*server)->stats(); });
    http::HttpServerOptions mo;
    mo.host = options.metrics.host;
    mo.port = *options.metrics.port;
    auto started = metrics::ServeMetrics(io, mo, [&] { return registry.Render(); });
    if (!started.ok()) {
      spdlog::error("{}", started.status().message());
      return 1;
    }
    metrics_server = std::move(started).value();
  }
  signals.async_wait([&](const boost::system::error_code& ec, int signo) {
    if (ec) return;
    spdlog::info("{}: stopping on {}", (*server)->endpoint(),
                 signo == SIGINT ? "SIGINT" : "SIGTERM");
    (*server)->Stop();
    if (metrics_server) metrics_server->Stop();
    usr1.cancel();
  });
  // `kill -USR1` asks for the counters (docs/store_protocol.md, limits), whatever the log level.
  std::function<void()> arm_stats = [&] {
    usr1.async_wait([&](const boost::system::error_code& ec, int) {
      if (ec) return;
      spdlog::warn("{}: stats: {}", (*server)->endpoint(), FormatStats((*server)->stats()));
      arm_stats();
    });
  };
  arm_stats();
  // The one line scripts read to learn the port (useful with --port 0).
  std::printf("crun store listening on %s\n", (*server)->endpoint().c_str());
  if (metrics_server) {
    std::printf("crun store metrics on %s\n", metrics_server->url().c_str());
  }
  std::fflush(stdout);
  spdlog::debug("descriptor limit {}", descriptors);
  // What start-up alone touched (static initializers of every library in the one binary,
  // the command line) goes back; serving maps again what it uses.
  spdlog::debug("gave back {} KiB of start-up pages", ReleaseStartupPages() / 1024);
  io.run();
  spdlog::info("{}: stopped: {}", (*server)->endpoint(), FormatStats((*server)->stats()));
  return 0;
}

}  // namespace

void AddStoreCommand(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<StoreCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "store", "Run a standalone c10d-compatible TCP store (PyTorch 1.13 and 2.x clients)");
  auto& s = options->server;
  auto& l = s.limits;
  s.port = 29500;
  cmd->add_option("--host", s.host,
                  "Address to bind: an IP or host name; '::' is every interface (IPv4 too)")
      ->capture_default_str();
  cmd->add_option("--port", s.port, "TCP port; 0 picks a free one")
      ->check(WholeNumber(0, 65535))
      ->capture_default_str();
  cmd->add_option("--max-connections", s.max_connections,
                  "Connections held at once; 0 = as many as the descriptor limit allows (raised to "
                  "its hard limit at start)")
      ->check(WholeNumber(0, kMaxCount))
      ->capture_default_str();
  cmd->add_option("--backlog", s.backlog,
                  "listen() backlog of each listening socket; 0 = the system maximum")
      ->check(WholeNumber(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--max-key-bytes", l.max_key_bytes, "Longest key accepted")
      ->check(WholeNumber(1, kMaxCount))
      ->capture_default_str();
  cmd->add_option("--max-value-bytes", l.max_value_bytes, "Largest value accepted")
      ->check(WholeNumber(1, kMaxCount))
      ->capture_default_str();
  cmd->add_option("--max-keys-per-request", l.max_keys_per_request,
                  "Most keys in one CHECK/WAIT/MULTI_GET/MULTI_SET")
      ->check(WholeNumber(1, kMaxCount))
      ->capture_default_str();
  cmd->add_option("--max-request-bytes", l.max_request_bytes, "Largest single request")
      ->check(WholeNumber(1, kMaxCount))
      ->capture_default_str();
  cmd->add_option("--max-store-bytes", l.max_store_bytes, "Keys plus values held in total")
      ->check(WholeNumber(1, kMaxCount))
      ->capture_default_str();
  cmd->add_option("--max-waits-per-connection", l.max_waits_per_connection,
                  "WAITs/BARRIERs pending plus keys watched, per connection")
      ->check(WholeNumber(1, kMaxCount))
      ->capture_default_str();
  cmd->add_option("--max-pending-waits", l.max_pending_waits,
                  "WAITs/BARRIERs pending on the whole store")
      ->check(WholeNumber(1, kMaxCount))
      ->capture_default_str();
  cmd->add_option("--max-connections-per-peer", s.max_connections_per_peer,
                  "Connections one IP address may hold at once; 0 = no bound")
      ->check(WholeNumber(0, kMaxCount))
      ->capture_default_str();
  cmd->add_option("--allow", s.allowed_peers,
                  "Accept connections only from these IP addresses (repeatable); none = anyone")
      ->group("Security");
  AddMetricsFlags(cmd, &options->metrics, "the store's statistics");
  cmd->add_option("--log-level", options->log_level, "trace, debug, info, warn, error or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))
      ->capture_default_str();
  cmd->callback([options, exit_code] { *exit_code = RunStore(*options); });
}

}  // namespace crun::launcher
