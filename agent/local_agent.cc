#include "agent/local_agent.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/spdlog.h>

#include "agent/failure_report.h"
#include "agent/line_pump.h"
#include "agent/worker_cgroup.h"

namespace crun::agent {
namespace {

namespace asio = boost::asio;

std::string Substitute(std::string arg, int local_rank) {
  static const std::string kMacro = "${local_rank}";
  for (auto at = arg.find(kMacro); at != std::string::npos; at = arg.find(kMacro, at)) {
    const std::string value = std::to_string(local_rank);
    arg.replace(at, kMacro.size(), value);
    at += value.size();
  }
  return arg;
}

std::string ReplaceAll(std::string s, const std::string& what, const std::string& with) {
  for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + with.size())) {
    s.replace(at, what.size(), with);
  }
  return s;
}

int BitFor(const std::vector<int>& masks, int lr) {
  return lr < static_cast<int>(masks.size()) ? masks[static_cast<std::size_t>(lr)] : 0;
}

std::vector<std::string> FileTail(const std::string& path, std::size_t lines) {
  std::ifstream in(path);
  std::deque<std::string> tail;
  std::string line;
  while (std::getline(in, line)) {
    tail.push_back(line);
    if (tail.size() > lines) tail.pop_front();
  }
  return {tail.begin(), tail.end()};
}

// The shell's codes for a program that cannot be run: 127 not found, 126 found but not
// executable (or exec failed otherwise).
int LaunchFailureCode(const Status& s) { return s.code() == StatusCode::kNotFound ? 127 : 126; }

}  // namespace

struct LocalAgent::Impl final : RendezvousEvents {
  struct Worker {
    int local_rank = 0;
    pid_t pid = 0;
    bool running = false;
    ExitStatus exit;  // once it has exited
    std::unique_ptr<ExitWatcher> watcher;
    std::unique_ptr<LinePump> out_pump, err_pump;
    std::string dir, error_file;
  };
  // kWaiting: no workers; joined, or reported the round's end, and waiting for the
  // rendezvous. kRunning: workers run. kStopping: they are being stopped.
  enum class Phase { kWaiting, kRunning, kStopping, kDone };
  // What to do once the workers are down.
  enum class Next { kNone, kRejoin, kConclude };

  Impl(asio::io_context& io_, AgentOptions o, std::unique_ptr<Rendezvous> r)
      : io(io_), options(std::move(o)), rdzv(std::move(r)), signals(io_), kill_timer(io_) {
    if (options.forward_signals.empty()) options.forward_signals = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  }

  int Run() {
    std::string why_not;
    cgroup = WorkerCgroup::Create(&why_not);
    if (cgroup) {
      spdlog::info("workers run in cgroup {}", cgroup->dir());
    } else {
      spdlog::info("no cgroup for the workers ({}): daemonised descendants are ended at the "
                   "end of each attempt, but would survive a SIGKILL of crun", why_not);
    }
    auto g = GroupGuard::Start(cgroup ? cgroup->dir() : std::string());
    if (!g.ok()) {
      spdlog::error("{}", g.status().message());
      return 1;
    }
    guard = std::move(g).value();
    if (auto sub = BecomeSubreaper(); !sub.ok()) {
      spdlog::warn("{}: a worker's daemonised descendants may outlive the job", sub.message());
    }
    for (int s : options.forward_signals) signals.add(s);
    ArmSignals();
    rdzv->Start(this);
    rdzv->Join();
    io.run();
    return exit_code;
  }

  void ArmSignals() {
    signals.async_wait([this](const boost::system::error_code& ec, int signo) {
      if (ec) return;
      OnSignal(signo);
      if (phase != Phase::kDone) ArmSignals();
    });
  }

  // ---- rendezvous events ----------------------------------------------------------------

  void OnAssignment(const GroupAssignment& g) override {
    if (phase != Phase::kWaiting || stopped_by_signal != 0) return;
    group = g;
    Event("torchelastic.rendezvous.round", "AGENT",
          {{"round", g.round}, {"spare", g.spare}, {"group_world_size", g.group_world_size},
           {"world_size", g.world_size}, {"master_addr", g.master_addr},
           {"master_port", g.master_port}});
    if (g.spare) {
      spdlog::info("round {}: this node is a spare (the round is full); waiting", g.round);
      return;
    }
    StartAttempt(g);
  }

