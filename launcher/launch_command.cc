#include "launcher/launch_command.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <random>
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
#include "launcher/local_rendezvous.h"
#include "launcher/logging.h"
#include "launcher/rendezvous_command.h"
#include "launcher/slurm.h"
#include "rendezvous/store/socket.h"
#include "rendezvous/service/grpc_service.h"
#include "rendezvous/service/rules.h"

namespace crun::launcher {
namespace {

struct LaunchOptions {
  std::string nnodes = "1:1";
  std::string nproc_per_node = "1";
  bool standalone = false;
  int max_restarts = 0;
  double monitor_interval = 0.1;  // accepted for compatibility: crun does not poll
  std::string role = "default";
  bool module = false;
  bool no_python = false;
  bool run_path = false;
  bool virtual_local_rank = false;
  std::string local_addr;
  std::string rdzv_id = "none";
  std::string rdzv_backend;   // empty: crun's dynamic backend with an endpoint, else static
  std::string rdzv_endpoint;  // host[:port]
  std::string rdzv_conf;      // key=value,...
  std::string master_addr = "127.0.0.1";
  int master_port = -1;  // -1: a fresh free port per attempt
  int node_rank = 0;
  double shutdown_timeout = -1;  // -1: TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30 s
  std::string signals = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  std::string log_level = "warn";
  std::string log_dir;
  std::string redirects = "0";
  std::string tee = "0";
  std::string local_ranks_filter;
  bool slurm = false;  // one crun per node of a Slurm job step (launcher/slurm.h)
  bool slurm_direct = false;  // one crun per worker: each Slurm task is one worker
  int slurm_port = 0;  // 0: the step's default port
  crun::SecurityFlags security;  // job token and TLS of the rendezvous service
  std::vector<std::string> command;  // script and its arguments
};

int UsageError(const std::string& message) {
  std::fprintf(stderr, "crun: %s\n", message.c_str());
  return 2;
}

int CountGpus() {
  int n = 0;
  for (int i = 0; i < 1024; ++i) {
    if (::access(("/dev/nvidia" + std::to_string(i)).c_str(), F_OK) != 0) break;
    ++n;
  }
  return n;
}

// int | cpu | gpu | auto -> a count, or an error naming the value.
StatusOr<int> ResolveNproc(const std::string& v) {
  if (v == "cpu") return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (v == "gpu") {
    const int gpus = CountGpus();
    if (gpus == 0) return InvalidArgument("--nproc-per-node gpu: no GPU found on this host");
    return gpus;
  }
  if (v == "auto") {
    const int gpus = CountGpus();
    return gpus > 0 ? gpus : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  try {
    std::size_t used = 0;
    const int n = std::stoi(v, &used);
    if (used == v.size() && n > 0) return n;
  } catch (const std::exception&) {
  }
  return InvalidArgument("--nproc-per-node '" + v +
                         "' is not a positive number, 'cpu', 'gpu' or 'auto'");
}

struct NodeRange {
  int min = 1;
  int max = 1;
};

// "N" or "MIN:MAX".
StatusOr<NodeRange> ParseNnodes(const std::string& v) {
  auto number = [](const std::string& t, int* out) {
    try {
      std::size_t used = 0;
      *out = std::stoi(t, &used);
      return used == t.size() && *out >= 1;
    } catch (const std::exception&) {
      return false;
    }
  };
  NodeRange r;
  const auto colon = v.find(':');
  const bool ok = colon == std::string::npos
                      ? number(v, &r.min) && number(v, &r.max)
                      : number(v.substr(0, colon), &r.min) && number(v.substr(colon + 1), &r.max);
  if (!ok || r.max < r.min) {
    return InvalidArgument("--nnodes '" + v + "': expected N or MIN:MAX with 1 <= MIN <= MAX");
  }
  return r;
}

// --rdzv-conf: torchrun's keys (times in seconds) plus crun's node_id.
struct RdzvConf {
  std::optional<double> join_timeout, last_call_timeout, close_timeout, heartbeat_interval,
      heartbeat_timeout, read_timeout, reconnect_timeout;
  std::optional<bool> is_host;
  std::string node_id;
};

StatusOr<RdzvConf> ParseRdzvConf(const std::string& text) {
  RdzvConf c;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    if (eq == std::string::npos) {
      return InvalidArgument("--rdzv-conf: '" + item + "' is not key=value");
    }
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    auto seconds = [&](std::optional<double>* out) -> Status {
      try {
        std::size_t used = 0;
        const double d = std::stod(value, &used);
        if (used == value.size() && d > 0) {
          *out = d;
          return Status::Ok();
        }
      } catch (const std::exception&) {
      }
      return InvalidArgument("--rdzv-conf: " + key + "='" + value +
                             "' is not a number of seconds > 0");
    };
    if (key == "join_timeout" || key == "timeout") {
      CRUN_RETURN_IF_ERROR(seconds(&c.join_timeout));
    } else if (key == "last_call_timeout") {
      CRUN_RETURN_IF_ERROR(seconds(&c.last_call_timeout));
    } else if (key == "close_timeout") {
      CRUN_RETURN_IF_ERROR(seconds(&c.close_timeout));
    } else if (key == "heartbeat_interval" || key == "keep_alive_interval") {
      CRUN_RETURN_IF_ERROR(seconds(&c.heartbeat_interval));
    } else if (key == "heartbeat_timeout") {
      CRUN_RETURN_IF_ERROR(seconds(&c.heartbeat_timeout));
    } else if (key == "read_timeout") {
      CRUN_RETURN_IF_ERROR(seconds(&c.read_timeout));
    } else if (key == "reconnect_timeout") {
      CRUN_RETURN_IF_ERROR(seconds(&c.reconnect_timeout));
    } else if (key == "is_host") {
      static const std::vector<std::string> yes{"1", "true", "yes", "y", "True", "TRUE"},
          no{"0", "false", "no", "n", "False", "FALSE"};
      if (std::find(yes.begin(), yes.end(), value) != yes.end()) {
        c.is_host = true;
      } else if (std::find(no.begin(), no.end(), value) != no.end()) {
        c.is_host = false;
      } else {
        return InvalidArgument("--rdzv-conf: is_host='" + value + "' is not true or false");
      }
    } else if (key == "node_id") {
      if (value.empty()) return InvalidArgument("--rdzv-conf: node_id is empty");
      c.node_id = value;
    } else {
      return InvalidArgument("--rdzv-conf: unknown key '" + key +
                             "' (known: join_timeout, last_call_timeout, close_timeout, "
                             "heartbeat_interval, heartbeat_timeout, read_timeout, "
                             "reconnect_timeout, is_host, node_id)");
    }
  }
  return c;
}

std::chrono::milliseconds Ms(double seconds) {
  return std::chrono::milliseconds(static_cast<long>(seconds * 1000));
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

// The node id when --rdzv-conf gives none: the host name, qualified by this host's address
// toward the endpoint unless that is loopback (one machine: the host name alone is clearest).
std::string DefaultNodeId(const std::string& host_name, const Endpoint& endpoint) {
  const std::string addr = LocalAddressToward(endpoint.host, endpoint.port);
  if (addr.empty() || addr.rfind("127.", 0) == 0 || addr == "::1") return host_name;
  return host_name + "@" + addr;
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

StatusOr<std::vector<int>> ParseSignals(const std::string& list) {
  std::vector<int> out;
  std::stringstream in(list);
  std::string name;
  while (std::getline(in, name, ',')) {
    if (name.empty()) continue;
    const int s = agent::ParseSignal(name);
    if (s < 0 || s == SIGKILL || s == SIGSTOP) {
      return InvalidArgument("--signals-to-handle: '" + name + "' is not a signal crun can handle");
    }
    out.push_back(s);
  }
  return out;
}

// torchrun's Std spec: "3" for every local rank, or "0:1,1:2" per local rank (others 0).
// Values are bitmasks: 1 stdout, 2 stderr, 3 both.
StatusOr<std::vector<int>> ParseStdSpec(const std::string& flag, const std::string& spec,
                                        int nproc) {
  auto bad = [&] {
    return InvalidArgument(flag + " '" + spec + "': expected 0-3 or local_rank:value,... (1 "
                           "stdout, 2 stderr, 3 both)");
  };
  auto value = [](const std::string& v) -> int {
    return v.size() == 1 && v[0] >= '0' && v[0] <= '3' ? v[0] - '0' : -1;
  };
  std::vector<int> out(static_cast<std::size_t>(nproc), 0);
  if (spec.find(':') == std::string::npos) {
    const int v = value(spec);
    if (v < 0) return bad();
    std::fill(out.begin(), out.end(), v);
    return out;
  }
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto colon = item.find(':');
    if (colon == std::string::npos) return bad();
    int lr = -1;
    try {
      lr = std::stoi(item.substr(0, colon));
    } catch (const std::exception&) {
      return bad();
    }
    const int v = value(item.substr(colon + 1));
    if (lr < 0 || v < 0) return bad();
    if (lr < nproc) out[static_cast<std::size_t>(lr)] = v;
  }
  return out;
}

StatusOr<std::vector<int>> ParseRankList(const std::string& list, int nproc) {
  std::vector<int> out;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    try {
      std::size_t used = 0;
      const int lr = std::stoi(item, &used);
      if (used != item.size() || lr < 0 || lr >= nproc) throw std::out_of_range(item);
      out.push_back(lr);
    } catch (const std::exception&) {
      return InvalidArgument("--local-ranks-filter: '" + item + "' is not a local rank in 0.." +
                             std::to_string(nproc - 1));
    }
  }
  return out;
}

std::string RandomRunId() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
  return buf;
}

void AddOptions(CLI::App& app, LaunchOptions& o) {
  auto pet = [](const char* name) { return std::string("PET_") + name; };
  app.add_option("--nnodes", o.nnodes, "Number of nodes, N or MIN:MAX")
      ->envname(pet("NNODES"))->capture_default_str()->group("Job");
  app.add_option("--nproc-per-node,--nproc_per_node", o.nproc_per_node,
                 "Workers on this node: a number, cpu, gpu or auto")
      ->envname(pet("NPROC_PER_NODE"))->capture_default_str()->group("Job");
  app.add_flag("--standalone", o.standalone, "Single-node job with its own store on a free port")
      ->envname(pet("STANDALONE"))->group("Job");
  app.add_option("--rdzv-id,--rdzv_id", o.rdzv_id, "Run id (TORCHELASTIC_RUN_ID)")
      ->envname(pet("RDZV_ID"))->capture_default_str()->group("Job");
  app.add_option("--rdzv-backend,--rdzv_backend", o.rdzv_backend,
                 "crun (alias c10d): the rendezvous service at --rdzv-endpoint; static: fixed "
                 "--node-rank with the store at --master-addr:--master-port (default: crun when "
                 "an endpoint is given, else static)")
      ->envname(pet("RDZV_BACKEND"))->group("Rendezvous");
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", o.rdzv_endpoint,
                 "host[:port] of the rendezvous service (port 29400); the node whose address it "
                 "is hosts the service in its crun, unless a `crun rendezvous` runs there")
      ->envname(pet("RDZV_ENDPOINT"))->group("Rendezvous");
  app.add_option("--rdzv-conf,--rdzv_conf", o.rdzv_conf,
                 "key=value,...: join_timeout, last_call_timeout, close_timeout, "
                 "heartbeat_interval, heartbeat_timeout, read_timeout, reconnect_timeout "
                 "(seconds), is_host, node_id")
      ->envname(pet("RDZV_CONF"))->group("Rendezvous");
  app.add_option("--role", o.role, "Role name of the workers (ROLE_NAME)")
      ->envname(pet("ROLE"))->capture_default_str()->group("Job");
  app.add_option("--max-restarts,--max_restarts", o.max_restarts,
                 "Restarts of the worker group allowed after a failure")
      ->envname(pet("MAX_RESTARTS"))->check(CLI::NonNegativeNumber)->capture_default_str()
      ->group("Restarts and shutdown");
  app.add_option("--monitor-interval,--monitor_interval", o.monitor_interval,
                 "Accepted for torchrun compatibility; crun sees exits at once and never polls")
      ->envname(pet("MONITOR_INTERVAL"))->check(CLI::NonNegativeNumber)
      ->group("Restarts and shutdown");
  app.add_option("--shutdown-timeout,--shutdown_timeout", o.shutdown_timeout,
                 "Seconds between the stop signal and SIGKILL (default: "
                 "$TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30)")
      ->envname(pet("SHUTDOWN_TIMEOUT"))->check(CLI::NonNegativeNumber)
      ->group("Restarts and shutdown");
  app.add_option("--signals-to-handle,--signals_to_handle", o.signals,
                 "Signals forwarded to the workers, comma-separated (SIGUSR1/SIGUSR2 may be added)")
      ->envname(pet("SIGNALS_TO_HANDLE"))->capture_default_str()->group("Restarts and shutdown");
  app.add_flag("-m,--module", o.module, "Run the script as a Python module (python -m)")
      ->envname(pet("MODULE"))->group("Worker program");
  app.add_flag("--no-python,--no_python", o.no_python, "Run the script as a program, not with Python")
      ->envname(pet("NO_PYTHON"))->group("Worker program");
  app.add_flag("--run-path,--run_path", o.run_path,
                "Run the script with runpy.run_path inside the interpreter")
      ->envname(pet("RUN_PATH"))->group("Worker program");
  app.add_flag("--virtual-local-rank,--virtual_local_rank", o.virtual_local_rank,
               "Every worker sees LOCAL_RANK=0 and only its own GPU in CUDA_VISIBLE_DEVICES")
      ->envname(pet("VIRTUAL_LOCAL_RANK"))->group("Worker program");
  app.add_option("--local-addr,--local_addr", o.local_addr,
                 "Address this node advertises: the store binds it and workers get it as "
                 "MASTER_ADDR (overrides --master-addr)")
      ->envname(pet("LOCAL_ADDR"))->group("Static rendezvous");
  app.add_option("--master-addr,--master_addr", o.master_addr,
                 "Address of the store the workers use (MASTER_ADDR)")
      ->envname(pet("MASTER_ADDR"))->capture_default_str()->group("Static rendezvous");
  app.add_option("--master-port,--master_port", o.master_port,
                 "Port of that store (default: a free port, new for every attempt)")
      ->envname(pet("MASTER_PORT"))->check(CLI::Range(0, 65535))->group("Static rendezvous");
  app.add_flag("--slurm", o.slurm,
               "One crun per node of a Slurm job step (srun --ntasks-per-node=1 crun ...): "
               "nodes, node order, run id and rendezvous host from SLURM_*; the default inside "
               "a step when no --nnodes, --rdzv-endpoint or --standalone is given")
      ->group("Slurm");
  app.add_flag("--slurm-direct", o.slurm_direct,
               "One crun per worker (srun --ntasks-per-node=4 crun --slurm-direct ...): RANK, "
               "LOCAL_RANK, WORLD_SIZE, ... from the Slurm task; task 0 hosts the store on the "
               "step's first node; restarts belong to Slurm")
      ->group("Slurm");
  app.add_option("--slurm-port", o.slurm_port,
                 "Port of the step's rendezvous (--slurm) or store (--slurm-direct) on its "
                 "first node (default: 10000 + (8 x job id + step id) mod 22000)")
      ->check(CLI::Range(1, 65535))->group("Slurm");
  app.add_option("--node-rank,--node_rank", o.node_rank,
                 "This node's rank: required by the static backend; with crun's backend it "
                 "imposes the node order (as a scheduler would)")
      ->envname(pet("NODE_RANK"))->check(CLI::NonNegativeNumber)->capture_default_str()
      ->group("Static rendezvous");
  app.add_option("--log-dir,--log_dir", o.log_dir,
                 "Base directory of <run-id>/attempt_<n>/<local-rank>/{stdout,stderr}.log, "
                 "error.json (default: a new temporary directory)")
      ->envname(pet("LOG_DIR"))->group("Logs");
  app.add_option("-r,--redirects", o.redirects,
                 "Send worker output to the log files only: 1 stdout, 2 stderr, 3 both; or "
                 "per local rank, e.g. 0:1,1:2")
      ->envname(pet("REDIRECTS"))->capture_default_str()->group("Logs");
  app.add_option("-t,--tee", o.tee,
                 "Send worker output to the log files and, prefixed, to the console (same "
                 "format; prefix template: $TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)")
      ->envname(pet("TEE"))->capture_default_str()->group("Logs");
  app.add_option("--local-ranks-filter,--local_ranks_filter", o.local_ranks_filter,
                 "Comma list of local ranks whose output reaches the console")
      ->envname(pet("LOCAL_RANKS_FILTER"))->group("Logs");
  app.add_option("--log-level", o.log_level, "crun's own messages: trace .. off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))
      ->capture_default_str()->group("Logs");
  AddSecurityFlags(&app, &o.security);
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
  AddOptions(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return UsageError(e.what());
  }
  o.command = app.remaining();
  if (!o.command.empty() && o.command[0] == "--") o.command.erase(o.command.begin());

  // Under srun, one crun per node: asked for with --slurm, or the default inside a job step
  // when nothing names the job's nodes otherwise.
  const bool names_nodes = app.count("--nnodes") > 0 || !o.rdzv_endpoint.empty() ||
                           o.standalone || app.count("--node-rank") > 0 ||
                           !o.rdzv_backend.empty();
  std::optional<SlurmNodeSettings> slurm;
  std::optional<SlurmTaskSettings> slurm_task;
  if (o.slurm_direct) {
    if (names_nodes || o.slurm) {
      return UsageError("--slurm-direct takes the ranks from the Slurm task: drop --slurm, "
                        "--nnodes, --node-rank, --rdzv-backend, --rdzv-endpoint and --standalone");
    }
    if (o.nproc_per_node != "1") {
      return UsageError("--slurm-direct runs one worker per Slurm task, not --nproc-per-node " +
                        o.nproc_per_node + " (ask srun for more tasks per node)");
    }
    if (o.max_restarts > 0) {
      return UsageError("--slurm-direct: restarts belong to Slurm (srun --requeue, or a new "
                        "step), not --max-restarts " + std::to_string(o.max_restarts));
    }
    auto step = ReadSlurmStep();
    if (!step.ok()) return UsageError("--slurm-direct: " + step.status().message());
    auto task = TaskSettings(*step, o.slurm_port > 0 ? o.slurm_port : SlurmDefaultPort(*step));
    if (!task.ok()) return UsageError("--slurm-direct: " + task.status().message());
    slurm_task = std::move(task).value();
    if (o.rdzv_id == "none") o.rdzv_id = slurm_task->run_id;
  } else if (o.slurm || (!names_nodes && InSlurmStep())) {
    if (names_nodes) {
      return UsageError("--slurm takes the nodes from the Slurm step: drop --nnodes, "
                        "--node-rank, --rdzv-backend, --rdzv-endpoint and --standalone");
    }
    auto step = ReadSlurmStep();
    if (!step.ok()) return UsageError("--slurm: " + step.status().message());
    slurm = NodeSettings(*step, o.slurm_port > 0 ? o.slurm_port : SlurmDefaultPort(*step));
    o.nnodes = std::to_string(slurm->nnodes);
    o.node_rank = slurm->node_rank;
    o.rdzv_backend = "crun";
    o.rdzv_endpoint = slurm->host + ":" + std::to_string(slurm->port);
    if (o.rdzv_id == "none") o.rdzv_id = slurm->run_id;
  } else if (app.count("--slurm-port") > 0) {
    return UsageError("--slurm-port " + std::to_string(o.slurm_port) + " without a Slurm step");
  }
  auto nodes = ParseNnodes(o.nnodes);
  if (!nodes.ok()) return UsageError(nodes.status().message());
  const bool node_rank_given =
      app.count("--node-rank") > 0 || std::getenv("PET_NODE_RANK") || slurm.has_value();
  const std::string& backend = o.rdzv_backend;
  if (backend == "etcd" || backend == "etcd-v2") {
    return UsageError("--rdzv-backend " + backend + " is not supported: crun's own service "
                      "(--rdzv-backend c10d or crun, with --rdzv-endpoint) replaces it");
  }
  if (!backend.empty() && backend != "static" && backend != "c10d" && backend != "crun") {
    return UsageError("--rdzv-backend '" + backend + "': expected crun, c10d or static");
  }
  // Which rendezvous: one node in-process, static, or crun's service.
  enum class Mode { kLocal, kStatic, kService } mode = Mode::kLocal;
  if (o.standalone) {
    if (nodes->max != 1) return UsageError("--standalone runs one node; --nnodes is '" + o.nnodes + "'");
  } else if (backend == "c10d" || backend == "crun" || (backend.empty() && !o.rdzv_endpoint.empty())) {
    mode = Mode::kService;
  } else if (nodes->max > 1) {
    mode = Mode::kStatic;
  }
  if (mode == Mode::kService && o.rdzv_endpoint.empty()) {
    return UsageError("--rdzv-backend " + backend + " needs --rdzv-endpoint host[:port]");
  }
  if (mode == Mode::kStatic) {
    if (nodes->min != nodes->max) {
      return UsageError("--nnodes '" + o.nnodes + "': the static backend needs a fixed number "
                        "of nodes (use --rdzv-endpoint for an elastic range)");
    }
    if (o.node_rank >= nodes->max) {
      return UsageError("--node-rank " + std::to_string(o.node_rank) + " is not below --nnodes " +
                        std::to_string(nodes->max));
    }
    if (o.master_port <= 0) {
      return UsageError("the static backend needs --master-port (the store node 0 hosts)");
    }
  } else if (mode == Mode::kLocal && o.node_rank != 0) {
    return UsageError("--node-rank " + std::to_string(o.node_rank) + " on a one-node job");
  }
  Endpoint endpoint;
  RdzvConf conf;
  if (mode == Mode::kService) {
    std::string error;
    if (!ParseEndpoint(o.rdzv_endpoint, 29400, &endpoint, &error)) {
      return UsageError("--rdzv-endpoint: " + error);
    }
    auto c = ParseRdzvConf(o.rdzv_conf);
    if (!c.ok()) return UsageError(c.status().message());
    conf = std::move(c).value();
    // The step's first node hosts the rendezvous, whatever its name resolves to.
    if (slurm && !conf.is_host) conf.is_host = slurm->is_host;
    if (slurm && conf.node_id.empty()) conf.node_id = slurm->node_name;
  }
  crun::Security security;
  if (mode == Mode::kService) {
    auto loaded = crun::LoadSecurity(o.security, "client");
    if (!loaded.ok()) return UsageError(loaded.status().message());
    security = std::move(loaded).value();
  } else {
    for (const char* flag : {"--token-file", "--tls-cert", "--tls-key", "--tls-ca"}) {
      if (app.count(flag) > 0) {
        return UsageError(std::string(flag) + " secures crun's rendezvous service: it needs "
                          "--rdzv-endpoint (or --slurm)");
      }
    }
  }
  // The workers have no use for the token: keep it out of their environment.
  ::unsetenv("CRUN_TOKEN");
  auto nproc = ResolveNproc(o.nproc_per_node);
  if (!nproc.ok()) return UsageError(nproc.status().message());
  auto command = WorkerCommand(o);
  if (!command.ok()) return UsageError(command.status().message());
  // Under Slurm, its warning signals (--signal=USR1@60, scancel -s USR2) reach crun; by
  // default they are passed on to the workers as notices rather than ending crun.
  if ((slurm || slurm_task) && app.count("--signals-to-handle") == 0 &&
      std::getenv("PET_SIGNALS_TO_HANDLE") == nullptr) {
    o.signals += ",SIGUSR1,SIGUSR2";
  }
  auto signals = ParseSignals(o.signals);
  if (!signals.ok()) return UsageError(signals.status().message());
  double shutdown = o.shutdown_timeout;
  if (shutdown < 0) {
    const char* env = std::getenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
    try {
      shutdown = env != nullptr ? std::stod(env) : 30.0;
    } catch (const std::exception&) {
      return UsageError(std::string("TORCH_ELASTIC_SHUTDOWN_TIMEOUT '") + env +
                        "' is not a number of seconds");
    }
  }

  // Per-local-rank flags index by local rank: a Slurm task's is SLURM_LOCALID.
  const int local_ranks = slurm_task ? slurm_task->local_rank + 1 : *nproc;
  auto redirects = ParseStdSpec("--redirects", o.redirects, local_ranks);
  if (!redirects.ok()) return UsageError(redirects.status().message());
  auto tees = ParseStdSpec("--tee", o.tee, local_ranks);
  if (!tees.ok()) return UsageError(tees.status().message());
  auto console_ranks = ParseRankList(o.local_ranks_filter, local_ranks);
  if (!console_ranks.ok()) return UsageError(console_ranks.status().message());
  std::string log_dir = o.log_dir;
  if (log_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/crun_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      return UsageError("cannot create a log directory from '" + pattern + "': " +
                        std::strerror(errno));
    }
    log_dir = pattern;
  } else {
    std::error_code ec;
    std::filesystem::create_directories(log_dir, ec);
    if (ec) return UsageError("--log-dir '" + log_dir + "': " + ec.message());
  }

