#include "launcher/launch_command.h"

#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <random>
#include <set>
#include <thread>

#include <ifaddrs.h>
#include <netdb.h>
#include <sys/socket.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "agent/local_agent.h"
#include "agent/service_rendezvous.h"
#include "launcher/devices.h"
#include "launcher/launch_options.h"
#include "launcher/local_rendezvous.h"
#include "launcher/numa_binding.h"
#include "launcher/logging.h"
#include "launcher/rendezvous_command.h"
#include "launcher/slurm.h"
#include "rendezvous/store/socket.h"
#include "rendezvous/service/grpc_service.h"
#include "rendezvous/service/rules.h"

namespace crun::launcher {
namespace {

int UsageError(const std::string& message) {
  std::fprintf(stderr, "crun: %s\n", message.c_str());
  return 2;
}

// The numeric addresses of this machine's interfaces.
std::vector<std::string> LocalAddresses() {
  std::vector<std::string> local;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return local;
  for (auto* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    char buf[NI_MAXHOST];
    const socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (::getnameinfo(i->ifa_addr, len, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) == 0) {
      std::string a = buf;
      if (auto pct = a.find('%'); pct != std::string::npos) a.resize(pct);
      local.push_back(a);
    }
  }
  ::freeifaddrs(ifs);
  return local;
}

// The numeric addresses `host` resolves to here (itself when it is a literal).
std::vector<std::string> ResolveNumeric(const std::string& host) {
  std::vector<std::string> out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return out;
  for (auto* r = res; r != nullptr; r = r->ai_next) {
    char buf[NI_MAXHOST];
    if (::getnameinfo(r->ai_addr, r->ai_addrlen, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) ==
        0) {
      out.push_back(buf);
    }
  }
  ::freeaddrinfo(res);
  return out;
}

bool IsLoopbackAddress(const std::string& a) { return a.rfind("127.", 0) == 0 || a == "::1"; }

// Whether `host` names this machine: localhost, a loopback or local interface address, this
// host's name, or a name that resolves to one of those.
bool NamesThisHost(const std::string& host) {
  if (host == "localhost") return true;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) == 0 && host == name) return true;
  const auto local = LocalAddresses();
  for (const auto& a : ResolveNumeric(host)) {
    if (IsLoopbackAddress(a) || std::find(local.begin(), local.end(), a) != local.end()) {
      return true;
    }
  }
  return false;
}

// A host name the resolver says does not exist is an error now, not after join_timeout. A
// resolver that cannot answer now (EAI_AGAIN) may answer later: that is left to the retries.
Status CheckResolvable(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (res != nullptr) ::freeaddrinfo(res);
  if (rc == EAI_NONAME || rc == EAI_FAIL || rc == EAI_NODATA) {
    return InvalidArgument("--rdzv-endpoint: cannot resolve host '" + host + "': " +
                           ::gai_strerror(rc));
  }
  return Status::Ok();
}

// Where to listen for a service or store that other nodes reach as `host`: the address itself
// when it is a literal, loopback for "localhost", else the interface address the name
// resolves to here. Only a name that resolves to no interface address of this machine but a
// loopback one (Debian maps a machine's own name to 127.0.1.1), or to none at all, listens on
// every interface ("::"); the others reach it under an address this host cannot see.
std::string BindAddressFor(const std::string& host) {
  if (host == "localhost") return "127.0.0.1";
  boost::system::error_code ec;
  boost::asio::ip::make_address(host, ec);
  if (!ec) return host;
  const auto local = LocalAddresses();
  for (const auto& a : ResolveNumeric(host)) {
    if (!IsLoopbackAddress(a) && std::find(local.begin(), local.end(), a) != local.end()) {
      return a;
    }
  }
  return "::";
}

// The node id when --rdzv-conf gives none: one per agent process, as torchrun's c10d backend
// does, so that several cruns on one machine are several nodes ("simulate two nodes on my
// laptop"): the host name, qualified by this host's address toward the endpoint unless that is
// loopback, and this crun's pid: "gpu7@10.0.0.7#4242". An explicit node_id is an identity
// that a restarted agent takes over.
std::string DefaultNodeId(const std::string& host_name, const Endpoint& endpoint) {
  const std::string addr = LocalAddressToward(endpoint.host, endpoint.port);
  const std::string pid = "#" + std::to_string(::getpid());
  if (addr.empty() || addr.rfind("127.", 0) == 0 || addr == "::1") return host_name + pid;
  return host_name + "@" + addr + pid;
}

