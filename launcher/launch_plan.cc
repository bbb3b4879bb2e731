#include "launcher/launch_plan.h"

#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "agent/frameworks/contracts.h"
#include "agent/warm/warm_template.h"
#include "base/endpoint.h"
#include "base/files.h"
#include "base/host_addresses.h"
#include "base/text.h"
#include "launcher/devices.h"
#include "launcher/kubernetes.h"
#include "launcher/numa_binding.h"
#include "launcher/worker_command.h"

namespace crun::launcher {
namespace {

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

// Under srun: one crun per Slurm task (--slurm-direct), or one per node, asked for with
// --slurm or the default inside a job step when nothing names the job's nodes otherwise.
Status PlanSlurm(LaunchPlan& p, LaunchOptions& o, const std::set<std::string>& given,
                 const MachineFacts& facts) {
  const bool names_nodes = given.count("--nnodes") || !o.rdzv_endpoint.empty() || o.standalone ||
                           given.count("--node-rank") || !o.rdzv_backend.empty();
  auto port = [&](const SlurmStep& step) {
    return o.slurm_port > 0 ? o.slurm_port : SlurmDefaultPort(step);
  };
  if (o.slurm_direct) {
    if (names_nodes || o.slurm) {
      return InvalidArgument(
          "--slurm-direct takes the ranks from the Slurm task: drop --slurm, "
          "--nnodes, --node-rank, --rdzv-backend, --rdzv-endpoint and "
          "--standalone");
    }
    if (o.nproc_per_node != "1") {
      return InvalidArgument(
          "--slurm-direct runs one worker per Slurm task, not --nproc-per-node " +
          o.nproc_per_node + " (ask srun for more tasks per node)");
    }
    if (p.values.settings.max_restarts > 0) {
      return InvalidArgument(
          "--slurm-direct: restarts belong to Slurm (srun --requeue, or a new "
          "step), not --max-restarts " +
          std::to_string(p.values.settings.max_restarts));
    }
    auto step = ReadSlurmStep(facts.getenv);
    if (!step.ok()) return InvalidArgument("--slurm-direct: " + step.status().message());
    auto task = TaskSettings(*step, port(*step));
    if (!task.ok()) return InvalidArgument("--slurm-direct: " + task.status().message());
    p.slurm_task = std::move(task).value();
    if (o.rdzv_id == "none") o.rdzv_id = p.slurm_task->run_id;
  } else if (o.slurm || (!names_nodes && InSlurmStep(facts.getenv))) {
    if (names_nodes) {
      return InvalidArgument(
          "--slurm takes the nodes from the Slurm step: drop --nnodes, "
          "--node-rank, --rdzv-backend, --rdzv-endpoint and --standalone");
    }
    auto step = ReadSlurmStep(facts.getenv);
    if (!step.ok()) return InvalidArgument("--slurm: " + step.status().message());
    p.slurm = NodeSettings(*step, port(*step));
    o.nnodes = std::to_string(p.slurm->nnodes);
    p.values.settings.min_nodes = p.values.settings.max_nodes = p.slurm->nnodes;
    p.values.node_rank = p.slurm->node_rank;
    o.rdzv_endpoint = FormatEndpoint(p.slurm->host, static_cast<std::uint16_t>(p.slurm->port));
    if (o.rdzv_id == "none") o.rdzv_id = p.slurm->run_id;
  } else if (given.count("--slurm-port")) {
    return InvalidArgument("--slurm-port " + std::to_string(o.slurm_port) +
                           " without a Slurm step");
  }
  return Status::Ok();
}

// --rdzv-backend as given; else the table's choice with an endpoint or without one. --standalone
// is always the choice without: as torchrun, one node with a rendezvous nobody else can reach.
StatusOr<const Backend*> PlanBackend(const LaunchOptions& o, const Backends& backends) {
  using Default = Backend::Default;
  const auto by_default = [&](Default d) {
    const Backend* b = DefaultBackend(backends, d);
    return b == nullptr ? std::string() : b->name;
  };
  std::string name = o.rdzv_backend;
  if (name.empty()) {
    name = by_default(o.rdzv_endpoint.empty() ? Default::kWithoutEndpoint : Default::kWithEndpoint);
  }
  CRUN_ASSIGN_OR_RETURN(const Backend* chosen, ChooseBackend(backends, name, "--rdzv-backend"));
  if (!o.standalone) return chosen;
  return ChooseBackend(backends, by_default(Default::kWithoutEndpoint), "--standalone");
}

// --rdzv-conf: the backend's own keys kept for its plan, another backend's refused, unknown
// ones noted.
Status PlanConf(LaunchPlan& p, const Backends& backends, const Backend& chosen) {
  for (const auto& key : p.values.rdzv_conf.ignored) {
    p.notes.push_back("--rdzv-conf: ignoring unknown key '" + key +
                      "' (as torchrun does; crun's keys are in docs/cli.md)");
  }
  for (const auto& entry : p.values.rdzv_conf.backend_keys) {
    const std::string& key = entry.first;
    const auto& own = chosen.conf_keys;
    if (std::find(own.begin(), own.end(), key) != own.end()) continue;
    for (const Backend& b : backends) {
      if (std::find(b.conf_keys.begin(), b.conf_keys.end(), key) != b.conf_keys.end()) {
        return InvalidArgument("--rdzv-conf " + key + " is for --rdzv-backend " + b.name +
                               ", not " + chosen.name);
      }
    }
  }
  return Status::Ok();
}

// --numa-binding: each local rank's CPUs and memory nodes, the latter limited to those this
// process may allocate from (a note says which were dropped).
Status PlanNuma(LaunchPlan& p, const MachineFacts& facts) {
  if (!p.values.numa) return Status::Ok();
  agent::AgentOptions& a = p.agent;
  CRUN_ASSIGN_OR_RETURN(auto plan,
                        PlanNumaBinding(*p.values.numa, facts.system_root, a.first_local_rank,
                                        p.nproc, facts.Env("CUDA_VISIBLE_DEVICES"),
                                        facts.allowed_cpus));
  for (auto& b : plan) {
    std::vector<int> usable;
    for (int n : b.mems) {
      if (facts.allowed_mems.count(n) != 0) usable.push_back(n);
    }
    if (usable.size() != b.mems.size()) {
      p.notes.push_back("--numa-binding: local rank " +
                        std::to_string(a.first_local_rank + static_cast<int>(a.bindings.size())) +
                        ": this process may not allocate from NUMA node(s) " +
                        FormatCpuList(b.mems) + " (cpuset); its memory is " +
                        (usable.empty() ? "left unbound" : "bound to " + FormatCpuList(usable)));
    }
    a.bindings.push_back({b.cpus, usable});
  }
  return Status::Ok();
}

// --warm: the template's modules, for Python workers only.
void PlanWarm(const LaunchOptions& o, const LaunchValues& v, agent::AgentOptions& a) {
  if (!o.warm) return;
  if (a.interpreter.empty()) {
    std::fprintf(stderr, "crun: --warm applies to Python workers; '%s' starts cold\n",
                 a.command[0].c_str());
    return;
  }
  a.warm_modules = agent::DefaultWarmModules();
  a.warm_modules.insert(a.warm_modules.end(), v.warm_modules.begin(), v.warm_modules.end());
}

// The health gate (docs/health.md): the checks, with `gpu` refused here when nvidia-smi is not
// on PATH; the directories `disk` looks at besides the log directory (added when it is made).
Status PlanHealth(agent::AgentOptions& a, const LaunchValues& v, const LaunchOptions& o,
                  const MachineFacts& facts) {
  agent::HealthGateOptions& h = a.health;
  const std::string path = facts.Env("PATH").value_or("");
  h.nvidia_smi = FindOnPath("nvidia-smi", path);
  for (const auto& spec : v.health_checks) {
    CRUN_ASSIGN_OR_RETURN(auto check, agent::ParseHealthCheck(spec, h.nvidia_smi, path));
    h.checks.push_back(std::move(check));
  }
  h.timeout = v.health_check_timeout;
  if (auto visible = facts.Env("CUDA_VISIBLE_DEVICES")) {
    std::size_t start = 0;
    while (start <= visible->size()) {
      const auto end = std::min(visible->find(',', start), visible->size());
      const auto gpu = Trim(std::string_view(*visible).substr(start, end - start));
      if (!gpu.empty()) h.visible_gpus.emplace_back(gpu);
      start = end + 1;
    }
  }
  if (!v.snapshot_disk.dir.empty()) h.dirs.push_back(v.snapshot_disk.dir);
  a.unhealthy_nodes_file = o.unhealthy_nodes_file;
  a.straggler_action = v.straggler_action;
  if (!a.unhealthy_nodes_file.empty() && h.checks.empty() &&
      a.straggler_action != agent::StragglerAction::kExclude) {
    return InvalidArgument("--unhealthy-nodes-file " + a.unhealthy_nodes_file +
                           " needs --health-check or --straggler-action exclude: without either "
                           "no node is ever noted");
  }
  return Status::Ok();
}

// The agent's options: the workers, their command, signals, logs and bindings.
Status PlanAgent(LaunchPlan& p, LaunchOptions& o, const std::set<std::string>& given,
                 const MachineFacts& facts) {
  const LaunchValues& v = p.values;
  CRUN_ASSIGN_OR_RETURN(p.nproc, ResolveNproc(o.nproc_per_node, facts.system_root,
                                              facts.Env("CUDA_VISIBLE_DEVICES"), facts.cpus));
  const WorkerCommandOptions wo{o.command, o.module, o.no_python, o.run_path};
  agent::AgentOptions& a = p.agent;
  CRUN_ASSIGN_OR_RETURN(a.command, WorkerCommand(wo, facts.getenv));
  a.interpreter = InterpreterNote(a.command, wo, facts.getenv);
  PlanWarm(o, v, a);
  // --contract: the other frameworks' variables (agent/frameworks/contracts.h). The service and
  // etcd are told the set, so that they refuse a node that runs another one, or whose ports do
  // not fit it; a static rendezvous exchanges them on its shared store.
  a.contracts = v.settings.contracts;
  a.forward_signals = v.signals;
  // Under Slurm, its warning signals (--signal=USR1@60, scancel -s USR2) reach crun; by
  // default they are passed on to the workers as notices rather than ending crun.
  if ((p.slurm || p.slurm_task) && !given.count("--signals-to-handle") &&
      !facts.Env("PET_SIGNALS_TO_HANDLE")) {
    o.signals += ",SIGUSR1,SIGUSR2";
    a.forward_signals.insert(a.forward_signals.end(), {SIGUSR1, SIGUSR2});
  }
  a.shutdown_timeout = v.shutdown_timeout;
  a.snapshots = v.snapshots;
  a.snapshot_memory = o.snapshot_memory;
  a.snapshot_disk = v.snapshot_disk;
  a.hang_timeout = v.hang_timeout;
  a.hang_after_steps = v.hang_after_steps;
  a.max_restarts_without_progress = v.settings.max_restarts_without_progress;
  a.progress_after = v.progress_after;
  CRUN_RETURN_IF_ERROR(PlanHealth(a, v, o, facts));
  a.file_timer = facts.Env("TORCHELASTIC_ENABLE_FILE_TIMER").value_or("") == "1";
  a.timer_file = facts.Env("TORCHELASTIC_TIMER_FILE").value_or("");
  a.tool_path = facts.Env("PATH").value_or("/usr/bin:/bin");
  // Per-local-rank flags index by local rank: a Slurm task's is SLURM_LOCALID.
  const int local_ranks = p.slurm_task ? p.slurm_task->local_rank + 1 : p.nproc;
  a.redirects = v.redirects.For(local_ranks);
  a.tees = v.tee.For(local_ranks);
  CRUN_RETURN_IF_ERROR(CheckLocalRanks(v.console_ranks, local_ranks));
  a.console_ranks = v.console_ranks;
  a.nproc = p.nproc;
  a.first_local_rank = p.slurm_task ? p.slurm_task->local_rank : 0;
  a.max_restarts = p.values.settings.max_restarts;
  a.entrypoint = o.command[0];
  a.stdout_filters = v.stdout_filters;
  a.stderr_filters = v.stderr_filters;
  a.torchelastic_events = v.torchelastic_events;
  if (v.prefix_template) a.prefix_template = *v.prefix_template;
  if (auto e = facts.Env("TORCHELASTIC_ERROR_FILE")) a.parent_error_file = *e;
  return PlanNuma(p, facts);
}

// A file crun writes at the job's end: refused now, naming it, where it could not be written.
Status CheckOutputFile(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) return InvalidArgument(flag + " '': a file's path is needed");
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    return InvalidArgument(flag + " " + path + ": is a directory; a file's path is needed");
  }
  const fs::path parent = fs::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  if (!fs::is_directory(dir, ec)) {
    return InvalidArgument(flag + " " + path + ": its directory " + dir + " does not exist");
  }
  if (::access(dir.c_str(), W_OK) != 0) {
    return InvalidArgument(flag + " " + path + ": crun cannot write in " + dir + " (" +
                           std::strerror(errno) + ")");
  }
  return Status::Ok();
}