  SetUpLogging("launch", o.log_level);
  if (*nproc > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    ::setenv("OMP_NUM_THREADS", "1", 1);
    std::fprintf(stderr, "crun: OMP_NUM_THREADS was unset; set to 1 for each of the %d workers "
                         "(set it to tune)\n", *nproc);
  }
  ::signal(SIGPIPE, SIG_IGN);
  // As torchrun 2.x does: workers see which signals their launcher forwards.
  ::setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", o.signals.c_str(), 1);

  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  LocalRendezvousOptions rdzv;
  // As torchrun: --standalone always gets a fresh id.
  rdzv.run_id = o.standalone || o.rdzv_id == "none" ? RandomRunId() : o.rdzv_id;
  rdzv.role = o.role;
  rdzv.nproc = *nproc;
  rdzv.max_restarts = o.max_restarts;
  rdzv.store_host = o.local_addr.empty() ? o.master_addr : o.local_addr;
  rdzv.virtual_local_rank = o.virtual_local_rank;
  rdzv.store_port = o.master_port > 0 ? static_cast<std::uint16_t>(o.master_port) : 0;

  agent::AgentOptions agent_options;
  agent_options.command = std::move(command).value();
  agent_options.nproc = *nproc;
  agent_options.max_restarts = o.max_restarts;
  agent_options.shutdown_timeout = std::chrono::milliseconds(static_cast<long>(shutdown * 1000));
  agent_options.forward_signals = std::move(signals).value();
  agent_options.host_name = host;
  agent_options.entrypoint = o.command[0];
  agent_options.log_dir = log_dir;
  agent_options.redirects = std::move(redirects).value();
  agent_options.tees = std::move(tees).value();
  agent_options.console_ranks = std::move(console_ranks).value();
  if (const char* t = std::getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"); t != nullptr && *t) {
    agent_options.prefix_template = t;
  }
  if (const char* e = std::getenv("TORCHELASTIC_ERROR_FILE"); e != nullptr) {
    agent_options.parent_error_file = e;
  }

