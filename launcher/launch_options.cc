#include "launcher/launch_options.h"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <optional>
#include <sstream>
#include <string_view>
#include <utility>

#include "base/numbers.h"
#include "base/signals.h"
#include "base/spelling.h"
#include "launcher/security_flags.h"
#include "rendezvous/contracts/contract_set.h"

namespace crun::launcher {

CLI::Validator WholeNumber(std::int64_t min, std::int64_t max) {
  return CLI::Validator(
      [min, max](std::string& v) -> std::string {
        if (ParseInteger(v, min, max)) return {};
        return "'" + v + "' is not a whole number from " + std::to_string(min) + " to " +
               std::to_string(max);
      },
      "INT");
}

CLI::Validator PositiveSeconds() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        if (auto s = ParseNumber(v, 0, kMaxFlagSeconds); s && *s > 0) return {};
        return "'" + v + "' is not a number of seconds above 0 (at most 30 days)";
      },
      "SECONDS");
}

void AddMetricsFlags(CLI::App* app, MetricsFlags* f, const std::string& what) {
  app->add_option("--metrics-port", f->port,
                  "Serve Prometheus metrics on this port at /metrics (0: a free one, printed)")
      ->check(WholeNumber(0, 65535))
      ->group("Metrics");
  app->add_option("--metrics-host", f->host,
                  "IP address of the metrics endpoint; a non-loopback one shows " + what +
                      " to that network")
      ->capture_default_str()
      ->group("Metrics");
}