// Where a shell would find `program`: the path itself when it names a directory, else the
// first executable match on PATH. Empty when there is none.
std::string FindExecutable(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    return ::access(program.c_str(), X_OK) == 0 ? program : std::string();
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    const auto end = dirs.find(':', start);
    const std::string dir = dirs.substr(start, end == std::string::npos ? std::string::npos
                                                                        : end - start);
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return {};
}

// Whether `path` is a native program (an ELF file). Python cannot run one, so crun runs it as
// itself even without --no-python: `crun --nproc-per-node 2 ./train` does what it says.
bool IsNativeProgram(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "\x7f" "ELF", 4) == 0;
}

// The worker's argv, torchrun's way: [PYTHON_EXEC, -u, (-m), script, args...] or, with
// --no-python, [script, args...].
StatusOr<std::vector<std::string>> WorkerCommand(const LaunchOptions& o) {
  if (o.command.empty()) return InvalidArgument("no training script given");
  if (o.run_path) {
    // torchrun's --run-path: the script runs through runpy.run_path inside the interpreter
    // (it takes precedence over --no-python, as in torchrun).
    if (::access(o.command[0].c_str(), R_OK) != 0) {
      return InvalidArgument("--run-path: '" + o.command[0] + "' does not exist or is not readable");
    }
    const char* python = std::getenv("PYTHON_EXEC");
    std::vector<std::string> argv{python != nullptr && *python ? python : "python3", "-u", "-c",
                                  "import runpy, sys; sys.argv = sys.argv[1:]; "
                                  "runpy.run_path(sys.argv[0], run_name='__main__')"};
    argv.insert(argv.end(), o.command.begin(), o.command.end());
    return argv;
  }
  if (o.module && o.no_python) return InvalidArgument("-m/--module and --no-python exclude each other");
  const std::string& script = o.command[0];
  if (o.no_python) {
    if (FindExecutable(script).empty()) {
      return InvalidArgument("--no-python: '" + script + "' is not an executable file");
    }
    return o.command;
  }
  if (!o.module) {
    // A native program, given as a path or found on PATH (a script in the working directory
    // comes first, as it would for Python).
    const bool readable = ::access(script.c_str(), R_OK) == 0;
    const std::string program = readable ? script : FindExecutable(script);
    if (!program.empty() && IsNativeProgram(program)) {
      if (::access(program.c_str(), X_OK) != 0) {
        return InvalidArgument("'" + script + "' is a native program but not executable "
                               "(chmod +x it)");
      }
      std::vector<std::string> argv = o.command;
      if (script.find('/') == std::string::npos && readable) argv[0] = "./" + script;
      return argv;
    }
  }
  if (!o.module && ::access(script.c_str(), R_OK) != 0) {
    return InvalidArgument("training script '" + script + "' does not exist or is not readable");
  }
  const char* python = std::getenv("PYTHON_EXEC");
  std::vector<std::string> argv{python != nullptr && *python ? python : "python3", "-u"};
  if (o.module) argv.push_back("-m");
  argv.insert(argv.end(), o.command.begin(), o.command.end());
  return argv;
}

std::string RandomRunId() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
  return buf;
}




// How the interpreter of Python workers was chosen, for the failure report's hint.
std::string InterpreterNote(const std::vector<std::string>& argv, const LaunchOptions& o) {
  if (o.no_python && !o.run_path) return {};
  if (argv.size() < 2 || argv[1] != "-u") return {};  // a native program
  const char* exec = std::getenv("PYTHON_EXEC");
  if (exec != nullptr && *exec) return std::string(exec) + " (from PYTHON_EXEC)";
  const std::string found = FindExecutable("python3");
  return (found.empty() ? std::string("python3") : found) +
         " (python3 on PATH; set PYTHON_EXEC to use another)";
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

// The NUMA nodes this process may allocate from (its cpuset's), from the kernel.
std::set<int> AllowedMemoryNodes() {
  std::array<unsigned long, 16> mask{};
  std::set<int> out;
  constexpr int kBits = 8 * sizeof(unsigned long);
  // get_mempolicy(NULL, mask, maxnode, 0, MPOL_F_MEMS_ALLOWED)
  if (::syscall(SYS_get_mempolicy, nullptr, mask.data(), mask.size() * kBits, nullptr, 4) != 0) {
    out.insert(0);
    return out;
  }
  for (std::size_t i = 0; i < mask.size() * kBits; ++i) {
    if (mask[i / kBits] & (1UL << (i % kBits))) out.insert(static_cast<int>(i));
  }
  return out;
}

std::set<int> AllowedCpus() {
  cpu_set_t set;
  std::set<int> out;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.insert(c);
  }
  return out;
}