// --metrics-port and --metrics-host: this node's /metrics endpoint (docs/observability.md).
// When the job's rendezvous uses TLS, the endpoint serves HTTPS with this node's certificate
// (--tls-cert, and client certificates of --tls-ca required); a node without one keeps its
// endpoint on loopback, where plain HTTP leaves the host for no network.
Status PlanMetrics(LaunchPlan& p, const LaunchOptions& o, const std::set<std::string>& given) {
  if (given.count("--goodput-file") != 0) {
    CRUN_RETURN_IF_ERROR(CheckOutputFile("--goodput-file", o.goodput_file));
    p.agent.goodput_file = o.goodput_file;
  }
  if (!o.metrics.port) {
    if (given.count("--metrics-host") != 0) {
      return InvalidArgument("--metrics-host needs --metrics-port (the port of the endpoint)");
    }
    return Status::Ok();
  }
  if (!IsIpLiteral(o.metrics.host)) {
    return InvalidArgument("--metrics-host '" + o.metrics.host +
                           "' is not an IP address (the endpoint binds one address)");
  }
  http::HttpServerOptions m;
  m.host = o.metrics.host;
  m.port = *o.metrics.port;
  const Security& s = p.security;
  if (s.tls() && !s.cert_pem.empty()) {
    m.tls = http::TlsOptions{s.cert_pem, s.key_pem, s.ca_pem};
  } else if (s.tls() && !LoopbackOnly(m.host)) {
    return InvalidArgument("--metrics-host " + m.host +
                           ": this job's rendezvous uses TLS, and this node has no certificate "
                           "(--tls-cert, --tls-key) to serve its metrics over TLS with; give it "
                           "one, or leave the endpoint on loopback");
  }
  p.agent.metrics = m;
  p.agent.metric_labels.run_id = p.run_id;
  p.agent.metric_labels.role = o.role;
  return Status::Ok();
}