void AddLaunchOptions(CLI::App& app, LaunchOptions& o) {
  auto pet = [](const char* name) { return std::string("PET_") + name; };
  app.add_option("--nnodes", o.nnodes, "Number of nodes, N or MIN:MAX")
      ->envname(pet("NNODES"))
      ->capture_default_str()
      ->group("Job");
  app.add_option("--nproc-per-node,--nproc_per_node", o.nproc_per_node,
                 "Workers on this node: a number, cpu, gpu or auto")
      ->envname(pet("NPROC_PER_NODE"))
      ->capture_default_str()
      ->group("Job");
  app.add_flag("--standalone", o.standalone, "Single-node job with its own store on a free port")
      ->envname(pet("STANDALONE"))
      ->group("Job");
  app.add_option("--rdzv-id,--rdzv_id", o.rdzv_id, "Run id (TORCHELASTIC_RUN_ID)")
      ->envname(pet("RDZV_ID"))
      ->capture_default_str()
      ->group("Job");
  app.add_option("--rdzv-backend,--rdzv_backend", o.rdzv_backend,
                 "The rendezvous backend (crun's are listed by crun --help)")
      ->envname(pet("RDZV_BACKEND"))
      ->group("Rendezvous");
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", o.rdzv_endpoint,
                 "host[:port] of the rendezvous service (port 29400); the node whose address it "
                 "is hosts the service in its crun, unless a `crun rendezvous` runs there")
      ->envname(pet("RDZV_ENDPOINT"))
      ->group("Rendezvous");
  app.add_option("--rdzv-conf,--rdzv_conf", o.rdzv_conf,
                 "key=value,...: join_timeout, last_call_timeout, close_timeout, "
                 "keep_alive_interval, keep_alive_max_attempt, heartbeat_timeout, read_timeout, "
                 "reconnect_timeout, connect_timeout (seconds), is_host, node_id, store_type "
                 "(tcp)")
      ->envname(pet("RDZV_CONF"))
      ->group("Rendezvous");
  app.add_option("--role", o.role, "Role name of the workers (ROLE_NAME)")
      ->envname(pet("ROLE"))
      ->capture_default_str()
      ->group("Job");
  // The job settings with a flag of their own, from their one list (rules/settings.h).
  for (const auto& f : rdzv::SettingFields()) {
    if (f.flags == nullptr) continue;
    std::string& text = o.settings[f.name];
    text = std::to_string(f.get(rdzv::Settings{}));
    std::string env = f.name;
    std::transform(env.begin(), env.end(), env.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::toupper(ch)); });
    app.add_option(f.flags, text, f.help)
        ->envname(pet(env.c_str()))
        ->type_name("INT")
        ->capture_default_str()
        ->group(f.group);
  }
  app.add_option("--progress-after,--progress_after", o.progress_after,
                 "An attempt whose workers send no step heartbeat has made progress once it has "
                 "run this many seconds (docs/health.md)")
      ->envname(pet("PROGRESS_AFTER"))
      ->type_name("SECONDS")
      ->capture_default_str()
      ->group("Restarts and shutdown");
  app.add_option("--health-check,--health_check", o.health_checks,
                 "Before each join: gpu, disk[:SIZE], memory[:SIZE] or a shell command that "
                 "passes by exiting 0; a node that fails one stays out and exits 87 (requeue "
                 "without this node). Repeatable; in PET_HEALTH_CHECK one per line "
                 "(docs/health.md)")
      ->envname(pet("HEALTH_CHECK"))
      ->type_name("CHECK")
      ->allow_extra_args(false)  // one value an occurrence: what follows is the worker's
      ->group("Health");
  app.add_option("--health-check-timeout,--health_check_timeout", o.health_check_timeout,
                 "Seconds each health check may take (and the gpu check's wait for GPU memory "
                 "to be released)")
      ->envname(pet("HEALTH_CHECK_TIMEOUT"))
      ->type_name("SECONDS")
      ->capture_default_str()
      ->group("Health");
  app.add_option("--unhealthy-nodes-file,--unhealthy_nodes_file", o.unhealthy_nodes_file,
                 "A node that fails its health check appends its host name here, for a batch "
                 "script that requeues without it (docs/health.md)")
      ->envname(pet("UNHEALTHY_NODES_FILE"))
      ->type_name("PATH")
      ->group("Health");
  app.add_option(
         "--straggler-action,--straggler_action", o.straggler_action,
         "A rank whose compute time per step (step records on CRUN_HEARTBEAT_FD) stays "
         "above the others': warn names it with its host and ratio; restart also stops it as "
         "failed (one restart); exclude takes its node out; off (docs/health.md)")
      ->envname(pet("STRAGGLER_ACTION"))
      ->type_name("ACTION")
      ->capture_default_str()
      ->group("Health");
  app.add_option("--monitor-interval,--monitor_interval", o.monitor_interval,
                 "Accepted for torchrun compatibility; crun sees exits at once and never polls")
      ->envname(pet("MONITOR_INTERVAL"))
      ->type_name("SECONDS")
      ->group("Restarts and shutdown");
  app.add_option("--shutdown-timeout,--shutdown_timeout", o.shutdown_timeout,
                 "Seconds between the stop signal and SIGKILL (default: "
                 "$TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30; 14 in a Kubernetes pod)")
      ->envname(pet("SHUTDOWN_TIMEOUT"))
      ->type_name("SECONDS")
      ->group("Restarts and shutdown");
  app.add_option("--hang-timeout,--hang_timeout", o.hang_timeout,
                 "A worker with no progress (output, heartbeat, file-timer request) for this "
                 "many seconds is hung: every rank's stacks are read, then the group restarts "
                 "as after a failure (0: off; docs/hangs.md)")
      ->envname(pet("HANG_TIMEOUT"))
      ->type_name("SECONDS")
      ->capture_default_str()
      ->group("Restarts and shutdown");
  app.add_option("--hang-after-steps,--hang_after_steps", o.hang_after_steps,
                 "A worker that reports steps (crun_worker.step) is hung after K times the "
                 "longest step so far without progress (at least 1 s), --hang-timeout still "
                 "the bound (0: off; docs/hangs.md)")
      ->envname(pet("HANG_AFTER_STEPS"))
      ->type_name("K")
      ->capture_default_str()
      ->group("Restarts and shutdown");
  app.add_option("--signals-to-handle,--signals_to_handle", o.signals,
                 "Signals forwarded to the workers, comma-separated (SIGUSR1/SIGUSR2 may be added)")
      ->envname(pet("SIGNALS_TO_HANDLE"))
      ->capture_default_str()
      ->group("Restarts and shutdown");
  app.add_option("--start-method,--start_method", o.start_method,
                 "spawn, fork or forkserver: checked and accepted for torchrun compatibility "
                 "(they choose how Python starts function entrypoints; crun execs every worker)")
      ->envname(pet("START_METHOD"))
      ->capture_default_str()
      ->group("Worker program");
  app.add_flag("-m,--module", o.module, "Run the script as a Python module (python -m)")
      ->envname(pet("MODULE"))
      ->group("Worker program");
  app.add_flag("--no-python,--no_python", o.no_python,
               "Run the script as a program, not with Python")
      ->envname(pet("NO_PYTHON"))
      ->group("Worker program");
  app.add_flag("--run-path,--run_path", o.run_path,
               "Run the script with runpy.run_path inside the interpreter")
      ->envname(pet("RUN_PATH"))
      ->group("Worker program");
  app.add_flag("--warm", o.warm,
               "Fork Python workers from a template that has imported torch, instead of "
               "starting each cold (docs/warm.md). Not for native programs, modules whose "
               "import must happen in every process, or code that reads its start time in "
               "/proc/self")
      ->envname(pet("WARM"))
      ->group("Worker program");
  app.add_option("--warm-modules", o.warm_modules,
                 "With --warm: more modules for the template to import, comma-separated "
                 "(after torch, torch.distributed, torch.nn.parallel and torch._dynamo, where "
                 "installed)")
      ->envname(pet("WARM_MODULES"))
      ->type_name("LIST")
      ->group("Worker program");
  app.add_option("--snapshots", o.snapshots,
                 "on or off: the node's snapshot store, memory crun holds for the whole job "
                 "where workers save their training state and load it after a restart "
                 "(docs/checkpoints.md)")
      ->envname(pet("SNAPSHOTS"))
      ->capture_default_str()
      ->group("Snapshots");
  app.add_option("--snapshot-memory", o.snapshot_memory,
                 "The tmpfs directory whose memory holds the snapshots (unnamed files, gone "
                 "with the job)")
      ->envname(pet("SNAPSHOT_MEMORY"))
      ->type_name("DIR")
      ->capture_default_str()
      ->group("Snapshots");
  app.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "Also write snapshots to this directory, off the training path (crun writes "
                 "them in the background; a save does not wait), and resume from it when no "
                 "node's memory holds a step every rank has")
      ->envname(pet("CHECKPOINT_DIR"))
      ->type_name("DIR")
      ->group("Snapshots");
  app.add_option("--checkpoint-every", o.checkpoint_every,
                 "With --checkpoint-dir: write the first snapshot saved at or past each "
                 "multiple of this many steps")
      ->envname(pet("CHECKPOINT_EVERY"))
      ->type_name("STEPS")
      ->capture_default_str()
      ->group("Snapshots");
  app.add_option("--checkpoint-keep", o.checkpoint_keep,
                 "With --checkpoint-dir: the newest steps kept on disk for each rank")
      ->envname(pet("CHECKPOINT_KEEP"))
      ->type_name("K")
      ->capture_default_str()
      ->group("Snapshots");
  app.add_option("--snapshot-replicas", o.snapshot_replicas,
                 "on or off: in a job of several nodes, copy each snapshot to the next node, "
                 "where a node that takes a lost one's ranks over loads them from")
      ->envname(pet("SNAPSHOT_REPLICAS"))
      ->capture_default_str()
      ->group("Snapshots");
  app.add_option("--resume-from-disk", o.resume_from_disk,
                 "on or off: with --checkpoint-dir, a load that finds no step in memory that "
                 "every rank holds resumes from the newest one on disk")
      ->envname(pet("RESUME_FROM_DISK"))
      ->capture_default_str()
      ->group("Snapshots");
  app.add_option("--contract", o.contract, crun::DescribeContracts())
      ->envname(pet("CONTRACT"))
      ->type_name("LIST")
      ->group("Worker program");
  app.add_flag("--virtual-local-rank,--virtual_local_rank", o.virtual_local_rank,
               "Every worker sees LOCAL_RANK=0 and only its own GPU in CUDA_VISIBLE_DEVICES")
      ->envname(pet("VIRTUAL_LOCAL_RANK"))
      ->group("Worker program");
  app.add_option("--numa-binding,--numa_binding", o.numa_binding,
                 "Bind each local rank's CPUs and memory near its GPU (GPU index = LOCAL_RANK): "
                 "node, socket, exclusive or core-complex")
      ->group("Worker program");
  app.add_option("--local-addr,--local_addr", o.local_addr,
                 "Address this node advertises: the store binds it and workers get it as "
                 "MASTER_ADDR (overrides --master-addr)")
      ->envname(pet("LOCAL_ADDR"))
      ->group("Static rendezvous");
  app.add_option("--master-addr,--master_addr", o.master_addr,
                 "Address of the store the workers use (MASTER_ADDR)")
      ->envname(pet("MASTER_ADDR"))
      ->capture_default_str()
      ->group("Static rendezvous");
  app.add_option("--master-port,--master_port", o.master_port,
                 "Port of that store (default: a free port, new for every attempt)")
      ->envname(pet("MASTER_PORT"))
      ->type_name("PORT")
      ->group("Static rendezvous");
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
      ->check(WholeNumber(1, 65535))
      ->group("Slurm");
  app.add_option("--node-rank,--node_rank", o.node_rank,
                 "This node's rank: required by the static backend; with crun's backend it "
                 "imposes the node order (as a scheduler would)")
      ->envname(pet("NODE_RANK"))
      ->type_name("INT")
      ->capture_default_str()
      ->group("Static rendezvous");
  app.add_option("--log-dir,--log_dir", o.log_dir,
                 "Base directory of <run-id>/<host>_<random>/attempt_<n>/<local-rank>/"
                 "{stdout,stderr}.log, error.json (default: a new temporary directory)")
      ->envname(pet("LOG_DIR"))
      ->group("Logs");
  app.add_option("-r,--redirects", o.redirects,
                 "Send worker output to the log files only: 1 stdout, 2 stderr, 3 both; or "
                 "per local rank, e.g. 0:1,1:2")
      ->envname(pet("REDIRECTS"))
      ->capture_default_str()
      ->group("Logs");
  app.add_option("-t,--tee", o.tee,
                 "Send worker output to the log files and, prefixed, to the console (same "
                 "format)")
      ->envname(pet("TEE"))
      ->capture_default_str()
      ->group("Logs");
  app.add_option("--local-ranks-filter,--local_ranks_filter", o.local_ranks_filter,
                 "Comma list of local ranks whose output reaches the console")
      ->envname(pet("LOCAL_RANKS_FILTER"))
      ->group("Logs");
  app.add_option("--log-line-prefix-template,--log_line_prefix_template",
                 o.log_line_prefix_template,
                 "Prefix of teed lines: ${role_name}, ${rank}, ${local_rank}, ${hostname} "
                 "(default: $TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, else [${role_name}${rank}]:)")
      ->envname(pet("LOG_LINE_PREFIX_TEMPLATE"))
      ->group("Logs");
  app.add_option("--duplicate-stdout-filters,--duplicate_stdout_filters",
                 o.duplicate_stdout_filters,
                 "Comma list of substrings (,, for a comma): stdout lines containing one are "
                 "also written to attempt_<n>/filtered_stdout.log")
      ->envname(pet("DUPLICATE_STDOUT_FILTERS"))
      ->group("Logs");
  app.add_option("--duplicate-stderr-filters,--duplicate_stderr_filters",
                 o.duplicate_stderr_filters, "The same for stderr (filtered_stderr.log)")
      ->envname(pet("DUPLICATE_STDERR_FILTERS"))
      ->group("Logs");
  app.add_option("--event-log-handler,--event_log_handler", o.event_log_handler,
                 "null, or console: crun's lifecycle events as one JSON line each on stderr, "
                 "with torchelastic's event names")
      ->envname(pet("EVENT_LOG_HANDLER"))
      ->capture_default_str()
      ->group("Logs");
  app.add_option("--logs-specs,--logs_specs", o.logs_specs,
                 "torchrun's Python plugin for log layouts: only its default (DefaultLogsSpecs) "
                 "is accepted")
      ->group("Logs");
  app.add_option("--log-level", o.log_level, "crun's own messages: trace .. off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))
      ->capture_default_str()
      ->group("Logs");
  app.add_option("--print-completion", o.print_completion,
                 "Print a shell completion script (bash, zsh or tcsh) and exit")
      ->group("Help");
  AddSecurityFlags(&app, &o.security);
  AddMetricsFlags(&app, &o.metrics, "this node's run id, workers and failures");
  app.add_option("--goodput-file,--goodput_file", o.goodput_file,
                 "Write where the job's time went (goodput, its categories and incidents, per "
                 "node and for the job) to this JSON file at its end (docs/observability.md)")
      ->envname("PET_GOODPUT_FILE")
      ->type_name("PATH")
      ->group("Metrics");
}