  rdzv.store_linger = agent_options.shutdown_timeout;
  boost::asio::io_context io(1);
  if (mode != Mode::kService) {
    if (slurm_task) {
      // Task 0's crun hosts the store on the step's first node for the whole step.
      const SlurmTaskSettings& t = *slurm_task;
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
      agent_options.first_local_rank = t.local_rank;
    }
    if (mode == Mode::kStatic) {
      rdzv.node_rank = o.node_rank;
      rdzv.nnodes = nodes->max;
      rdzv.static_store = true;
      rdzv.host_store = o.node_rank == 0;
      rdzv.store_host = o.master_addr;
      rdzv.bind_host = BindAddressFor(o.master_addr);
      rdzv.store_port = static_cast<std::uint16_t>(o.master_port);
    }
    agent::LocalAgent agent(io, std::move(agent_options), MakeLocalRendezvous(io, rdzv));
    return agent.Run();
  }

  agent::ServiceRendezvousOptions so;
  so.endpoint_host = endpoint.host;
  so.endpoint_port = endpoint.port;
  so.run_id = o.rdzv_id == "none" ? std::string("default") : o.rdzv_id;
  so.role = o.role;
  so.host = host;
  so.node_id = conf.node_id.empty() ? DefaultNodeId(host, endpoint) : conf.node_id;
  if (!o.local_addr.empty()) so.addresses.push_back(o.local_addr);
  so.nproc = *nproc;
  if (node_rank_given) so.requested_rank = o.node_rank;
  crun::rdzv::Settings settings;  // the service's defaults, overridden by --rdzv-conf
  settings.min_nodes = nodes->min;
  settings.max_nodes = nodes->max;
  settings.max_restarts = o.max_restarts;
  if (conf.join_timeout) settings.join_timeout = Ms(*conf.join_timeout);
  if (conf.last_call_timeout) settings.last_call_timeout = Ms(*conf.last_call_timeout);
  if (conf.heartbeat_timeout) settings.heartbeat_timeout = Ms(*conf.heartbeat_timeout);
  if (auto v = settings.Validate(); !v.ok()) return UsageError(v.message());
  so.settings = {settings.min_nodes,         settings.max_nodes,
                 settings.max_restarts,      settings.join_timeout,
                 settings.last_call_timeout, settings.heartbeat_timeout};
  so.heartbeat_interval = conf.heartbeat_interval
                              ? Ms(*conf.heartbeat_interval)
                              : std::min(std::chrono::milliseconds(1000),
                                         settings.heartbeat_timeout / 3);
  if (so.heartbeat_interval >= settings.heartbeat_timeout) {
    return UsageError("--rdzv-conf: heartbeat_interval (" +
                      std::to_string(so.heartbeat_interval.count()) +
                      " ms) must be shorter than heartbeat_timeout (" +
                      std::to_string(settings.heartbeat_timeout.count()) + " ms)");
  }
  so.keepalive_timeout = conf.read_timeout ? Ms(*conf.read_timeout) : settings.heartbeat_timeout;
  so.virtual_local_rank = o.virtual_local_rank;
  if (conf.reconnect_timeout) so.reconnect_timeout = Ms(*conf.reconnect_timeout);
  so.security = security;