// Who writes --checkpoint-dir (agent::SnapshotDiskOptions::job): the cruns of one job say
// the same, those of two jobs do not.
std::string DiskJob(const LaunchPlan& p, const LaunchOptions& o, const Backend& backend) {
  if (p.slurm_task) {
    return p.slurm_task->master_addr + ":" + std::to_string(p.slurm_task->master_port) + " " +
           p.run_id;
  }
  if (backend.meets_at_endpoint) return o.rdzv_endpoint + " " + p.run_id;
  if (o.standalone || p.values.settings.max_nodes <= 1) return "";
  return o.master_addr + ":" + std::to_string(p.values.master_port) + " " + p.run_id;
}

}  // namespace

MachineFacts MachineFacts::OfThisMachine() {
  MachineFacts f;
  f.system_root = SystemRoot();
  f.cpus = static_cast<int>(std::thread::hardware_concurrency());
  f.allowed_cpus = AllowedCpus();
  f.allowed_mems = AllowedMemoryNodes();
  return f;
}

std::optional<std::string> MachineFacts::Env(const char* name) const {
  return EnvValue(getenv, name);
}

std::set<std::string> GivenFlags(const CLI::App& app) {
  std::set<std::string> given;
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->count() == 0) continue;
    for (const auto& name : opt->get_lnames()) given.insert("--" + name);
    for (const auto& name : opt->get_snames()) given.insert("-" + name);
  }
  return given;
}