std::vector<std::string> KnownLongOptions(const CLI::App& app) {
  std::vector<std::string> out;
  for (const CLI::Option* opt : app.get_options()) {
    for (const auto& name : opt->get_lnames()) out.push_back("--" + name);
  }
  return out;
}

std::string UnknownOptionMessage(const std::string& word, const std::vector<std::string>& known) {
  const std::string name = word.substr(0, word.find('='));
  std::string message = "unknown option '" + name + "'";
  if (const std::string best = ClosestName(name, known); !best.empty()) {
    message += " (did you mean " + best + "?)";
  }
  return message + "; crun --help lists the options";
}

StatusOr<std::string> CompletionScript(const std::string& shell,
                                       const std::vector<std::string>& known) {
  std::string words;
  for (const auto& k : known) words += (words.empty() ? "" : " ") + k;
  if (shell == "bash") {
    return "# bash completion for crun: source it, or put it in "
           "/etc/bash_completion.d/crun\n"
           "complete -o default -o bashdefault -W \"" +
           words + "\" crun\n";
  }
  if (shell == "zsh") {
    return "#compdef crun\n"
           "_crun() {\n"
           "  if [[ $PREFIX == -* ]]; then compadd -- " +
           words +
           "\n"
           "  else _files; fi\n"
           "}\n"
           "compdef _crun crun\n";
  }
  if (shell == "tcsh") {
    std::string bare;
    for (const auto& k : known) bare += (bare.empty() ? "" : " ") + k.substr(2);
    return "complete crun 'c/--/(" + bare + ")/' 'p/*/f/'\n";
  }
  return InvalidArgument("--print-completion '" + shell + "': expected bash, zsh or tcsh");
}

}  // namespace crun::launcher
