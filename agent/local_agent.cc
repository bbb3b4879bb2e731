#include "agent/local_agent.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>

#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/spdlog.h>

#include "agent/control_socket.h"
#include "agent/failure_report.h"
#include "agent/hangs/file_timer.h"
#include "agent/hangs/hang_watch.h"
#include "agent/hangs/stacks.h"
#include "agent/hangs/worker_pipe.h"
#include "agent/report_writer.h"
#include "agent/supervise/attempt_edge.h"
#include "agent/supervise/oom.h"
#include "agent/supervise/worker_cgroup.h"
#include "agent/worker_streams.h"
#include "base/proc.h"
#include "proto/protocol_version.h"

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

// The shell's codes for a program that cannot be run: 127 not found, 126 found but not
// executable (or exec failed otherwise).
int LaunchFailureCode(const Status& s) { return s.code() == StatusCode::kNotFound ? 127 : 126; }

std::string DirectoryOf(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

// Writes `text` to `path`; false when it did not all get there.
bool WriteText(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  return ::close(fd) == 0 && ok;
}

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
    // Hangs: what counts as its progress, its heartbeat pipe (when watched) and the pipe its
    // Python hook writes stacks to.
    ProgressCounter progress;
    std::unique_ptr<WorkerPipe> heartbeat;
    std::unique_ptr<StackPipe> stacks;
  };
  // kWaiting: no workers; joined, or reported the round's end, and waiting for the
  // rendezvous. kRunning: workers run. kStopping: they are being stopped.
  enum class Phase { kWaiting, kRunning, kStopping, kDone };
  // What to do once the workers are down.
  enum class Next { kNone, kRejoin, kConclude };

  Impl(asio::io_context& io_, AgentOptions o, std::unique_ptr<Rendezvous> r)
      : io(io_),
        options(std::move(o)),
        rdzv(std::move(r)),
        meters(MetersFor(registry, options, *rdzv)),
        signals(io_),
        kill_timer(io_),
        streams(io_, StreamOptionsOf(options, meters.get())),
        hang_watch(io_, options.hang_timeout,
                   [this](std::vector<WorkerProgress> p) { OnHang(std::move(p)); }) {
    if (options.forward_signals.empty()) {
      options.forward_signals = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
    }
  }

  static std::unique_ptr<AgentMetrics> MetersFor(metrics::Registry& registry, const AgentOptions& o,
                                                 const Rendezvous& r) {
    if (!o.metrics) return nullptr;
    AgentMetricLabels labels = o.metric_labels;
    labels.node = r.node_id();
    return std::make_unique<AgentMetrics>(registry, labels);
  }

  static StreamOptions StreamOptionsOf(const AgentOptions& o, AgentMetrics* m) {
    StreamOptions s{o.redirects,      o.tees,
                    o.console_ranks,  o.prefix_template,
                    o.stdout_filters, o.stderr_filters,
                    o.host_name,      o.hang_timeout.count() > 0 || m != nullptr};
    if (m != nullptr) {
      s.stdout_bytes = m->stdout_bytes;
      s.stderr_bytes = m->stderr_bytes;
    }
    return s;
  }

  // The /metrics endpoint, when asked for; an error names its address.
  Status StartMetrics() {
    if (!options.metrics) return Status::Ok();
    registry.OnScrape([this] { RefreshMetrics(); });
    auto started =
        metrics::HttpServer::Start(io, *options.metrics, [this] { return registry.Render(); });
    if (!started.ok()) return started.status();
    metrics_server = std::move(started).value();
    std::fprintf(stderr, "crun: metrics on %s\n", metrics_server->url().c_str());
    return Status::Ok();
  }

  // What the page shows of the workers' states, read at each scrape.
  void RefreshMetrics() {
    int alive = 0, exited = 0;
    for (const auto& w : workers) {
      if (w.running) {
        ++alive;
      } else if (w.pid > 0) {
        ++exited;
      }
    }
    const bool stopping = phase == Phase::kStopping;
    meters->workers_running->Set(stopping ? 0 : alive);
    meters->workers_stopping->Set(stopping ? alive : 0);
    meters->workers_exited->Set(exited);
  }

  void JoinRendezvous() {
    joined_at = std::chrono::steady_clock::now();
    rdzv->Join();
  }

  int Run() {
    std::string why_not;
    cgroup = WorkerCgroup::Create(&why_not);
    if (cgroup) {
      spdlog::info("workers run in cgroup {}", cgroup->dir());
    } else {
      spdlog::info(
          "no cgroup for the workers ({}): daemonised descendants are ended at the "
          "end of each attempt, but would survive a SIGKILL of crun",
          why_not);
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
    // Orphans that come to crun are reaped as they end; an attempt's edge looks again.
    auto child_signals = ChildSignals::Open(io, [this] {
      ReapOrphans();
      if (edge) edge->Notify();
    });
    if (!child_signals.ok()) {
      spdlog::error("{}", child_signals.status().message());
      return 1;
    }
    children = std::move(child_signals).value();
    if (auto s = PrepareHangTools(); !s.ok()) {
      spdlog::error("{}", s.message());
      return 1;
    }
    if (auto s = StartMetrics(); !s.ok()) {
      spdlog::error("{}", s.message());
      return 1;
    }
    for (int s : options.forward_signals) signals.add(s);
    ArmSignals();
    rdzv->Start(this);
    JoinRendezvous();
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
    if (meters) {
      meters->last_rendezvous_time->Set(
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count());
      meters->last_rendezvous_duration->Set(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - joined_at).count());
    }
    Event("torchelastic.rendezvous.round", "AGENT",
          {{"round", g.round},
           {"spare", g.spare},
           {"group_world_size", g.group_world_size},
           {"world_size", g.world_size},
           {"master_addr", g.master_addr},
           {"master_port", g.master_port}});
    if (g.spare) {
      spdlog::info("round {}: this node is a spare (the round is full); waiting", g.round);
      return;
    }
    StartAttempt(g);
  }

  void OnStopAndRejoin(const std::string& reason, bool spends_restart) override {
    if (phase == Phase::kDone || stopped_by_signal != 0) return;
    if (!interrupted_at) interrupted_at = std::chrono::steady_clock::now();
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
    nlohmann::json e{{"name", name},
                     {"source", source},
                     {"timestamp", now.count()},
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

  // Whether `pid` is stopped (SIGSTOP, SIGTSTP, a tracer).
  static bool IsStopped(pid_t pid) {
    const std::optional<char> state = ProcessState(pid);
    return state == 'T' || state == 't';
  }

  void StartAttempt(const GroupAssignment& g) {
    phase = Phase::kRunning;
    next = Next::kNone;
    failures.clear();
    hang_report.reset();
    WriteRunFiles();
    failure_reported = false;
    failed_to_launch = false;
    group = g;
    const Environment base = CurrentEnvironment();
    edge.reset();
    edge_clear = false;
    OpenAttemptCgroup();
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
      if (lr == options.first_local_rank) streams.BeginAttempt(attempt_dir);
      w.error_file = w.dir + "/error.json";
      std::filesystem::remove(w.error_file, ec);  // a re-formed round with the same number
      ProcessSpec spec;
      if (attempt_cgroup) {
        spec.cgroup_fd = attempt_cgroup->fd();
        spec.cgroup_dir = attempt_cgroup->dir();
      }
      if (const auto i = static_cast<std::size_t>(lr - options.first_local_rank);
          i < options.bindings.size()) {
        spec.cpus = options.bindings[i].cpus;
        spec.mem_nodes = options.bindings[i].mems;
      }
      for (const auto& a : options.command) spec.argv.push_back(Substitute(a, lr));
      Environment env = BuildWorkerEnvironment(group, lr, w.error_file, w.dir, base);
      w.progress = std::make_shared<std::uint64_t>(0);
      AddHangChannels(w, env, spec);
      spec.envp = ToEnvp(env);
      std::vector<int> child_fds;  // closed in crun once the worker has them
      const StreamOwner owner{group.role, group.base_rank + lr, lr, w.dir};
      w.out_pump = Route(owner, 1, &spec.stdout_fd, &child_fds, w.progress);
      w.err_pump = Route(owner, 2, &spec.stderr_fd, &child_fds, w.progress);
      auto started = StartProcess(spec);
      for (int fd : child_fds) ::close(fd);
      if (w.heartbeat) w.heartbeat->CloseChildEnd();
      if (w.stacks) w.stacks->CloseChildEnd();
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
      hang_watch.Watch(lr, w.pid, w.progress);
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
      if (running == 0) return BeginEdge();
      return BeginStop(SIGTERM);
    }
    nlohmann::json pids = nlohmann::json::array();
    for (const auto& w : workers) pids.push_back(w.pid);
    Event("torchelastic.worker.status.HEALTHY", "AGENT",
          {{"state", "HEALTHY"},
           {"round", group.round},
           {"world_size", group.world_size},
           {"first_rank", group.base_rank + options.first_local_rank},
           {"pids", pids}});
    asio::post(io, [this] { StartObservers(); });
    if (meters) {
      meters->rounds->Inc();
      meters->restarts->Mirror(group.restart_count);
      if (interrupted_at) {
        meters->recovery->Observe(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - *interrupted_at)
                .count());
      }
    }
    interrupted_at.reset();
    spdlog::info("round {} (restart {}): started {} workers, ranks {}..{} of {} (store {}:{})",
                 group.round, group.restart_count, options.nproc,
                 group.base_rank + options.first_local_rank,
                 group.base_rank + options.first_local_rank + options.nproc - 1, group.world_size,
                 group.master_addr, group.master_port);
  }

  // A failure of local rank `lr`, now.
  FailureRecord NewFailure(int lr, ExitStatus exit) const {
    FailureRecord f;
    f.host = options.host_name;
    f.rank = group.base_rank + lr;
    f.local_rank = lr;
    f.exit = exit;
    f.when = std::chrono::system_clock::now();
    return f;
  }

  // A worker that could not be started counts as failed with the shell's code.
  void LaunchFailed(int lr, int code, const std::string& why) {
    spdlog::error("local rank {}: {}", lr, why);
    if (meters) meters->Exit(kExitLaunch);
    FailureRecord f = NewFailure(lr, ExitStatus{false, code});
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

  // One stream of a worker, through WorkerStreams; a pump it starts counts until it ends.
  std::unique_ptr<LinePump> Route(const StreamOwner& owner, int bit, int* child_fd,
                                  std::vector<int>* child_fds, ProgressCounter progress) {
    auto pump = streams.Route(
        owner, bit, child_fd, child_fds,
        [this] {
          --open_pumps;
          MaybeEndAttempt();
        },
        std::move(progress));
    if (pump) ++open_pumps;
    return pump;
  }

  // Sends `signo` to the process group of every running worker.
  void SignalRunning(int signo) {
    for (const auto& w : workers) {
      if (w.running) ::kill(-w.pid, signo);
    }
  }

  void OnExit(int lr, ExitStatus status) {
    auto& w = WorkerAt(lr);
    w.running = false;
    w.exit = status;
    --running;
    hang_watch.Forget(lr);
    WorkerEvent(w, status.success() ? "SUCCEEDED" : "FAILED");
    // Read before the failure below starts a stop (which would make it "stopped").
    const bool stopping = phase == Phase::kStopping;
    bool oom_kill = false;
    const bool hang = HangRecordOf(lr) != nullptr;
    if (FailureRecord* hung = HangRecordOf(lr)) {
      // Stopped by crun after it hung: its record stands, with how it ended.
      hung->exit = status;
      hung->error = ReadErrorFile(w.error_file);
    } else if (!status.success()) {
      FailureRecord f = NewFailure(lr, status);
      f.pid = w.pid;
      if (status.signaled && status.value == SIGKILL && oom) {
        if (auto kill = oom->Check(w.pid)) f.oom = kill->Describe();
      }
      f.error_file = w.error_file;
      f.error = ReadErrorFile(w.error_file);
      if (w.err_pump) w.err_pump->DrainAvailable();
      f.stderr_tail = StderrTail(lr);
      const std::string how = status.Describe() + (f.oom.empty() ? "" : ": " + f.oom);
      oom_kill = !f.oom.empty();
      failures.push_back(std::move(f));
      if (phase == Phase::kRunning) {
        if (!interrupted_at) interrupted_at = std::chrono::steady_clock::now();
        spdlog::warn(
            "rank {} (local rank {}, pid {}) on {} failed with {}; stopping the other "
            "workers",
            group.base_rank + lr, lr, w.pid, options.host_name, how);
        ReportFailures();
        BeginStop(SIGTERM);
      }
    }
    if (meters) meters->Exit(ExitCauseOf(status, hang, oom_kill, stopping));
    if (running == 0) BeginEdge();
  }

  // This attempt's cgroup, below crun's: a new one for every attempt (AttemptEdge).
  void OpenAttemptCgroup() {
    attempt_cgroup.reset();
    if (!cgroup) return;
    auto a = AttemptCgroup::Create(*cgroup, attempts_started++);
    if (!a.ok()) {
      spdlog::warn("{}: this attempt's workers run without a cgroup of their own",
                   a.status().message());
      return;
    }
    attempt_cgroup = std::move(a).value();
  }

  // Every worker has exited: end and reap whatever else the attempt started (which also
  // closes the last writers of the workers' output pipes) before anything else happens.
  void BeginEdge() {
    std::vector<pid_t> groups;
    for (const auto& w : workers) {
      if (w.pid > 0) groups.push_back(w.pid);
    }
    edge = std::make_unique<AttemptEdge>(io, group.restart_count, std::move(groups),
                                         std::move(attempt_cgroup), options.edge_timeout,
                                         [this](const EdgeReport& r) { OnEdge(r); });
    edge->Start();
  }

  void OnEdge(const EdgeReport& r) {
    if (r.in_groups > 0) {
      spdlog::debug("attempt {}: ended {} process(es) still in the workers' process groups",
                    r.attempt, r.in_groups);
    }
    if (r.left_count > 0) {
      spdlog::warn(
          "attempt {}: ended {} process(es) that had left their worker's process group "
          "(setsid or daemonised): {}{}",
          r.attempt, r.left_count, Joined(r.left),
          r.left_count > static_cast<int>(r.left.size()) ? ", ..." : "");
    }
    if (!r.complete) {
      spdlog::error(
          "attempt {}: still running {} ms after SIGKILL: {}; no further attempt starts "
          "beside them",
          r.attempt, options.edge_timeout.count(), Joined(r.remaining));
      edge_stuck = true;
    } else if (!r.remaining.empty()) {
      spdlog::warn("attempt {}: {}", r.attempt, Joined(r.remaining));
    }
    spdlog::debug("attempt {}: its edge took {} us", r.attempt, r.took.count());
    edge_clear = true;
    MaybeEndAttempt();
  }

  static std::string Joined(const std::vector<std::string>& items) {
    std::string s;
    for (const auto& i : items) s += (s.empty() ? "" : ", ") + i;
    return s;
  }

  // The attempt is over once every worker has exited, all their output has been read, and
  // nothing else of the attempt is left (BeginEdge).
  void MaybeEndAttempt() {
    if (running == 0 && open_pumps == 0 && edge_clear &&
        (phase == Phase::kRunning || phase == Phase::kStopping)) {
      OnAllExited();
    }
  }

  void BeginStop(int signo) {
    if (phase == Phase::kStopping && signo == SIGTERM) return;  // already on its way down
    phase = Phase::kStopping;
    hang_watch.Stop();
    for (const auto& w : workers) {
      if (!w.running) continue;
      ::kill(-w.pid, signo);
      if (IsStopped(w.pid)) {
        // A stopped process keeps the signal pending and would only meet SIGKILL at the end
        // of the grace: let it run, so that it can act on the signal now.
        spdlog::warn(
            "rank {} (pid {}) was stopped (SIGSTOP or a debugger): sending SIGCONT so "
            "that it can act on {}",
            group.base_rank + w.local_rank, w.pid, SignalName(signo));
        ::kill(-w.pid, SIGCONT);
      }
    }
    if (running == 0) return MaybeEndAttempt();
    kill_timer.expires_after(options.shutdown_timeout);
    kill_timer.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      for (const auto& w : workers) {
        if (!w.running) continue;
        spdlog::warn("local rank {} (pid {}) still running {} ms after the stop signal: SIGKILL",
                     w.local_rank, w.pid, options.shutdown_timeout.count());
      }
      SignalRunning(SIGKILL);
    });
  }

  void OnSignal(int signo) {
    if (phase == Phase::kDone) return;
    if (signo == SIGUSR1 || signo == SIGUSR2) {
      // A notice, not a stop: the workers decide what it means.
      spdlog::warn("received {}: passing it on to {} workers", SignalName(signo), running);
      return SignalRunning(signo);
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
      return SignalRunning(SIGKILL);
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
    streams.EndAttempt();
    hang_watch.Stop();
    if (file_timer) file_timer->Clear();
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
    if (edge_stuck && next != Next::kConclude) {
      // Another attempt beside processes of this one would share the GPUs, ports and files
      // they hold: the job ends here, with the failure that caused the restart if any.
      if (!failures.empty()) Report(failures);
      return Finish(failures.empty() ? 1 : failures.front().exit.ShellCode());
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
      JoinRendezvous();
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
      std::fprintf(stderr, "crun: the job failed on node '%s': %s\n", outcome.root_node_id.c_str(),
                   outcome.reason.c_str());
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
    if (hang_report && !report.empty() && !report.front().hang.empty()) c.hang = &*hang_report;
    PublishReport(c, report, options.log_dir, options.parent_error_file);
  }

  // ---- hangs (docs/hangs.md) --------------------------------------------------------------

  // Starts the file-timer server (before any worker, which gets its pipe); the rest waits
  // until the first workers are on their way (StartObservers).
  Status PrepareHangTools() {
    if (!options.file_timer) return Status::Ok();
    const std::string path =
        options.timer_file.empty() ? options.log_dir + "/timer.pipe" : options.timer_file;
    auto server = FileTimerServer::Open(
        io, path,
        [this](pid_t pid) {
          if (Worker* w = WorkerOfPid(pid)) ++*w->progress;
        },
        [this](pid_t pid, std::string cause) { OnTimerExpired(pid, std::move(cause)); });
    if (!server.ok()) return server.status();
    file_timer = std::move(server).value();
    spdlog::info("torchelastic file timer: serving {}", file_timer->path());
    return Status::Ok();
  }

  // What only matters once workers run, made right after the first ones started, off the path
  // to starting them: the control socket (`crun stacks`), crun.pid and the OOM witnesses.
  void StartObservers() {
    if (oom) return;
    oom = std::make_unique<OomWatch>(cgroup ? cgroup->dir() : std::string());
    auto control = ControlServer::Listen(io, [this](const std::string& request,
                                                    std::function<void(std::string)> reply) {
      OnControl(request, std::move(reply));
    });
    if (control.ok()) {
      control_server = std::move(control).value();
    } else {
      spdlog::warn("{}: `crun stacks {}` will not reach this crun", control.status().message(),
                   ::getpid());
    }
    if (!WriteText(options.log_dir + "/crun.pid", std::to_string(::getpid()) + "\n")) {
      spdlog::warn("cannot write {}/crun.pid", options.log_dir);
    }
  }

  // The stack tools, looked for when first needed (not on the way to starting workers).
  const StackTools& Tools() {
    if (!tools) {
      tools = FindStackTools(options.tool_path,
                             {options.command.empty() ? "" : DirectoryOf(options.command[0])});
    }
    return *tools;
  }

  // Before the first worker starts (so that a run that never starts one leaves its log
  // directory empty): the Python hook.
  void WriteRunFiles() {
    if (wrote_run_files) return;
    wrote_run_files = true;
    // The hook, for Python workers only (crun chose their interpreter).
    const std::string dir = options.log_dir + "/python";
    std::error_code ec;
    if (options.interpreter.empty()) {
      // native workers: eu-stack or gdb read them
    } else if (std::filesystem::create_directories(dir, ec);
               !ec && WriteText(dir + "/sitecustomize.py", PythonHookSource())) {
      python_dir = dir;
    } else {
      spdlog::warn("cannot write {}/sitecustomize.py: Python workers' stacks need py-spy", dir);
    }
  }

  // The heartbeat pipe, the stack pipe, the hook on PYTHONPATH and the timer file.
  void AddHangChannels(Worker& w, Environment& env, ProcessSpec& spec) {
    HangChannels c;
    if (options.hang_timeout.count() > 0) {
      auto pipe = WorkerPipe::Create(io, [counter = w.progress](std::string_view) { ++*counter; });
      if (pipe.ok()) {
        w.heartbeat = std::move(pipe).value();
        c.heartbeat_fd = w.heartbeat->child_fd();
        spec.inherit_fds.push_back(c.heartbeat_fd);
      } else {
        spdlog::warn("local rank {}: no heartbeat: {}", w.local_rank, pipe.status().message());
      }
    }
    if (auto pipe = StackPipe::Create(io); pipe.ok()) {
      w.stacks = std::move(pipe).value();
      c.stacks_fd = w.stacks->child_fd();
      c.stacks_safe_signal = HookSignals().safe;
      c.stacks_signal = HookSignals().at_once;
      spec.inherit_fds.push_back(c.stacks_fd);
    }
    c.python_dir = python_dir;
    if (file_timer) c.timer_file = file_timer->path();
    agent::AddHangChannels(c, env);
  }

  // Reads every running rank's stacks, once for all who ask meanwhile (a hang, crun stacks,
  // the service for another node): each worker's hook pipe serves one request at a time, and
  // a capture under way is recent enough for whoever asks during it.
  void ReadStacks(std::function<void(const std::vector<RankStacks>&)> done) {
    stack_waiters.push_back(std::move(done));
    if (stack_waiters.size() > 1) return;  // joins the capture under way
    CaptureStacks(io, StackTargets(), Tools(), options.stack_deadline,
                  [this](std::vector<RankStacks> stacks) {
                    for (auto& w : std::exchange(stack_waiters, {})) w(stacks);
                  });
  }

  // `crun stacks PID`: every running rank's stacks, read now, as JSON.
  void OnControl(const std::string& request, std::function<void(std::string)> reply) {
    auto error = [&](const std::string& why) { reply(nlohmann::json{{"error", why}}.dump()); };
    if (request != "stacks") return error("unknown request '" + request + "'");
    if (phase != Phase::kRunning) {
      return error(phase == Phase::kStopping ? "the workers are being stopped"
                                             : "no workers are running (waiting for the "
                                               "rendezvous)");
    }
    ReadStacks([this, reply](const std::vector<RankStacks>& stacks) {
      nlohmann::json j{{"host", options.host_name},
                       {"run_id", group.run_id},
                       {"attempt", group.restart_count},
                       {"pid", ::getpid()},
                       {"world_size", group.world_size}};
      j["stacks"] = nlohmann::json::array();
      for (const auto& st : stacks) j["stacks"].push_back(StacksJson(st));
      reply(j.dump());
    });
  }

  // The service asks for this node's stacks: for a hang on another node, which prints them
  // all, or for `crun stacks --rdzv-endpoint`. Read without stopping anything; for a hang,
  // also printed here and kept under the attempt's log directory.
  void OnStacksRequest(std::uint64_t id, const std::string& reason) override {
    if (phase != Phase::kRunning) {
      return rdzv->ReplyStacks(id, options.host_name, {}, "no workers running");
    }
    const bool hang = reason != crun::kStacksCommandReason;
    if (hang) spdlog::warn("reading this node's stacks for another node: {}", reason);
    ReadStacks([this, id, reason, hang, round = group.round](const std::vector<RankStacks>& s) {
      rdzv->ReplyStacks(id, options.host_name, s, "");
      if (!hang || round != group.round) return;
      const std::string dir = WriteStacks(s);
      std::string lines;
      for (const auto& line : GroupSummary(s)) lines += "  " + line + "\n";
      std::fprintf(stderr, "crun: where this node's ranks were (%s):\n%s%s", reason.c_str(),
                   lines.c_str(), dir.empty() ? "" : ("  full stacks: " + dir + "\n").c_str());
    });
  }

  // The running worker that is `pid` or started it (its process group, else its ancestry).
  Worker* WorkerOfPid(pid_t pid) {
    const pid_t group_id = ::getpgid(pid);
    pid_t p = pid;
    for (int depth = 0; depth < 64 && p > 1; ++depth) {
      for (auto& w : workers) {
        if (w.running && (w.pid == p || (depth == 0 && w.pid == group_id))) return &w;
      }
      const auto parent = ParentOf(p);
      if (!parent) break;
      p = *parent;
    }
    return nullptr;
  }

  void OnTimerExpired(pid_t pid, std::string cause) {
    Worker* w = WorkerOfPid(pid);
    if (w == nullptr) {
      spdlog::warn("file timer: {}, but pid {} is not (or no longer) one of this crun's workers",
                   cause, pid);
      return;
    }
    if (phase == Phase::kRunning) hang_watch.Expire(w->local_rank, std::move(cause));
  }

  // The failure record of local rank `lr` that says it hung, if there is one.
  FailureRecord* HangRecordOf(int lr) {
    for (auto& f : failures) {
      if (f.local_rank == lr && !f.hang.empty()) return &f;
    }
    return nullptr;
  }

  // A hang was declared: read every rank's stacks while all still run, then stop the group as
  // for a failure of the hung ranks.
  void OnHang(std::vector<WorkerProgress> progress) {
    if (phase != Phase::kRunning || hang_gathering) return;
    hang_gathering = true;
    const auto when = std::chrono::system_clock::now();
    const auto started = std::chrono::steady_clock::now();
    HangReport h;
    for (const auto& p : progress) {
      HangReport::Rank r;
      r.host = options.host_name;
      r.rank = group.base_rank + p.local_rank;
      r.local_rank = p.local_rank;
      r.pid = p.pid;
      r.hung = p.hung;
      r.silent_s = static_cast<double>(p.silent.count()) / 1000.0;
      r.state = p.state;
      r.cause = p.cause;
      if (p.hung && options.hang_timeout.count() > 0 && p.cause.rfind("no progress", 0) == 0) {
        h.declared_late_ms =
            std::max(h.declared_late_ms,
                     static_cast<double>((p.silent - options.hang_timeout).count()));
      }
      if (p.hung) {
        spdlog::warn(
            "rank {} (local rank {}, pid {}) on {} is hung: {}; reading every rank's "
            "stacks before stopping the group",
            r.rank, r.local_rank, r.pid, r.host, r.cause);
      }
      h.ranks.push_back(std::move(r));
    }
    std::vector<std::string> traces;  // the flight recorder's files, when it was asked
    h.notes = TriggerFlightRecorder(&traces);
    // This node's ranks and, through the service, every other node's, read at once; the
    // report waits for both.
    struct Gather {
      HangReport h;
      std::optional<std::vector<RankStacks>> local;
      std::optional<RemoteStacks> remote;
      bool traces_done = false;
    };
    auto g = std::make_shared<Gather>();
    g->h = std::move(h);
    std::string why;
    for (const auto& r : g->h.ranks) {
      if (!r.hung) continue;
      why += (why.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r.rank) + " on " +
             r.host + " hung: " + r.cause;
    }
    auto conclude = [this, g, when, started, round = group.round] {
      if (!g->local || !g->remote || !g->traces_done) return;
      hang_gathering = false;
      if (round != group.round || (phase != Phase::kRunning && phase != Phase::kStopping)) {
        return;  // that attempt is over
      }
      HangReport& report = g->h;
      report.stacks = std::move(*g->local);
      report.stacks.insert(report.stacks.end(), g->remote->ranks.begin(), g->remote->ranks.end());
      std::sort(report.stacks.begin(), report.stacks.end(),
                [](const auto& a, const auto& b) { return a.rank < b.rank; });
      for (const auto& m : g->remote->missing) report.notes.push_back("no stacks from " + m);
      report.stacks_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
              .count();
      ConcludeHang(std::move(report), when);
    };
    ReadStacks([g, conclude](const std::vector<RankStacks>& stacks) {
      g->local = stacks;
      conclude();
    });
    WaitForTraces(std::move(traces), std::chrono::steady_clock::now() + kTraceWait,
                  [g, conclude](std::string note) {
                    if (!note.empty()) g->h.notes.push_back(std::move(note));
                    g->traces_done = true;
                    conclude();
                  });
    rdzv->AskStacks(why, options.stack_deadline + std::chrono::seconds(2),
                    [g, conclude](RemoteStacks remote) {
                      g->remote = std::move(remote);
                      conclude();
                    });
  }

  std::vector<StackTarget> StackTargets() {
    std::vector<StackTarget> targets;
    for (auto& w : workers) {
      if (!w.running) continue;
      targets.push_back(
          {options.host_name, group.base_rank + w.local_rank, w.local_rank, w.pid, w.stacks.get()});
    }
    return targets;
  }

  void ConcludeHang(HangReport h, std::chrono::system_clock::time_point when) {
    h.stacks_dir = WriteStacks(h.stacks);
    // Ranks that fell silent together: the stacks tell the one that holds the others up
    // from those waiting for it in a collective.
    std::set<int> silent;
    for (const auto& r : h.ranks) {
      if (r.hung) silent.insert(r.rank);
    }
    const std::set<int> suspects = SuspectRanks(h.stacks);
    std::set<int> culprits;
    for (int rank : suspects) {
      if (silent.count(rank)) culprits.insert(rank);
    }
    if (silent.size() > 1 && !culprits.empty()) {
      for (auto& r : h.ranks) {
        if (r.hung && !culprits.count(r.rank)) {
          r.hung = false;
          r.cause.clear();
        }
      }
    }
    if (culprits.empty() && suspects.size() < h.stacks.size()) {
      // Every rank here waits for ranks on other nodes: this node's failure names them, so
      // that whichever node's report arrives first, the root cause says who held the job up.
      std::string who;
      for (const auto& s : h.stacks) {
        if (!suspects.count(s.rank)) continue;
        who += (who.empty() ? "" : "; ") + std::string("rank ") + std::to_string(s.rank) + " on " +
               s.host + " (" + WhereWaiting(s) + ")";
      }
      for (auto& r : h.ranks) {
        if (r.hung) r.cause += "; by every node's stacks it waits for " + who;
      }
    }
    for (const auto& r : h.ranks) {
      Worker& w = WorkerAt(r.local_rank);
      if (!r.hung || !w.running || HangRecordOf(r.local_rank) != nullptr) continue;
      FailureRecord f = NewFailure(r.local_rank, ExitStatus{true, SIGTERM});
      f.when = when;
      f.pid = w.pid;
      f.error_file = w.error_file;
      f.hang = r.cause;
      failures.push_back(std::move(f));
    }
    std::sort(failures.begin(), failures.end(),
              [](const auto& a, const auto& b) { return a.when < b.when; });
    // Deadline -> report: how late it was declared, then the stacks.
    h.report_ms = h.declared_late_ms + h.stacks_ms;
    const std::string rule(72, '=');
    std::fprintf(stderr, "%s\ncrun: %s hung (run %s, attempt %d)\n%s%s\n", rule.c_str(),
                 options.entrypoint.c_str(), group.run_id.c_str(), group.restart_count,
                 FormatHang(h).c_str(), rule.c_str());
    const std::string json =
        options.log_dir + "/attempt_" + std::to_string(group.round) + "/hang.json";
    if (!WriteText(json, HangJson(h).dump(2) + "\n")) {
      spdlog::warn("cannot write {}", json);
    }
    hang_report = std::move(h);
    if (phase != Phase::kRunning) return;  // already stopping for another failure
    ReportFailures();
    BeginStop(SIGTERM);
  }

  // Each rank's stacks in attempt_<n>/stacks/rank_<r>.txt; the directory, or "" if unwritable.
  std::string WriteStacks(const std::vector<RankStacks>& stacks) {
    const std::string dir = options.log_dir + "/attempt_" + std::to_string(group.round) + "/stacks";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    bool ok = !ec;
    for (const auto& s : stacks) {
      const std::string text = FormatRankStacks(s) +
                               (s.text.empty() ? "" : "\n--- " + s.tool + " output ---\n" + s.text);
      ok = ok && WriteText(dir + "/rank_" + std::to_string(s.rank) + ".txt", text);
    }
    if (!ok) {
      spdlog::warn("cannot write the stacks under {}", dir);
      return "";
    }
    return dir;
  }

  // PyTorch's NCCL flight recorder: when the workers' environment has its dump pipe, each rank
  // made <prefix><rank>.pipe and dumps its trace when anything is written there.
  // PyTorch looks at the dump pipe about once a second and then writes its trace: the group is
  // stopped only once every asked rank's file is there and has stopped growing, or after this.
  static constexpr std::chrono::seconds kTraceWait{10};

  // Polls `files` every 100 ms until each exists with a non-zero size unchanged for 0.5 s, or
  // `deadline`; then `done` with a note naming what was (not) written.
  struct TraceSize {
    std::uintmax_t size = 0;
    std::chrono::steady_clock::time_point since;
  };
  void WaitForTraces(std::vector<std::string> files, std::chrono::steady_clock::time_point deadline,
                     std::function<void(std::string)> done,
                     std::shared_ptr<std::map<std::string, TraceSize>> sizes = nullptr) {
    if (files.empty()) return asio::post(io, [done] { done(""); });
    if (!sizes) sizes = std::make_shared<std::map<std::string, TraceSize>>();
    const auto now = std::chrono::steady_clock::now();
    std::vector<std::string> pending;
    for (const auto& f : files) {
      std::error_code ec;
      const auto size = std::filesystem::file_size(f, ec);
      auto& seen = (*sizes)[f];
      if (ec || size == 0 || size != seen.size) {
        seen = {ec ? 0 : size, now};
        pending.push_back(f);
      } else if (now - seen.since < std::chrono::milliseconds(500)) {
        pending.push_back(f);
      }
    }
    if (pending.empty() || std::chrono::steady_clock::now() >= deadline) {
      std::string note =
          pending.empty()
              ? "NCCL flight recorder: every trace written (" + std::to_string(files.size()) +
                    " files)"
              : "NCCL flight recorder: not written within " + std::to_string(kTraceWait.count()) +
                    " s: " + pending.front() +
                    (pending.size() > 1 ? " and " + std::to_string(pending.size() - 1) + " more"
                                        : "");
      return asio::post(io, [done, note] { done(note); });
    }
    auto timer = std::make_shared<asio::steady_timer>(io, std::chrono::milliseconds(100));
    timer->async_wait([this, timer, files = std::move(files), deadline, done,
                       sizes](const boost::system::error_code& ec) mutable {
      if (ec) return;
      WaitForTraces(std::move(files), deadline, std::move(done), std::move(sizes));
    });
  }

  std::vector<std::string> TriggerFlightRecorder(std::vector<std::string>* traces) {
    std::vector<std::string> notes;
    const Environment env = CurrentEnvironment();
    for (const char* name : {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "TORCH_FR_DEBUG_INFO_PIPE_FILE"}) {
      const auto it = env.find(name);
      if (it == env.end() || it->second.empty()) continue;
      std::vector<int> asked, absent;
      for (const auto& w : workers) {
        if (!w.running) continue;
        const int rank = group.base_rank + w.local_rank;
        const std::string pipe = it->second + std::to_string(rank) + ".pipe";
        const int fd = ::open(pipe.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (fd >= 0 && ::write(fd, "1\n", 2) == 2) {
          asked.push_back(rank);
        } else {
          absent.push_back(rank);
        }
        if (fd >= 0) ::close(fd);
      }
      const auto temp = env.find("TORCH_NCCL_DEBUG_INFO_TEMP_FILE");
      const std::string prefix = temp != env.end() && !temp->second.empty()
                                     ? temp->second
                                     : std::string("/tmp/nccl_trace_rank_");
      for (int rank : asked) traces->push_back(prefix + std::to_string(rank));
      if (!asked.empty()) {
        notes.push_back("NCCL flight recorder: dump asked of ranks " + RankRanges(asked) +
                        " through " + it->second + "<rank>.pipe; PyTorch writes it to " + prefix +
                        "<rank> (read it with torchfrtrace)");
      }
      if (!absent.empty()) {
        notes.push_back("NCCL flight recorder: ranks " + RankRanges(absent) + " have no open " +
                        it->second +
                        "<rank>.pipe (no NCCL group yet, or TORCH_NCCL_TRACE_BUFFER_SIZE unset)");
      }
    }
    return notes;
  }

  void Finish(int code) {
    Event(code == 0 ? "torchelastic.worker.status.SUCCEEDED" : "torchelastic.worker.status.FAILED",
          "AGENT", {{"state", code == 0 ? "SUCCEEDED" : "FAILED"}, {"exit_code", code}});
    exit_code = code;
    phase = Phase::kDone;
    boost::system::error_code ec;
    signals.cancel(ec);
    kill_timer.cancel();
    // Nothing of the job is left to wait for: the event loop ends once these are gone.
    hang_watch.Stop();
    control_server.reset();
    file_timer.reset();
    // Posted: Finish may run inside the SIGCHLD handler.
    asio::post(io, [this] { children.reset(); });
    // crun's own files in its log directory end with the run: crun.pid says that a crun runs
    // (`crun stacks --log-dir`), the Python hook is for workers. What stays is what was logged
    // or reported. The directory is this crun's alone (mkdtemp), so nothing else is named here.
    std::error_code fs_ec;
    std::filesystem::remove(options.log_dir + "/crun.pid", fs_ec);
    if (!python_dir.empty()) std::filesystem::remove_all(python_dir, fs_ec);
    if (metrics_server) metrics_server->Stop();
    for (auto& w : workers) {
      w.heartbeat.reset();
      w.stacks.reset();
    }
    rdzv->Leave(code == 0 ? "done" : "exit code " + std::to_string(code));
  }

  asio::io_context& io;
  AgentOptions options;
  std::unique_ptr<Rendezvous> rdzv;
  metrics::Registry registry;
  std::unique_ptr<AgentMetrics> meters;  // null without options.metrics
  std::unique_ptr<metrics::HttpServer> metrics_server;
  std::chrono::steady_clock::time_point joined_at;  // of the rendezvous under way
  // The first failure or stop seen since the workers last started (recovery_seconds).
  std::optional<std::chrono::steady_clock::time_point> interrupted_at;
  std::unique_ptr<WorkerCgroup> cgroup;           // null where the machine gives crun none
  std::unique_ptr<AttemptCgroup> attempt_cgroup;  // the running attempt's, until its edge
  int attempts_started = 0;
  std::unique_ptr<ChildSignals> children;  // SIGCHLD
  std::unique_ptr<AttemptEdge> edge;       // the last attempt's end
  bool edge_clear = true;                  // nothing of the last attempt is left
  bool edge_stuck = false;                 // something of it outlived SIGKILL past its deadline
  std::unique_ptr<GroupGuard> guard;
  asio::signal_set signals;
  asio::steady_timer kill_timer;
  WorkerStreams streams;
  HangWatch hang_watch;
  std::unique_ptr<FileTimerServer> file_timer;
  std::unique_ptr<ControlServer> control_server;
  std::unique_ptr<OomWatch> oom;
  std::optional<StackTools> tools;
  std::string python_dir;                 // holds the hook's sitecustomize.py; empty: not written
  std::optional<HangReport> hang_report;  // this attempt's hang
  bool hang_gathering = false;            // a hang's stacks are being read, here and elsewhere
  bool wrote_run_files = false;
  // Who waits for the capture under way (ReadStacks).
  std::vector<std::function<void(const std::vector<RankStacks>&)>> stack_waiters;
  std::vector<Worker> workers;
  std::vector<FailureRecord> failures;
  GroupAssignment group;
  JobOutcome outcome;
  Phase phase = Phase::kWaiting;
  Next next = Next::kNone;
  int running = 0;
  int open_pumps = 0;
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