namespace {

// In a Kubernetes pod (kubernetes.h): the node rank from the pod's index, and an older
// PyTorchJob's MASTER_ADDR and MASTER_PORT.
Status PlanPod(LaunchPlan& p, LaunchOptions& o, const std::set<std::string>& given,
               const MachineFacts& facts) {
  GivenPlacement g;
  g.node_rank = given.count("--node-rank") || facts.Env("PET_NODE_RANK").has_value();
  g.nnodes = given.count("--nnodes") > 0;
  g.master_addr = given.count("--master-addr") > 0;
  g.master_port = given.count("--master-port") > 0;
  g.endpoint = !o.rdzv_endpoint.empty();
  g.standalone = o.standalone;
  CRUN_ASSIGN_OR_RETURN(PodPlacement pod, ReadPodPlacement(g, facts.getenv));
  if (pod.node_rank) {
    p.values.node_rank = *pod.node_rank;
    p.node_rank_from = pod.node_rank_from;
    p.node_rank_given = true;
  }
  if (pod.master_addr) o.master_addr = *pod.master_addr;
  if (pod.master_port) {
    CRUN_ASSIGN_OR_RETURN(p.values.master_port,
                          ParseFlagInt("MASTER_PORT", *pod.master_port, 1, 65535));
  }
  for (auto& note : pod.notes) p.notes.push_back(std::move(note));
  return Status::Ok();
}

}  // namespace