std::optional<std::string> Env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

// Which rendezvous: one node in-process, torchrun's static backend, or crun's service.
enum class Mode { kLocal, kStatic, kService };

// Everything RunLaunch acts on, decided and checked before anything is created or started.
struct Plan {
  LaunchOptions o;
  Mode mode = Mode::kLocal;
  NodeRange nodes;
  int nproc = 1;
  int max_restarts = 0;
  int node_rank = 0;
  bool node_rank_given = false;
  int master_port = -1;  // -1: a fresh free port per attempt
  std::optional<SlurmNodeSettings> slurm;
  std::optional<SlurmTaskSettings> slurm_task;
  Endpoint endpoint;
  RdzvConf conf;
  crun::rdzv::Settings settings;  // the service's defaults, overridden by --rdzv-conf
  std::chrono::milliseconds heartbeat_interval{1000};
  bool try_host = false;  // whether this node hosts the service (or joins the one on its port)
  crun::Security security;
  std::string run_id;
  agent::AgentOptions agent;
  std::vector<std::string> notes;  // said on stderr once the plan is acted on
};

// The service's settings from --nnodes, --max-restarts and --rdzv-conf, and whether to host it.
Status PlanService(Plan& p, const LaunchOptions& o) {
  const RdzvConf& conf = p.conf;
  crun::rdzv::Settings& settings = p.settings;
  settings.min_nodes = p.nodes.min;
  settings.max_nodes = p.nodes.max;
  settings.max_restarts = p.max_restarts;
  if (conf.join_timeout) settings.join_timeout = Millis(*conf.join_timeout);
  if (conf.last_call_timeout) settings.last_call_timeout = Millis(*conf.last_call_timeout);
  settings.heartbeat_timeout = HeartbeatTimeout(conf, settings.heartbeat_timeout);
  CRUN_RETURN_IF_ERROR(settings.Validate());
  p.heartbeat_interval = conf.heartbeat_interval
                             ? Millis(*conf.heartbeat_interval)
                             : std::min(std::chrono::milliseconds(1000),
                                        settings.heartbeat_timeout / 3);
  if (p.heartbeat_interval >= settings.heartbeat_timeout) {
    return InvalidArgument("--rdzv-conf: heartbeat_interval (" +
                           std::to_string(p.heartbeat_interval.count()) +
                           " ms) must be shorter than heartbeat_timeout (" +
                           std::to_string(settings.heartbeat_timeout.count()) + " ms)");
  }
  p.try_host = conf.is_host.value_or(NamesThisHost(p.endpoint.host));
  if (p.try_host && p.security.tls() && p.security.cert_pem.empty()) {
    if (conf.is_host.value_or(false)) {
      return InvalidArgument("is_host=1 with TLS: hosting the rendezvous service (" +
                             o.rdzv_endpoint + ") needs its certificate and key (--tls-cert, "
                             "--tls-key)");
    }
    // A TLS client on the service's own host (a `crun rendezvous` daemon there): it joins.
    p.try_host = false;
  }
  return Status::Ok();
}