  void OnStopAndRejoin(const std::string& reason, bool spends_restart) override {
    if (phase == Phase::kDone || stopped_by_signal != 0) return;
    Event("torchelastic.agent.restart", "AGENT",
          {{"reason", reason}, {"spends_restart", spends_restart}});
    if (spends_restart) {
      spdlog::warn("restarting the worker group (restart {} of at most {}): {}",
                   group.restart_count + 1, options.max_restarts, reason);
    } else {
      spdlog::warn("re-forming the job: {}", reason);
    }
    next = Next::kRejoin;
    if (phase == Phase::kRunning) return BeginStop(SIGTERM);
    if (phase == Phase::kWaiting) AfterWorkersDown();
  }

  void OnFinished(const JobOutcome& o) override {
    if (phase == Phase::kDone) return;
    outcome = o;
    next = Next::kConclude;
    if (phase == Phase::kRunning) return BeginStop(SIGTERM);
    if (phase == Phase::kWaiting) AfterWorkersDown();
  }

  // ---- events (--event-log-handler console) ------------------------------------------------

  // One torchelastic-style event as a JSON line on stderr: {"name", "source", "timestamp"
  // (ms since the epoch), "metadata"}.
  void Event(const std::string& name, const char* source, nlohmann::json metadata) {
    if (!options.console_events) return;
    metadata["run_id"] = group.run_id;
    metadata["role"] = group.role;
    metadata["hostname"] = options.host_name;
    metadata["group_rank"] = group.group_rank;
    metadata["agent_restarts"] = group.restart_count;
    const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::system_clock::now().time_since_epoch());
    nlohmann::json e{{"name", name}, {"source", source}, {"timestamp", now.count()},
                     {"metadata", std::move(metadata)}};
    const std::string line = e.dump() + "\n";
    ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
    (void)ignored;
  }

  void WorkerEvent(const Worker& w, const char* state) {
    nlohmann::json m{{"state", state},
                     {"global_rank", group.base_rank + w.local_rank},
                     {"local_rank", w.local_rank},
                     {"worker_id", std::to_string(w.pid)},
                     {"exit", w.exit.Describe()}};
    Event(std::string("torchelastic.worker.status.") + state, "WORKER", std::move(m));
  }

  // ---- workers ----------------------------------------------------------------------------

  // Whether `pid` is stopped (state T in /proc: SIGSTOP, SIGTSTP, a tracer).
  static bool IsStopped(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto close = stat.rfind(')');
    return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'T';
  }

  void StartAttempt(const GroupAssignment& g) {
    phase = Phase::kRunning;
    next = Next::kNone;
    failures.clear();
    failure_reported = false;
    failed_to_launch = false;
    group = g;
    const Environment base = CurrentEnvironment();
    workers.clear();
    workers.resize(static_cast<std::size_t>(options.nproc));
    std::vector<std::pair<int, PendingProcess>> pending;
    for (int lr = options.first_local_rank; lr < options.first_local_rank + options.nproc; ++lr) {
      auto& w = WorkerAt(lr);
      w.local_rank = lr;
      const std::string attempt_dir = options.log_dir + "/attempt_" + std::to_string(group.round);
      w.dir = attempt_dir + "/" + std::to_string(lr);
      std::error_code ec;
      std::filesystem::create_directories(w.dir, ec);
      if (ec) {
        LaunchFailed(lr, 1, "cannot create log directory " + w.dir + ": " + ec.message());
        break;
      }
      if (lr == options.first_local_rank) OpenFilteredFiles(attempt_dir);
      w.error_file = w.dir + "/error.json";
      std::filesystem::remove(w.error_file, ec);  // a re-formed round with the same number
      ProcessSpec spec;
      if (cgroup) {
        spec.cgroup_fd = cgroup->fd();
        spec.cgroup_dir = cgroup->dir();
      }
      if (const auto i = static_cast<std::size_t>(lr - options.first_local_rank);
          i < options.bindings.size()) {
        spec.cpus = options.bindings[i].cpus;
        spec.mem_nodes = options.bindings[i].mems;
      }
      for (const auto& a : options.command) spec.argv.push_back(Substitute(a, lr));
      spec.envp = ToEnvp(BuildWorkerEnvironment(group, lr, w.error_file, w.dir, base));
      std::vector<int> child_fds;  // closed in crun once the worker has them
      SetUpStream(w, 1, &spec.stdout_fd, &child_fds);
      SetUpStream(w, 2, &spec.stderr_fd, &child_fds);
      auto started = StartProcess(spec);
      for (int fd : child_fds) ::close(fd);
      if (!started.ok()) {
        LaunchFailed(lr, LaunchFailureCode(started.status()), started.status().message());
        break;
      }
      pending.push_back({lr, std::move(started).value()});
    }
    // Second phase: every child execs in parallel; collect the reports.
    for (auto& [lr, p] : pending) {
      auto& w = WorkerAt(lr);
      auto pid = FinishStart(p);
      if (!pid.ok()) {
        LaunchFailed(lr, LaunchFailureCode(pid.status()), pid.status().message());
        continue;
      }
      w.pid = *pid;
      w.running = true;
      ++running;
      guard->Add(w.pid);
      auto watcher = ExitWatcher::Watch(io, w.pid, [this, lr](ExitStatus s) { OnExit(lr, s); });
      if (!watcher.ok()) {
        spdlog::error("{}", watcher.status().message());
        ::kill(-w.pid, SIGKILL);  // unwatched, it would be lost: take it down now
      } else {
        w.watcher = std::move(watcher).value();
      }
    }
    if (failed_to_launch) {
      ReportFailures();
      if (running == 0) return MaybeEndAttempt();
      return BeginStop(SIGTERM);
    }
    nlohmann::json pids = nlohmann::json::array();
    for (const auto& w : workers) pids.push_back(w.pid);
    Event("torchelastic.worker.status.HEALTHY", "AGENT",
          {{"state", "HEALTHY"}, {"round", group.round}, {"world_size", group.world_size},
           {"first_rank", group.base_rank + options.first_local_rank}, {"pids", pids}});
    spdlog::info("round {} (restart {}): started {} workers, ranks {}..{} of {} (store {}:{})",
                 group.round, group.restart_count, options.nproc,
                 group.base_rank + options.first_local_rank,
                 group.base_rank + options.first_local_rank + options.nproc - 1, group.world_size,
                 group.master_addr,
                 group.master_port);
  }

  // A worker that could not be started counts as failed with the shell's code.
  void LaunchFailed(int lr, int code, const std::string& why) {
    spdlog::error("local rank {}: {}", lr, why);
    FailureRecord f;
    f.host = options.host_name;
    f.rank = group.base_rank + lr;
    f.local_rank = lr;
    f.exit = ExitStatus{false, code};
    f.when = std::chrono::system_clock::now();
    f.stderr_tail = {why};
    failures.push_back(std::move(f));
    failed_to_launch = true;
  }

  // The round's first failure goes to the rendezvous at once, so every node can stop.
  void ReportFailures() {
    if (failure_reported || failures.empty()) return;
    failure_reported = true;
    rdzv->ReportFailure(failures);
  }

  // The console prefix of local rank `lr`'s lines: the template with its macros filled in.
  std::string PrefixOf(int lr) const {
    std::string p = ReplaceAll(options.prefix_template, "${role_name}", group.role);
    p = ReplaceAll(p, "${rank}", std::to_string(group.base_rank + lr));
    p = ReplaceAll(p, "${local_rank}", std::to_string(lr));
    return ReplaceAll(p, "${hostname}", options.host_name);
  }

  // Routes one stream (1 stdout, 2 stderr) of worker `w`: straight to the console, straight to
  // a file (-r), or through a pump (tee, prefix, duplicate filters, or stderr kept for the
  // failure report).
  void SetUpStream(Worker& w, int bit, int* child_fd, std::vector<int>* child_fds) {
    const int lr = w.local_rank;
    const bool shown = options.console_ranks.empty() ||
                       std::find(options.console_ranks.begin(), options.console_ranks.end(), lr) !=
                           options.console_ranks.end();
    const bool tee = BitFor(options.tees, lr) & bit;
    const bool redirect = (BitFor(options.redirects, lr) & bit) && !tee;
    const auto& filters = bit == 1 ? options.stdout_filters : options.stderr_filters;
    const int console = bit == 1 ? STDOUT_FILENO : STDERR_FILENO;
    const std::string path = w.dir + (bit == 1 ? "/stdout.log" : "/stderr.log");
    int file = -1;
    if (tee || redirect) {
      file = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (file < 0) spdlog::warn("cannot write {}: {}", path, std::strerror(errno));
    }
    if (redirect && file >= 0 && filters.empty()) {
      *child_fd = file;
      child_fds->push_back(file);
      return;
    }
    if (!tee && !redirect && bit == 1 && filters.empty()) {
      // stdout untouched: the worker writes to crun's own
      if (!shown) {
        *child_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
        child_fds->push_back(*child_fd);
      }
      return;
    }
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) {
      spdlog::warn("local rank {}: no pipe for its output ({}): it writes to crun's console",
                   lr, std::strerror(errno));
      if (file >= 0) ::close(file);
      return;
    }
    *child_fd = p[1];
    child_fds->push_back(p[1]);
    PumpTargets targets;
    targets.console_fd = shown && !redirect ? console : -1;
    if (tee) targets.prefix = PrefixOf(lr);
    targets.file_fd = file;
    targets.file_path = path;
    targets.stream_name = "rank " + std::to_string(group.base_rank + lr) +
                          (bit == 1 ? " stdout" : " stderr");
    if (!filters.empty()) {
      targets.filters = filters;
      targets.filtered_fd = bit == 1 ? filtered_out : filtered_err;
      targets.filtered_prefix = PrefixOf(lr);
    }
    ++open_pumps;
    auto pump = std::make_unique<LinePump>(io, p[0], targets, [this, file] {
      if (file >= 0) ::close(file);
      --open_pumps;
      MaybeEndAttempt();
    });
    (bit == 1 ? w.out_pump : w.err_pump) = std::move(pump);
  }

  // attempt_<n>/filtered_{stdout,stderr}.log, shared by the attempt's workers.
  void OpenFilteredFiles(const std::string& attempt_dir) {
    CloseFilteredFiles();
    auto open = [&](const std::vector<std::string>& filters, const char* name) {
      if (filters.empty()) return -1;
      const std::string path = attempt_dir + "/" + name;
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd < 0) spdlog::warn("cannot write {}: {}", path, std::strerror(errno));
      return fd;
    };
    filtered_out = open(options.stdout_filters, "filtered_stdout.log");
    filtered_err = open(options.stderr_filters, "filtered_stderr.log");
  }

  void CloseFilteredFiles() {
    for (int* fd : {&filtered_out, &filtered_err}) {
      if (*fd >= 0) ::close(*fd);
      *fd = -1;
    }
  }

  void OnExit(int lr, ExitStatus status) {
    auto& w = WorkerAt(lr);
    w.running = false;
    w.exit = status;
    --running;
    WorkerEvent(w, status.success() ? "SUCCEEDED" : "FAILED");
    if (!status.success()) {
      FailureRecord f;
      f.host = options.host_name;
      f.rank = group.base_rank + lr;
      f.local_rank = lr;
      f.pid = w.pid;
      f.exit = status;
      f.when = std::chrono::system_clock::now();
      f.error_file = w.error_file;
      f.error = ReadErrorFile(w.error_file);
      if (w.err_pump) w.err_pump->DrainAvailable();
      f.stderr_tail = StderrTail(lr);
      failures.push_back(std::move(f));
      if (phase == Phase::kRunning) {
        spdlog::warn("rank {} (local rank {}, pid {}) on {} failed with {}; stopping the other "
                     "workers",
                     group.base_rank + lr, lr, w.pid, options.host_name, status.Describe());
        ReportFailures();
        BeginStop(SIGTERM);
      }
    }
    if (running == 0) {
      // Whatever the workers left behind in their groups goes with them; that also closes
      // the last writers of their output pipes.
      for (const auto& x : workers) {
        if (x.pid > 0) ::kill(-x.pid, SIGKILL);
      }
      // Descendants that left the workers' groups (setsid, double fork) end with the attempt
      // too, which also closes any output pipe they held: everything in the workers' cgroup,
      // and every orphan that came to crun as their subreaper.
      if (cgroup) cgroup->KillAll();
      if (const int strays = KillStrays({guard->pid()}); strays > 0) {
        spdlog::warn("ended {} process(es) the workers left behind outside their process "
                     "groups (daemonised descendants)", strays);
      }
      MaybeEndAttempt();
    }
  }

  // The attempt is over once every worker has exited and all their output has been read.
  void MaybeEndAttempt() {
    if (running == 0 && open_pumps == 0 &&
        (phase == Phase::kRunning || phase == Phase::kStopping)) {
      OnAllExited();
    }
  }

  void BeginStop(int signo) {
    if (phase == Phase::kStopping && signo == SIGTERM) return;  // already on its way down
    phase = Phase::kStopping;
    for (const auto& w : workers) {
      if (!w.running) continue;
      ::kill(-w.pid, signo);
      if (IsStopped(w.pid)) {
        // A stopped process keeps the signal pending and would only meet SIGKILL at the end
        // of the grace: let it run, so that it can act on the signal now.
        spdlog::warn("rank {} (pid {}) was stopped (SIGSTOP or a debugger): sending SIGCONT so "
                     "that it can act on {}", group.base_rank + w.local_rank, w.pid,
                     SignalName(signo));
        ::kill(-w.pid, SIGCONT);
      }
    }
    if (running == 0) return MaybeEndAttempt();
    kill_timer.expires_after(options.shutdown_timeout);
    kill_timer.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      for (const auto& w : workers) {
        if (w.running) {
          spdlog::warn("local rank {} (pid {}) still running {} ms after the stop signal: "
                       "SIGKILL",
                       w.local_rank, w.pid, options.shutdown_timeout.count());
          ::kill(-w.pid, SIGKILL);
        }
      }
    });
  }

  void OnSignal(int signo) {
    if (phase == Phase::kDone) return;
    if (signo == SIGUSR1 || signo == SIGUSR2) {
      // A notice, not a stop: the workers decide what it means.
      spdlog::warn("received {}: passing it on to {} workers", SignalName(signo), running);
      for (const auto& w : workers) {
        if (w.running) ::kill(-w.pid, signo);
      }
      return;
    }
    if (stopped_by_signal != 0) {
      // Already stopping. A second Ctrl-C (or SIGQUIT) is someone at a terminal who will not
      // wait: no more grace. A repeated SIGTERM or SIGHUP is not: Slurm, for one, sends
      // SIGTERM more than once at a job's time limit, and the grace stands.
      if (signo != SIGINT && signo != SIGQUIT) {
        spdlog::warn("received {} again: the workers keep their grace period", SignalName(signo));
        return;
      }
      spdlog::warn("received {} again: SIGKILL to the workers now", SignalName(signo));
      for (const auto& w : workers) {
        if (w.running) ::kill(-w.pid, SIGKILL);
      }
      return;
    }
    stopped_by_signal = signo;
    spdlog::warn("received {}: forwarding it to {} workers", SignalName(signo), running);
    rdzv->Leave("crun on " + options.host_name + " received " + SignalName(signo));
    if (phase != Phase::kRunning && phase != Phase::kStopping) return Finish(128 + signo);
    phase = Phase::kRunning;  // so that the signal itself is forwarded
    BeginStop(signo);
  }

  void OnAllExited() {
    kill_timer.cancel();
    CloseFilteredFiles();
    for (const auto& w : workers) {
      if (w.pid > 0) guard->Forget(w.pid);
    }
    phase = Phase::kWaiting;
    if (stopped_by_signal != 0) {
      std::string how;
      for (const auto& w : workers) {
        if (w.pid <= 0) continue;
        how += (how.empty() ? "" : ", ") + std::string("rank ") +
               std::to_string(group.base_rank + w.local_rank) + " " + w.exit.Describe();
      }
      spdlog::warn("the workers stopped after {}: {}", SignalName(stopped_by_signal), how);
      return Finish(128 + stopped_by_signal);
    }
    std::sort(failures.begin(), failures.end(),
              [](const auto& a, const auto& b) { return a.when < b.when; });
    for (auto& f : failures) {
      if (f.pid != 0) f.stderr_tail = StderrTail(f.local_rank);  // complete now
    }
    if (failures.empty() && next == Next::kNone) {
      rdzv->ReportSuccess();  // the job succeeds when every node has
    }
    AfterWorkersDown();
  }

  // No workers run: act on what the rendezvous decided, or wait for it.
  void AfterWorkersDown() {
    if (next == Next::kRejoin) {
      next = Next::kNone;
      failures.clear();
      rdzv->Join();
    } else if (next == Next::kConclude) {
      Conclude();
    }
  }

  void Conclude() {
    if (outcome.success) return Finish(0);
    const bool mine = !failures.empty() && outcome.root_node_id == rdzv->node_id();
    if (mine) {
      Report(failures);  // this node's full report, the same root cause first
    } else if (!outcome.root_report.empty()) {
      Report(outcome.root_report);
      std::fprintf(stderr, "crun: the job failed on node '%s': %s\n",
                   outcome.root_node_id.c_str(), outcome.reason.c_str());
    } else {
      std::fprintf(stderr, "crun: the job failed: %s\n", outcome.reason.c_str());
    }
    Finish(outcome.exit_code);
  }

  // The worker of local rank `lr` (one of this crun's).
  Worker& WorkerAt(int lr) {
    return workers[static_cast<std::size_t>(lr - options.first_local_rank)];
  }

  std::vector<std::string> StderrTail(int lr) {
    const auto& w = WorkerAt(lr);
    if (w.err_pump) return {w.err_pump->tail().begin(), w.err_pump->tail().end()};
    return FileTail(w.dir + "/stderr.log", 20);
  }

  void Report(const std::vector<FailureRecord>& report) {
    ReportContext c;
    c.run_id = group.run_id;
    c.host = options.host_name;
    c.role = group.role;
    c.entrypoint = options.entrypoint;
    c.attempt = group.restart_count;
    c.max_restarts = options.max_restarts;
    c.interpreter = options.interpreter;
    std::fputs(FormatReport(c, report).c_str(), stderr);
    const std::string json_path = options.log_dir + "/failure.json";
    std::ofstream json(json_path);
    json << ReportJson(c, report).dump(2) << "\n";
    json.close();
    if (json) {
      std::fprintf(stderr, "crun: failure report written to %s\n", json_path.c_str());
    } else {
      std::fprintf(stderr, "crun: cannot write the failure report to %s\n", json_path.c_str());
    }
    if (!options.parent_error_file.empty()) {
      // As torchrun does: the root cause's error file, with its exit code as errorCode.
      const auto& root = report.front();
      nlohmann::json j;
      if (root.error && root.error->raw.is_object() && root.error->raw["message"].is_object()) {
        j = root.error->raw;
      } else {
        j["message"]["message"] = root.error ? root.error->message : FormatReport(c, report);
      }
      j["message"]["errorCode"] = root.exit.ShellCode();
      std::ofstream(options.parent_error_file) << j.dump() << "\n";
    }
  }

  void Finish(int code) {
    Event(code == 0 ? "torchelastic.worker.status.SUCCEEDED" : "torchelastic.worker.status.FAILED",
          "AGENT", {{"state", code == 0 ? "SUCCEEDED" : "FAILED"}, {"exit_code", code}});
    exit_code = code;
    phase = Phase::kDone;
    boost::system::error_code ec;
    signals.cancel(ec);
    kill_timer.cancel();
    rdzv->Leave(code == 0 ? "done" : "exit code " + std::to_string(code));
  }

  asio::io_context& io;
  AgentOptions options;
  std::unique_ptr<Rendezvous> rdzv;
  std::unique_ptr<WorkerCgroup> cgroup;  // null where the machine gives crun none
  std::unique_ptr<GroupGuard> guard;
  asio::signal_set signals;
  asio::steady_timer kill_timer;
  std::vector<Worker> workers;
  std::vector<FailureRecord> failures;
  GroupAssignment group;
  JobOutcome outcome;
  Phase phase = Phase::kWaiting;
  Next next = Next::kNone;
  int running = 0;
  int open_pumps = 0;
  int filtered_out = -1, filtered_err = -1;  // this attempt's filtered_*.log
  int stopped_by_signal = 0;
  bool failed_to_launch = false;
  bool failure_reported = false;
  int exit_code = 0;
};

LocalAgent::LocalAgent(asio::io_context& io, AgentOptions options,
                       std::unique_ptr<Rendezvous> rendezvous)
    : impl_(std::make_unique<Impl>(io, std::move(options), std::move(rendezvous))) {}

LocalAgent::~LocalAgent() = default;

int LocalAgent::Run() { return impl_->Run(); }

}  // namespace crun::agent
