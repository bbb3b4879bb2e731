#include "launcher/launch_command.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <vector>

#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <spdlog/spdlog.h>

#include "agent/local_agent.h"
#include "agent/rendezvous/etcd_rendezvous.h"
#include "agent/rendezvous/service_rendezvous.h"
#include "agent/rendezvous/static_rendezvous.h"
#include "base/host_addresses.h"
#include "launcher/horovodrun_spelling.h"
#include "launcher/launch_options.h"
#include "launcher/launch_plan.h"
#include "launcher/logging.h"
#include "rendezvous/service/grpc_service.h"

namespace crun::launcher {
namespace {

int UsageError(const std::string& message) {
  std::fprintf(stderr, "crun: %s\n", message.c_str());
  return 2;
}

// The node id when --rdzv-conf gives none: one per agent process, as torchrun's c10d backend
// does, so that several cruns on one machine are several nodes ("simulate two nodes on my
// laptop"): the host name, qualified by this host's address toward the endpoint unless that is
// loopback, and this crun's pid: "gpu7@10.0.0.7#4242". An explicit node_id is an identity
// that a restarted agent takes over.
std::string DefaultNodeId(const std::string& host_name, const Endpoint& endpoint) {
  const std::string addr = LocalAddressToward(endpoint.host, endpoint.port);
  const std::string pid = "#" + std::to_string(::getpid());
  if (addr.empty() || LoopbackOnly(addr)) return host_name + pid;
  return host_name + "@" + addr + pid;
}

// A run id as one path component: [A-Za-z0-9._-], never "." or "..".
std::string PathComponent(const std::string& id) {
  std::string out = id.substr(0, 128);
  for (char& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  }
  if (out.empty() || out == "." || out == "..") out = "_" + out;
  return out;
}

// The run's own log directory, <base>/<run id>/<host>_<random> (mode 0700), made when the
// plan is acted on. Two nodes sharing a base (an NFS home) or two runs with the same id never
// share files.
struct LogDirs {
  std::string base, run, node;
  bool made_base = false;  // a temporary base of crun's own
  bool made_run = false;   // the run's directory did not exist before