  // The node the endpoint names hosts the service in this process (unless is_host says
  // otherwise); when its port is taken, another crun or a daemon serves it: join that one.
  std::unique_ptr<crun::rdzv::RendezvousService> hosted;
  const bool try_host = conf.is_host.value_or(NamesThisHost(endpoint.host));
  if (try_host) {
    crun::rdzv::ServiceOptions service;
    service.host = BindAddressFor(endpoint.host);
    service.port = endpoint.port;
    service.advertise_addr = o.local_addr;
    service.security = security;
    if (security.tls() && security.cert_pem.empty()) {
      return UsageError("this node hosts the rendezvous service (" + o.rdzv_endpoint +
                        ") with TLS: it needs its certificate and key (--tls-cert, --tls-key)");
    }
    auto started = crun::rdzv::RendezvousService::Start(service);
    if (started.ok()) {
      hosted = std::move(started).value();
      spdlog::info("hosting the rendezvous service on port {}", endpoint.port);
      if (security.token.empty() && !crun::LoopbackOnly(endpoint.host)) {
        spdlog::warn("the rendezvous service on port {} has no job token: anyone who can "
                     "reach it can join or end this job (set CRUN_TOKEN_FILE or CRUN_TOKEN on "
                     "every node; docs/security.md)", endpoint.port);
      }
    } else if (conf.is_host.value_or(false)) {
      std::fprintf(stderr, "crun: is_host=1 but %s\n", started.status().message().c_str());
      return 1;
    } else {
      spdlog::info("port {} is served already (another crun or `crun rendezvous`): joining it",
                   endpoint.port);
    }
  }
  int code = 0;
  {
    agent::LocalAgent agent(io, std::move(agent_options), agent::MakeServiceRendezvous(io, so));
    code = agent.Run();
  }
  if (hosted) {
    // The other nodes were sent the outcome with ours: let their sessions end first.
    hosted->Stop(conf.close_timeout ? Ms(*conf.close_timeout) : std::chrono::milliseconds(5000));
  }
  return code;
}

}  // namespace crun::launcher
