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

#include <boost/asio/io_context.hpp>
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "agent/local_agent.h"
#include "launcher/local_rendezvous.h"
#include "launcher/logging.h"

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

Status CheckSingleNode(const std::string& nnodes) {
  if (nnodes == "1" || nnodes == "1:1") return Status::Ok();
  return InvalidArgument("--nnodes '" + nnodes +
                         "': only one node is supported yet (multi-node rendezvous is not "
                         "implemented)");
}

bool IsExecutableOnPath(const std::string& program) {
  if (program.find('/') != std::string::npos) return ::access(program.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    const auto end = dirs.find(':', start);
    const std::string dir = dirs.substr(start, end == std::string::npos ? std::string::npos
                                                                        : end - start);
    if (::access(((dir.empty() ? "." : dir) + "/" + program).c_str(), X_OK) == 0) return true;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return false;
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
    if (!IsExecutableOnPath(script)) {
      return InvalidArgument("--no-python: '" + script + "' is not an executable file");
    }
    return o.command;
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
  app.add_option("--nnodes", o.nnodes, "Number of nodes, N or MIN:MAX (1 for now)")
      ->envname(pet("NNODES"))->capture_default_str()->group("Job");
  app.add_option("--nproc-per-node,--nproc_per_node", o.nproc_per_node,
                 "Workers on this node: a number, cpu, gpu or auto")
      ->envname(pet("NPROC_PER_NODE"))->capture_default_str()->group("Job");
  app.add_flag("--standalone", o.standalone, "Single-node job with its own store on a free port")
      ->envname(pet("STANDALONE"))->group("Job");
  app.add_option("--rdzv-id,--rdzv_id", o.rdzv_id, "Run id (TORCHELASTIC_RUN_ID)")
      ->envname(pet("RDZV_ID"))->capture_default_str()->group("Job");
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
  app.add_option("--node-rank,--node_rank", o.node_rank, "This node's rank (0 on one node)")
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

  if (auto s = CheckSingleNode(o.nnodes); !s.ok()) return UsageError(s.message());
  if (o.node_rank != 0) {
    return UsageError("--node-rank " + std::to_string(o.node_rank) + " on a one-node job");
  }
  auto nproc = ResolveNproc(o.nproc_per_node);
  if (!nproc.ok()) return UsageError(nproc.status().message());
  auto command = WorkerCommand(o);
  if (!command.ok()) return UsageError(command.status().message());
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

  auto redirects = ParseStdSpec("--redirects", o.redirects, *nproc);
  if (!redirects.ok()) return UsageError(redirects.status().message());
  auto tees = ParseStdSpec("--tee", o.tee, *nproc);
  if (!tees.ok()) return UsageError(tees.status().message());
  auto console_ranks = ParseRankList(o.local_ranks_filter, *nproc);
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

  boost::asio::io_context io(1);
  agent::LocalAgent agent(io, std::move(agent_options), MakeLocalRendezvous(io, rdzv));
  return agent.Run();
}

}  // namespace crun::launcher