  // At the end of a run, what holds nothing goes: the attempt and rank directories no log,
  // error file or failure report was written into, then this node's directory, the run's and a
  // temporary base of crun's own when they are empty. So a run that wrote nothing (one that
  // never started a worker, or that succeeded without logs to files) leaves nothing behind,
  // and one that did keeps exactly the directories that hold its files. The node directory is
  // this crun's own (mkdtemp), so nothing in it is anyone else's.
  void RemoveEmptyDirs() const {
    std::error_code ec;
    std::vector<std::string> below;  // pre-order: every parent before its children
    for (std::filesystem::recursive_directory_iterator it(node, ec), end; !ec && it != end;
         it.increment(ec)) {
      if (it->is_directory(ec)) below.push_back(it->path());
    }
    // rmdir removes only an empty directory, and no symlink or what it points to: trying each
    // one, deepest first, is the test.
    for (auto d = below.rbegin(); d != below.rend(); ++d) ::rmdir(d->c_str());
    if (::rmdir(node.c_str()) != 0) return;
    if (made_run) ::rmdir(run.c_str());
    if (made_base) ::rmdir(base.c_str());
  }
};

StatusOr<LogDirs> MakeRunLogDirs(const std::string& given, const std::string& run_id,
                                 const std::string& host) {
  LogDirs d;
  d.base = given;
  if (d.base.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/crun_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      return PosixError("cannot create a log directory from '" + pattern + "'", errno);
    }
    d.base = pattern;
    d.made_base = true;
  }
  d.run = d.base + "/" + PathComponent(run_id);
  // Another crun sharing the base may remove an empty run directory between our two steps
  // (RemoveEmptyDirs): then make it again.
  for (int attempt = 0;; ++attempt) {
    std::error_code ec;
    const bool made = std::filesystem::create_directories(d.run, ec);
    if (ec) {
      return InvalidArgument("--log-dir '" + d.base + "': cannot create " + d.run + ": " +
                             ec.message());
    }
    d.made_run = d.made_run || made;
    std::string pattern = d.run + "/" + PathComponent(host) + "_XXXXXX";
    if (::mkdtemp(pattern.data()) != nullptr) {
      d.node = pattern;
      return d;
    }
    if (errno != ENOENT || attempt == 3) {
      return PosixError("--log-dir '" + d.base + "': cannot create a directory in " + d.run, errno);
    }
  }
}

// crun's rendezvous service: joined at the endpoint, and hosted here when the endpoint names
// this node (unless is_host says otherwise, or a daemon already serves its port).
int RunWithService(const LaunchPlan& p, boost::asio::io_context& io,
                   agent::AgentOptions agent_options) {
  const LaunchOptions& o = p.o;
  const RdzvConf& conf = p.conf;
  agent::ServiceRendezvousOptions so;
  so.endpoint_host = p.endpoint.host;
  so.endpoint_port = p.endpoint.port;
  so.run_id = p.run_id;
  so.role = o.role;
  so.host = agent_options.host_name;
  so.node_id = conf.node_id.empty() ? DefaultNodeId(so.host, p.endpoint) : conf.node_id;
  if (!o.local_addr.empty()) so.addresses.push_back(o.local_addr);
  so.nproc = p.nproc;
  if (p.node_rank_given) so.requested_rank = p.node_rank;
  const crun::rdzv::Settings& settings = p.settings;
  so.settings = settings;
  so.heartbeat_interval = p.heartbeat_interval;
  so.keepalive_timeout =
      conf.read_timeout ? Millis(*conf.read_timeout) : settings.heartbeat_timeout;
  so.virtual_local_rank = o.virtual_local_rank;
  if (conf.reconnect_timeout) so.reconnect_timeout = Millis(*conf.reconnect_timeout);
  so.security = p.security;

  std::unique_ptr<crun::rdzv::RendezvousService> hosted;
  if (p.try_host) {
    crun::rdzv::ServiceOptions service;
    service.host = BindAddressFor(p.endpoint.host);
    service.port = p.endpoint.port;
    service.advertise_addr = o.local_addr;
    service.security = p.security;
    auto started = crun::rdzv::RendezvousService::Start(service);
    if (started.ok()) {
      hosted = std::move(started).value();
      spdlog::info("hosting the rendezvous service on port {}", p.endpoint.port);
      if (p.security.token.empty() && !crun::LoopbackOnly(p.endpoint.host)) {
        spdlog::warn(
            "the rendezvous service on port {} has no job token: anyone who can "
            "reach it can join or end this job (set CRUN_TOKEN_FILE or CRUN_TOKEN on "
            "every node; docs/security.md)",
            p.endpoint.port);
      }
    } else if (conf.is_host.value_or(false)) {
      std::fprintf(stderr, "crun: is_host=1 but %s\n", started.status().message().c_str());
      return 1;
    } else if (started.status().code() != StatusCode::kUnavailable) {
      // Not "in use": nobody else serves it either, and joining would only wait for nothing.
      std::fprintf(stderr, "crun: cannot host the rendezvous service of %s: %s\n",
                   o.rdzv_endpoint.c_str(), started.status().message().c_str());
      return 1;
    } else {
      spdlog::info("port {} is served already (another crun or `crun rendezvous`): joining it",
                   p.endpoint.port);
    }
  }
  int code = 0;
  {
    agent::LocalAgent agent(io, std::move(agent_options), agent::MakeServiceRendezvous(io, so));
    code = agent.Run();
  }
  if (hosted) {
    // The other nodes were sent the outcome with ours: let their sessions end first.
    hosted->Stop(conf.close_timeout ? Millis(*conf.close_timeout)
                                    : std::chrono::milliseconds(5000));
  }
  return code;
}

// The rendezvous kept in etcd (--rdzv-backend etcd-v3): no node hosts anything but the store
// of the rounds in which it is group rank 0.
int RunWithEtcd(const LaunchPlan& p, boost::asio::io_context& io,
                agent::AgentOptions agent_options) {
  const LaunchOptions& o = p.o;
  const RdzvConf& conf = p.conf;
  agent::EtcdRendezvousOptions eo;
  for (const auto& e : p.etcd_endpoints) eo.endpoints.push_back(e.ToString());
  if (!conf.etcd_prefix.empty()) eo.root = conf.etcd_prefix;
  eo.run_id = p.run_id;
  eo.role = o.role;
  eo.host = agent_options.host_name;
  const Endpoint& first = p.etcd_endpoints.front();
  eo.node_id = conf.node_id.empty() ? DefaultNodeId(eo.host, first) : conf.node_id;
  // This node's address toward etcd is the one its peers reach it on (as toward the service).
  std::string toward =
      o.local_addr.empty() ? LocalAddressToward(first.host, first.port) : o.local_addr;
  if (!toward.empty()) eo.addresses.push_back(toward);
  eo.advertise_addr =
      toward.empty() || (LoopbackOnly(toward) && !LoopbackOnly(first.host)) ? eo.host : toward;
  eo.nproc = p.nproc;
  if (p.node_rank_given) eo.requested_rank = p.node_rank;
  eo.settings = p.settings;
  eo.security = p.security;
  eo.user = conf.etcd_user;
  eo.password = p.etcd_password;
  if (conf.connect_timeout) eo.connect_timeout = Millis(*conf.connect_timeout);
  if (conf.reconnect_timeout) eo.outage_timeout = Millis(*conf.reconnect_timeout);
  eo.virtual_local_rank = o.virtual_local_rank;
  agent::LocalAgent agent(io, std::move(agent_options), agent::MakeEtcdRendezvous(io, eo));
  return agent.Run();
}

// The one-node and static rendezvous: torchrun's static backend (node 0 hosts the store), one
// node alone, or one crun per Slurm task (task 0 hosts the store for the whole step).
int RunWithStatic(const LaunchPlan& p, boost::asio::io_context& io,
                  agent::AgentOptions agent_options) {
  const LaunchOptions& o = p.o;
  agent::StaticRendezvousOptions rdzv;
  rdzv.run_id = p.run_id;
  rdzv.role = o.role;
  rdzv.nproc = p.nproc;
  rdzv.host = agent_options.host_name;
  rdzv.max_restarts = p.max_restarts;
  rdzv.store_host = o.local_addr.empty() ? o.master_addr : o.local_addr;
  rdzv.virtual_local_rank = o.virtual_local_rank;
  rdzv.store_port = p.master_port > 0 ? static_cast<std::uint16_t>(p.master_port) : 0;
  rdzv.store_linger = agent_options.shutdown_timeout;
  rdzv.advertise_addr = o.local_addr;
  rdzv.contracts = agent_options.contracts;
  rdzv.exchange_timeout =
      p.conf.join_timeout ? Millis(*p.conf.join_timeout) : p.settings.join_timeout;
  if (p.slurm_task) {
    const SlurmTaskSettings& t = *p.slurm_task;
    rdzv.static_store = true;
    rdzv.host_store = t.rank == 0;
    rdzv.store_host = t.master_addr;
    rdzv.bind_host = BindAddressFor(t.master_addr);
    rdzv.store_port = static_cast<std::uint16_t>(t.master_port);
    agent::GroupAssignment g;
    g.group_rank = t.group_rank;
    g.group_world_size = t.group_world_size;
    g.local_world_size = t.local_world_size;
    g.world_size = t.world_size;
    g.base_rank = t.rank - t.local_rank;  // so that RANK = base + LOCAL_RANK = SLURM_PROCID
    rdzv.fixed_group = g;
    rdzv.first_local_rank = t.local_rank;
  }
  if (p.mode == Mode::kStatic) {
    rdzv.node_rank = p.node_rank;
    rdzv.nnodes = p.nodes.max;
    rdzv.static_store = true;
    rdzv.host_store = p.node_rank == 0;
    rdzv.store_host = o.master_addr;
    rdzv.bind_host = BindAddressFor(o.master_addr);
    rdzv.store_port = static_cast<std::uint16_t>(p.master_port);
  }
  agent::LocalAgent agent(io, std::move(agent_options), agent::MakeStaticRendezvous(io, rdzv));
  return agent.Run();
}

// What crun's own process sets before any worker: the token out of the environment,
// OMP_NUM_THREADS, SIGPIPE ignored, the forwarded signals named.
void PrepareThisProcess(const LaunchPlan& p) {
  // The workers have no use for the token: keep it out of their environment.
  ::unsetenv("CRUN_TOKEN");
  if (p.nproc > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    ::setenv("OMP_NUM_THREADS", "1", 1);
    std::fprintf(stderr,
                 "crun: OMP_NUM_THREADS was unset; set to 1 for each of the %d workers "
                 "(set it to tune)\n",
                 p.nproc);
  }
  ::signal(SIGPIPE, SIG_IGN);
  // As torchrun 2.x does: workers see which signals their launcher forwards.
  ::setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", p.o.signals.c_str(), 1);
}

int Execute(LaunchPlan& p) {
  const LaunchOptions& o = p.o;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  auto dirs = MakeRunLogDirs(o.log_dir, p.run_id, host);
  if (!dirs.ok()) return UsageError(dirs.status().message());
  SetUpLogging("launch", o.log_level);
  for (const auto& note : p.notes) std::fprintf(stderr, "crun: %s\n", note.c_str());
  spdlog::info("logs of this node: {}", dirs->node);
  PrepareThisProcess(p);
  agent::AgentOptions agent_options = std::move(p.agent);
  agent_options.host_name = host;
  agent_options.log_dir = dirs->node;
  boost::asio::io_context io(1);
  int code = 0;
  if (p.mode == Mode::kEtcd) {
    code = RunWithEtcd(p, io, std::move(agent_options));
  } else if (p.mode == Mode::kService) {
    code = RunWithService(p, io, std::move(agent_options));
  } else {
    code = RunWithStatic(p, io, std::move(agent_options));
  }
  dirs->RemoveEmptyDirs();
  return code;
}

}  // namespace