StatusOr<LaunchPlan> PlanLaunch(LaunchOptions o, const std::set<std::string>& given,
                                const MachineFacts& facts, const Backends& backends) {
  LaunchPlan p;
  CRUN_ASSIGN_OR_RETURN(p.values,
                        ParseLaunchValues(o, given, facts.getenv, BackendConfKeys(backends)));
  CRUN_RETURN_IF_ERROR(PlanSlurm(p, o, given, facts));
  if (!p.slurm && !p.slurm_task) CRUN_RETURN_IF_ERROR(PlanPod(p, o, given, facts));
  // Whether this node's rank is imposed: --node-rank, PET_NODE_RANK, Slurm or the pod.
  p.node_rank_given |=
      given.count("--node-rank") || facts.Env("PET_NODE_RANK").has_value() || p.slurm.has_value();
  CRUN_ASSIGN_OR_RETURN(const Backend* backend, PlanBackend(o, backends));
  p.backend = backend->name;
  CRUN_RETURN_IF_ERROR(PlanConf(p, backends, *backend));
  CRUN_RETURN_IF_ERROR(PlanAgent(p, o, given, facts));
  if (p.agent.straggler_action == agent::StragglerAction::kExclude &&
      (!backend->leaves_nodes_out || o.standalone)) {
    return InvalidArgument(
        "--straggler-action exclude: the " + (o.standalone ? "--standalone" : backend->name) +
        " rendezvous cannot go on without a node (its round is its nodes, all of them); use warn, "
        "or crun's service or etcd with a spare or --nnodes MIN:MAX (docs/health.md)");
  }
  CRUN_ASSIGN_OR_RETURN(p.rendezvous, backend->plan(p, PlanInputs{o, given, facts}));
  p.agent.snapshot_disk.job = DiskJob(p, o, *backend);
  // A job that may have several nodes copies each snapshot to the next one (replicas.h), with
  // the job's token when it has one, over TLS when the job has TLS.
  p.agent.snapshot_replicas =
      p.values.snapshot_replicas && (p.values.settings.max_nodes > 1 || p.slurm_task.has_value());
  p.agent.snapshot_security = p.security;
  CRUN_RETURN_IF_ERROR(PlanMetrics(p, o, given));
  p.o = std::move(o);
  return p;
}

}  // namespace crun::launcher