StatusOr<Plan> MakePlan(LaunchOptions o, const CLI::App& app) {
  Plan p;
  auto given = [&](const char* flag) { return app.count(flag) > 0; };
  // Under srun, one crun per node: asked for with --slurm, or the default inside a job step
  // when nothing names the job's nodes otherwise.
  const bool names_nodes = given("--nnodes") || !o.rdzv_endpoint.empty() || o.standalone ||
                           given("--node-rank") || !o.rdzv_backend.empty();
  // A flag given with an empty value is a mistake (an unset shell variable), not "default".
  for (const char* flag : {"--rdzv-endpoint", "--log-dir", "--rdzv-id", "--master-addr",
                           "--local-addr", "--role", "--nproc-per-node", "--nnodes"}) {
    if (const CLI::Option* opt = app.get_option(flag); opt->count() > 0 &&
        opt->as<std::string>().empty()) {
      return InvalidArgument(std::string(flag) + " is empty (an unset variable?)");
    }
  }
  CRUN_RETURN_IF_ERROR(CheckRunId(o.rdzv_id));
  auto mr = ParseFlagInt("--max-restarts", o.max_restarts, 0, 1'000'000);
  if (!mr.ok()) return mr.status();
  p.max_restarts = *mr;
  auto nr = ParseFlagInt("--node-rank", o.node_rank, 0, 100'000);
  if (!nr.ok()) return nr.status();
  p.node_rank = *nr;
  if (!o.master_port.empty()) {
    auto port = ParseFlagInt("--master-port", o.master_port, 0, 65535);
    if (!port.ok()) return port.status();
    p.master_port = *port;
  }
  if (auto mi = ParseFlagSeconds("--monitor-interval", o.monitor_interval); !mi.ok()) {
    return mi.status();
  }
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
  if (o.slurm_direct) {
    if (names_nodes || o.slurm) {
      return InvalidArgument("--slurm-direct takes the ranks from the Slurm task: drop --slurm, "
                             "--nnodes, --node-rank, --rdzv-backend, --rdzv-endpoint and "
                             "--standalone");
    }
    if (o.nproc_per_node != "1") {
      return InvalidArgument("--slurm-direct runs one worker per Slurm task, not --nproc-per-node " +
                             o.nproc_per_node + " (ask srun for more tasks per node)");
    }
    if (p.max_restarts > 0) {
      return InvalidArgument("--slurm-direct: restarts belong to Slurm (srun --requeue, or a new "
                             "step), not --max-restarts " + std::to_string(p.max_restarts));
    }
    auto step = ReadSlurmStep();
    if (!step.ok()) return InvalidArgument("--slurm-direct: " + step.status().message());
    auto task = TaskSettings(*step, o.slurm_port > 0 ? o.slurm_port : SlurmDefaultPort(*step));
    if (!task.ok()) return InvalidArgument("--slurm-direct: " + task.status().message());
    p.slurm_task = std::move(task).value();
    if (o.rdzv_id == "none") o.rdzv_id = p.slurm_task->run_id;
  } else if (o.slurm || (!names_nodes && InSlurmStep())) {
    if (names_nodes) {
      return InvalidArgument("--slurm takes the nodes from the Slurm step: drop --nnodes, "
                             "--node-rank, --rdzv-backend, --rdzv-endpoint and --standalone");
    }
    auto step = ReadSlurmStep();
    if (!step.ok()) return InvalidArgument("--slurm: " + step.status().message());
    p.slurm = NodeSettings(*step, o.slurm_port > 0 ? o.slurm_port : SlurmDefaultPort(*step));
    o.nnodes = std::to_string(p.slurm->nnodes);
    p.node_rank = p.slurm->node_rank;
    o.rdzv_backend = "crun";
    o.rdzv_endpoint = p.slurm->host + ":" + std::to_string(p.slurm->port);
    if (o.rdzv_id == "none") o.rdzv_id = p.slurm->run_id;
  } else if (given("--slurm-port")) {
    return InvalidArgument("--slurm-port " + std::to_string(o.slurm_port) +
                           " without a Slurm step");
  }
  auto nodes = ParseNnodes(o.nnodes);
  if (!nodes.ok()) return nodes.status();
  p.nodes = *nodes;
  p.node_rank_given = given("--node-rank") || std::getenv("PET_NODE_RANK") || p.slurm.has_value();
  const std::string& backend = o.rdzv_backend;
  if (backend == "etcd" || backend == "etcd-v2") {
    return InvalidArgument("--rdzv-backend " + backend + " is not supported: crun's own service "
                           "(--rdzv-backend c10d or crun, with --rdzv-endpoint) replaces it");
  }
  if (!backend.empty() && backend != "static" && backend != "c10d" && backend != "crun") {
    return InvalidArgument("--rdzv-backend '" + backend + "': expected crun, c10d or static");
  }
  if (o.standalone) {
    // As torchrun: one node with its own rendezvous that nobody else can reach. A range such
    // as 1:2 is accepted (torchrun's tutorials use it); nobody else can join, so it runs now.
    if (p.nodes.min != 1) {
      return InvalidArgument("--standalone runs one node; --nnodes '" + o.nnodes +
                             "' needs at least " + std::to_string(p.nodes.min));
    }
    if (p.nodes.max != 1) {
      p.notes.push_back("--standalone: running one node (--nnodes " + o.nnodes +
                        ": no other node can join a standalone job)");
      p.nodes.max = 1;
    }
  } else if (backend == "c10d" || backend == "crun" || (backend.empty() && !o.rdzv_endpoint.empty())) {
    p.mode = Mode::kService;
  } else if (p.nodes.max > 1) {
    p.mode = Mode::kStatic;
  }
  if (p.mode == Mode::kService && o.rdzv_endpoint.empty()) {
    return InvalidArgument("--rdzv-backend " + backend + " needs --rdzv-endpoint host[:port]");
  }
  if (p.mode == Mode::kStatic) {
    if (p.nodes.min != p.nodes.max) {
      return InvalidArgument("--nnodes '" + o.nnodes + "': the static backend needs a fixed "
                             "number of nodes (use --rdzv-endpoint for an elastic range)");
    }
    if (p.node_rank >= p.nodes.max) {
      return InvalidArgument("--node-rank " + std::to_string(p.node_rank) +
                             " is not below --nnodes " + std::to_string(p.nodes.max));
    }
    if (p.master_port <= 0) {
      return InvalidArgument("the static backend needs --master-port (the store node 0 hosts)");
    }
  } else if (p.mode == Mode::kLocal && p.node_rank != 0) {
    return InvalidArgument("--node-rank " + std::to_string(p.node_rank) + " on a one-node job");
  }
  auto conf = ParseRdzvConf(o.rdzv_conf);
  if (!conf.ok()) return conf.status();
  p.conf = std::move(conf).value();
  for (const auto& key : p.conf.ignored) {
    p.notes.push_back("--rdzv-conf: ignoring unknown key '" + key +
                      "' (as torchrun does; crun's keys are in docs/cli.md)");
  }
  if (p.mode == Mode::kService) {
    auto endpoint = crun::ParseEndpoint(o.rdzv_endpoint, 29400);
    if (!endpoint.ok()) return InvalidArgument("--rdzv-endpoint: " + endpoint.status().message());
    p.endpoint = *endpoint;
    CRUN_RETURN_IF_ERROR(CheckResolvable(p.endpoint.host));
    // The step's first node hosts the rendezvous, whatever its name resolves to.
    if (p.slurm && !p.conf.is_host) p.conf.is_host = p.slurm->is_host;
    if (p.slurm && p.conf.node_id.empty()) p.conf.node_id = p.slurm->node_name;
    auto loaded = crun::LoadSecurity(o.security, "client");
    if (!loaded.ok()) return loaded.status();
    p.security = std::move(loaded).value();
    CRUN_RETURN_IF_ERROR(PlanService(p, o));
  } else {
    for (const char* flag : {"--token-file", "--tls-cert", "--tls-key", "--tls-ca"}) {
      if (given(flag)) {
        return InvalidArgument(std::string(flag) + " secures crun's rendezvous service: it "
                               "needs --rdzv-endpoint (or --slurm)");
      }
    }
  }
  const std::optional<std::string> cuda_visible = Env("CUDA_VISIBLE_DEVICES");
  auto nproc = ResolveNproc(o.nproc_per_node, SystemRoot(), cuda_visible,
                            static_cast<int>(std::thread::hardware_concurrency()));
  if (!nproc.ok()) return nproc.status();
  p.nproc = *nproc;
  auto command = WorkerCommand(o);
  if (!command.ok()) return command.status();
  // Under Slurm, its warning signals (--signal=USR1@60, scancel -s USR2) reach crun; by
  // default they are passed on to the workers as notices rather than ending crun.
  if ((p.slurm || p.slurm_task) && !given("--signals-to-handle") &&
      std::getenv("PET_SIGNALS_TO_HANDLE") == nullptr) {
    o.signals += ",SIGUSR1,SIGUSR2";
  }
  auto signals = ParseSignals(o.signals);
  if (!signals.ok()) return signals.status();
  double shutdown = 30;
  if (!o.shutdown_timeout.empty()) {
    auto s = ParseFlagSeconds("--shutdown-timeout", o.shutdown_timeout);
    if (!s.ok()) return s.status();
    shutdown = *s;
  } else if (const char* env = std::getenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")) {
    auto s = ParseFlagSeconds("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", env);
    if (!s.ok()) return s.status();
    shutdown = *s;
  }
  // Per-local-rank flags index by local rank: a Slurm task's is SLURM_LOCALID.
  const int local_ranks = p.slurm_task ? p.slurm_task->local_rank + 1 : p.nproc;
  auto redirects = ParseStdSpec("--redirects", o.redirects, local_ranks);
  if (!redirects.ok()) return redirects.status();
  auto tees = ParseStdSpec("--tee", o.tee, local_ranks);
  if (!tees.ok()) return tees.status();
  auto console_ranks = ParseRankList(o.local_ranks_filter, local_ranks);
  if (!console_ranks.ok()) return console_ranks.status();

  agent::AgentOptions& a = p.agent;
  const int first_local_rank = p.slurm_task ? p.slurm_task->local_rank : 0;
  if (!o.numa_binding.empty()) {
    auto mode = ParseNumaMode(o.numa_binding);
    if (!mode.ok()) return mode.status();
    auto plan = PlanNumaBinding(*mode, SystemRoot(), first_local_rank, p.nproc, cuda_visible,
                                AllowedCpus());
    if (!plan.ok()) return plan.status();
    const std::set<int> mems = AllowedMemoryNodes();
    for (auto& b : *plan) {
      std::vector<int> usable;
      for (int n : b.mems) {
        if (mems.count(n) != 0) usable.push_back(n);
      }
      if (usable.size() != b.mems.size()) {
        p.notes.push_back("--numa-binding: local rank " +
                          std::to_string(first_local_rank + static_cast<int>(a.bindings.size())) +
                          ": this process may not allocate from NUMA node(s) " +
                          FormatCpuList(b.mems) + " (cpuset); its memory is " +
                          (usable.empty() ? "left unbound" : "bound to " + FormatCpuList(usable)));
      }
      a.bindings.push_back({b.cpus, usable});
    }
  }
  a.command = std::move(command).value();
  a.interpreter = InterpreterNote(a.command, o);
  a.nproc = p.nproc;
  a.first_local_rank = first_local_rank;
  a.max_restarts = p.max_restarts;
  a.shutdown_timeout = std::chrono::milliseconds(static_cast<long>(shutdown * 1000));
  a.forward_signals = std::move(signals).value();
  a.entrypoint = o.command[0];
  a.redirects = std::move(redirects).value();
  a.tees = std::move(tees).value();
  a.console_ranks = std::move(console_ranks).value();
  a.stdout_filters = ParseFilters(o.duplicate_stdout_filters);
  a.stderr_filters = ParseFilters(o.duplicate_stderr_filters);
  a.console_events = o.event_log_handler == "console";
  if (!o.log_line_prefix_template.empty()) {
    a.prefix_template = o.log_line_prefix_template;
  } else if (const char* t = std::getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"); t && *t) {
    a.prefix_template = t;
  }
  if (const char* e = std::getenv("TORCHELASTIC_ERROR_FILE"); e != nullptr) {
    a.parent_error_file = e;
  }
  // The run id workers see. --standalone, and one node with no --master-port (torchrun 2.x
  // then switches to standalone itself), get a fresh one; the static backend keeps the given
  // id, "none" by default, the same on every node, as torchrun does.
  if (p.mode == Mode::kService) {
    p.run_id = o.rdzv_id == "none" ? std::string("default") : o.rdzv_id;
  } else if (o.standalone || (p.mode == Mode::kLocal && !p.slurm_task &&
                              o.rdzv_id == "none" && p.master_port <= 0)) {
    p.run_id = RandomRunId();
  } else {
    p.run_id = o.rdzv_id;
  }
  p.o = std::move(o);
  return p;
}

// The run's own log directory, <base>/<run id>/<host>_<random> (mode 0700), made when the
// plan is acted on. Two nodes sharing a base (an NFS home) or two runs with the same id never
// share files.
struct LogDirs {
  std::string base, run, node;
  bool made_base = false;  // a temporary base of crun's own
  bool made_run = false;   // the run's directory did not exist before

  // A run that never started a worker (an unreachable endpoint, a refused join) leaves
  // nothing behind: the directories it made are removed while they are still empty.
  void RemoveIfEmpty() const {
    std::error_code ec;
    if (!std::filesystem::is_empty(node, ec) || ec) return;
    std::filesystem::remove(node, ec);
    if (made_run && std::filesystem::is_empty(run, ec)) std::filesystem::remove(run, ec);
    if (made_base && std::filesystem::is_empty(base, ec)) std::filesystem::remove(base, ec);
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
  // (RemoveIfEmpty): then make it again.
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
      return PosixError("--log-dir '" + d.base + "': cannot create a directory in " + d.run,
                        errno);
    }
  }
}