int RunLaunch(int argc, char** argv) {
  CLI::App
      app{"crun: a native elastic launcher for distributed training.\n"
          "  crun [options] script.py [args...]    (torchrun-compatible)\n"
          "  crun store --help                      (a standalone c10d store)",
          "crun"};
  app.set_version_flag("--version", "crun " CRUN_VERSION);
  app.prefix_command();  // everything from the script on belongs to the worker
  LaunchOptions o;
  AddLaunchOptions(app, o);
  std::vector<std::string> words(argv + 1, argv + argc);
  auto rewritten =
      RewriteHorovodrunSpelling(words, [](const std::string& h) { return NamesThisHost(h); });
  if (!rewritten.ok()) return UsageError(rewritten.status().message());
  if (*rewritten != words) {
    std::string line;
    for (const auto& w : *rewritten) {
      if (w == "--no-python") break;
      line += " " + w;
    }
    std::fprintf(stderr, "crun: horovodrun's spelling, as crun's:%s --no-python ...\n",
                 line.c_str());
  }
  std::vector<std::string> reversed(rewritten->rbegin(), rewritten->rend());  // CLI11's order
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return UsageError(e.what());
  }
  if (!o.print_completion.empty()) {
    auto script = CompletionScript(o.print_completion, KnownLongOptions(app));
    if (!script.ok()) return UsageError(script.status().message());
    std::fputs(script->c_str(), stdout);
    return 0;
  }
  o.command = app.remaining();
  if (!o.command.empty() && o.command[0] == "--") {
    o.command.erase(o.command.begin());
  } else if (!o.command.empty() && o.command[0].size() > 1 && o.command[0][0] == '-') {
    // An option before the script that crun does not know: a typo, or a flag of another tool.
    return UsageError(UnknownOptionMessage(o.command[0], KnownLongOptions(app)));
  }
  auto plan = PlanLaunch(std::move(o), GivenFlags(app), MachineFacts::OfThisMachine());
  if (!plan.ok()) return UsageError(plan.status().message());
  return Execute(*plan);
}

}  // namespace crun::launcher