// crun's rendezvous service: joined at the endpoint, and hosted here when the endpoint names
// this node (unless is_host says otherwise, or a daemon already serves its port).
int RunWithService(const Plan& p, boost::asio::io_context& io, agent::AgentOptions agent_options) {
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
  so.settings = {settings.min_nodes,         settings.max_nodes,
                 settings.max_restarts,      settings.join_timeout,
                 settings.last_call_timeout, settings.heartbeat_timeout};
  so.heartbeat_interval = p.heartbeat_interval;
  so.keepalive_timeout = conf.read_timeout ? Millis(*conf.read_timeout) : settings.heartbeat_timeout;
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
        spdlog::warn("the rendezvous service on port {} has no job token: anyone who can "
                     "reach it can join or end this job (set CRUN_TOKEN_FILE or CRUN_TOKEN on "
                     "every node; docs/security.md)", p.endpoint.port);
      }
    } else if (conf.is_host.value_or(false)) {
      std::fprintf(stderr, "crun: is_host=1 but %s\n", started.status().message().c_str());
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
    hosted->Stop(conf.close_timeout ? Millis(*conf.close_timeout) : std::chrono::milliseconds(5000));
  }
  return code;
}

int Execute(Plan& p) {
  const LaunchOptions& o = p.o;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  auto dirs = MakeRunLogDirs(o.log_dir, p.run_id, host);
  if (!dirs.ok()) return UsageError(dirs.status().message());
  const std::string* log_dir = &dirs->node;
  SetUpLogging("launch", o.log_level);
  for (const auto& note : p.notes) std::fprintf(stderr, "crun: %s\n", note.c_str());
  spdlog::info("logs of this node: {}", *log_dir);
  // The workers have no use for the token: keep it out of their environment.
  ::unsetenv("CRUN_TOKEN");
  if (p.nproc > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    ::setenv("OMP_NUM_THREADS", "1", 1);
    std::fprintf(stderr, "crun: OMP_NUM_THREADS was unset; set to 1 for each of the %d workers "
                         "(set it to tune)\n", p.nproc);
  }
  ::signal(SIGPIPE, SIG_IGN);
  // As torchrun 2.x does: workers see which signals their launcher forwards.
  ::setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", o.signals.c_str(), 1);

  agent::AgentOptions agent_options = std::move(p.agent);
  agent_options.host_name = host;
  agent_options.log_dir = *log_dir;
  LocalRendezvousOptions rdzv;
  rdzv.run_id = p.run_id;
  rdzv.role = o.role;
  rdzv.nproc = p.nproc;
  rdzv.max_restarts = p.max_restarts;
  rdzv.store_host = o.local_addr.empty() ? o.master_addr : o.local_addr;
  rdzv.virtual_local_rank = o.virtual_local_rank;
  rdzv.store_port = p.master_port > 0 ? static_cast<std::uint16_t>(p.master_port) : 0;
  rdzv.store_linger = agent_options.shutdown_timeout;
  boost::asio::io_context io(1);
  if (p.mode != Mode::kService) {
    if (p.slurm_task) {
      // Task 0's crun hosts the store on the step's first node for the whole step.
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
    int code = 0;
    {
      agent::LocalAgent agent(io, std::move(agent_options), MakeLocalRendezvous(io, rdzv));
      code = agent.Run();
    }
    dirs->RemoveIfEmpty();
    return code;
  }
  const int code = RunWithService(p, io, std::move(agent_options));
  dirs->RemoveIfEmpty();
  return code;
}

}  // namespace

int RunLaunch(int argc, char** argv) {
  CLI::App app{"crun: a native elastic launcher for distributed training.\n"
               "  crun [options] script.py [args...]    (torchrun-compatible)\n"
               "  crun store --help                      (a standalone c10d store)",
               "crun"};
  app.set_version_flag("--version", "crun " CRUN_VERSION);
  app.prefix_command();  // everything from the script on belongs to the worker
  LaunchOptions o;
  AddLaunchOptions(app, o);
  try {
    app.parse(argc, argv);
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
  auto plan = MakePlan(std::move(o), app);
  if (!plan.ok()) return UsageError(plan.status().message());
  return Execute(*plan);
}

}  // namespace crun::launcher
