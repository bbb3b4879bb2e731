// LocalAgent carries out the lifecycle's decisions (supervise/lifecycle.h): it turns the
// rendezvous's events, the workers' exits, their streams' ends, the attempt's edge, signals and
// hangs into lifecycle events, and the actions that come back into system calls. What to do
// next is never decided here.
#include "agent/local_agent.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <deque>
#include <filesystem>

#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/spdlog.h>

#include "base/files.h"

#include "agent/attempt_start.h"
#include "agent/control_socket.h"
#include "agent/failure_report.h"
#include "agent/hangs/file_timer.h"
#include "agent/hangs/hang_responder.h"
#include "agent/report_writer.h"
#include "agent/supervise/attempt_edge.h"
#include "agent/supervise/oom.h"
#include "agent/supervise/worker_cgroup.h"
#include "base/proc.h"
#include "proto/protocol_version.h"

namespace crun::agent {
namespace {

namespace asio = boost::asio;
namespace lc = lifecycle;

std::string DirectoryOf(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

std::string Joined(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& i : items) s += (s.empty() ? "" : ", ") + i;
  return s;
}

// Whether `pid` is stopped (SIGSTOP, SIGTSTP, a tracer).
bool IsStopped(pid_t pid) {
  const std::optional<char> state = ProcessState(pid);
  return state == 'T' || state == 't';
}

std::unique_ptr<AgentMetrics> MetersFor(metrics::Registry& registry, const AgentOptions& o,
                                        const Rendezvous& r) {
  if (!o.metrics) return nullptr;
  AgentMetricLabels labels = o.metric_labels;
  labels.node = r.node_id();
  return std::make_unique<AgentMetrics>(registry, labels);
}

StreamOptions StreamOptionsOf(const AgentOptions& o, AgentMetrics* m) {
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

HangResponderOptions HangOptionsOf(const AgentOptions& o) {
  return {o.host_name,
          o.entrypoint,
          o.log_dir,
          o.hang_timeout,
          o.stack_deadline,
          o.tool_path,
          o.command.empty() ? "" : DirectoryOf(o.command[0])};
}

lc::Settings LifecycleSettings(const AgentOptions& o) {
  return {o.first_local_rank, o.nproc, o.shutdown_timeout};
}

}  // namespace

struct LocalAgent::Impl final : RendezvousEvents {
  Impl(asio::io_context& io_, AgentOptions o, std::unique_ptr<Rendezvous> r)
      : io(io_),
        options(std::move(o)),
        rdzv(std::move(r)),
        meters(MetersFor(registry, options, *rdzv)),
        signals(io_),
        wake(io_),
        streams(io_, StreamOptionsOf(options, meters.get())),
        hang_watch(io_, options.hang_timeout,
                   [this](std::vector<WorkerProgress> p) { OnHang(std::move(p)); }),
        hangs(
            io_, HangOptionsOf(options), [this] { return StackTargets(); },
            [this](const std::string& why, std::chrono::milliseconds timeout,
                   std::function<void(RemoteStacks)> done) {
              rdzv->AskStacks(why, timeout, std::move(done));
            },
            [this](int attempt) { return Live(attempt); },
            [this](int attempt, HangReport h, std::chrono::system_clock::time_point when,
                   std::chrono::steady_clock::time_point declared) {
              OnHangReport(attempt, std::move(h), when, declared);
            }),
        state(lc::Initial(LifecycleSettings(options))) {
    if (options.forward_signals.empty()) {
      options.forward_signals = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
    }
  }

  // ---- running ----------------------------------------------------------------------------

  int Run() {
    if (auto s = Prepare(); !s.ok()) {
      spdlog::error("{}", s.message());
      return 1;
    }
    for (int s : options.forward_signals) signals.add(s);
    ArmSignals();
    rdzv->Start(this);
    JoinRendezvous();
    io.run();
    return state.exit_code;
  }

  // The workers' cgroup, the guard, the subreaper, SIGCHLD, the hang tools and metrics.
  Status Prepare() {
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
    if (!g.ok()) return g.status();
    guard = std::move(g).value();
    if (auto sub = BecomeSubreaper(); !sub.ok()) {
      spdlog::warn("{}: a worker's daemonised descendants may outlive the job", sub.message());
    }
    // Orphans that come to crun are reaped as they end; an attempt's edge looks again.
    auto child_signals = ChildSignals::Open(io, [this] {
      ReapOrphans();
      if (edge) edge->Notify();
    });
    if (!child_signals.ok()) return child_signals.status();
    children = std::move(child_signals).value();
    if (auto s = PrepareFileTimer(); !s.ok()) return s;
    return StartMetrics();
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
    const bool stopping = state.phase == lc::Phase::kStopping;
    meters->workers_running->Set(stopping ? 0 : alive);
    meters->workers_stopping->Set(stopping ? alive : 0);
    meters->workers_exited->Set(exited);
  }

  // Starts the file-timer server (before any worker, which gets its pipe).
  Status PrepareFileTimer() {
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

  void ArmSignals() {
    signals.async_wait([this](const boost::system::error_code& ec, int signo) {
      if (ec) return;
      Feed(lc::OnSignal(state, signo, Now()));
      if (state.phase != lc::Phase::kDone) ArmSignals();
    });
  }

  void JoinRendezvous() {
    joined_at = Now();
    rdzv->Join();
  }

  static std::chrono::steady_clock::time_point Now() { return std::chrono::steady_clock::now(); }

  // Whether `attempt` is the one whose workers run (or are being stopped).
  bool Live(int attempt) const { return lc::IsLive(state, attempt); }

  // ---- the lifecycle ----------------------------------------------------------------------

  // Takes the lifecycle's next state and carries out its actions, in order. An action may feed
  // another event (a start answers at once): its actions queue behind those under way.
  void Feed(lc::Transition t) {
    state = std::move(t.state);
    if (t.wake_at) {
      wake.expires_at(*t.wake_at);
      wake.async_wait([this](const boost::system::error_code& ec) {
        if (!ec) Feed(lc::OnTick(state, Now()));
      });
    } else {
      wake.cancel();
    }
    for (auto& a : t.actions) queue.push_back(std::move(a));
    if (carrying) return;
    carrying = true;
    while (!queue.empty()) {
      lc::Action a = std::move(queue.front());
      queue.pop_front();
      std::visit([this](auto& x) { Carry(x); }, a);
    }
    carrying = false;
  }

  void Carry(const lc::StartAttempt& a) {
    group = offered;
    NoteRound();
    records.clear();
    hang_report.reset();
    WriteRunFiles();
    edge.reset();
    OpenAttemptCgroup(a.attempt);
    AttemptStartContext c;
    c.group = group;
    c.base = CurrentEnvironment();
    if (attempt_cgroup) {
      c.cgroup_fd = attempt_cgroup->fd();
      c.cgroup_dir = attempt_cgroup->dir();
    }
    c.python_dir = python_dir;
    if (file_timer) c.timer_file = file_timer->path();
    c.on_exit = [this, n = a.attempt](int lr, ExitStatus s) {
      Feed(lc::OnWorkerExit(state, n, lr, s, Now()));
    };
    c.on_stream_closed = [this, n = a.attempt](int lr) {
      Feed(lc::OnStreamClosed(state, n, lr, Now()));
    };
    std::vector<lc::Launch> launches;
    for (auto& s : StartWorkers(io, options, c, streams, workers)) {
      if (s.launch.started) {
        Worker& w = WorkerAt(s.launch.local_rank);
        guard->Add(w.pid);
        hang_watch.Watch(w.local_rank, w.pid, w.progress);
      } else {
        LaunchFailed(s.launch.local_rank, s.launch.code, s.why);
      }
      launches.push_back(s.launch);
    }
    Feed(lc::OnLaunched(state, a.attempt, launches, Now()));
  }

  void Carry(const lc::WaitAsSpare& a) {
    group = offered;
    NoteRound();
    spdlog::info("round {}: this node is a spare (the round is full); waiting", a.round);
  }

  void Carry(const lc::AttemptStarted&) {
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
        meters->recovery->Observe(std::chrono::duration<double>(Now() - *interrupted_at).count());
      }
    }
    interrupted_at.reset();
    spdlog::info("round {} (restart {}): started {} workers, ranks {}..{} of {} (store {}:{})",
                 group.round, group.restart_count, options.nproc,
                 group.base_rank + options.first_local_rank,
                 group.base_rank + options.first_local_rank + options.nproc - 1, group.world_size,
                 group.master_addr, group.master_port);
  }

  void Carry(const lc::WorkerExited& a) {
    Worker& w = WorkerAt(a.local_rank);
    w.running = false;
    w.exit = a.exit;
    hang_watch.Forget(a.local_rank);
    WorkerEvent(w, a.exit.success() ? "SUCCEEDED" : "FAILED");
    bool oom_kill = false;
    if (a.record == lc::WorkerExited::Record::kHangEnd) {
      if (FailureRecord* hung = HangRecordOf(a.local_rank)) {
        hung->exit = a.exit;
        hung->error = ReadErrorFile(w.error_file);
      }
    } else if (a.record == lc::WorkerExited::Record::kFailure) {
      oom_kill = RecordExit(w, a.exit, a.stops_group);
    }
    if (meters)
      meters->Exit(ExitCauseOf(a.exit, a.record == lc::WorkerExited::Record::kHangEnd, oom_kill,
                               a.stopping));
  }

  // A failed exit's record: how it ended, its error file, its last lines; true for an OOM
  // kill. `stops_group`: the first failure, which stops the others.
  bool RecordExit(Worker& w, ExitStatus exit, bool stops_group) {
    FailureRecord f = NewFailure(w.local_rank, exit);
    f.pid = w.pid;
    if (exit.signaled && exit.value == SIGKILL && oom) {
      if (auto kill = oom->Check(w.pid)) f.oom = kill->Describe();
    }
    f.error_file = w.error_file;
    f.error = ReadErrorFile(w.error_file);
    if (w.err_pump) w.err_pump->DrainAvailable();
    f.stderr_tail = StderrTail(w.local_rank);
    const std::string how = exit.Describe() + (f.oom.empty() ? "" : ": " + f.oom);
    const bool oom_kill = !f.oom.empty();
    records.push_back(std::move(f));
    if (stops_group) {
      if (!interrupted_at) interrupted_at = Now();
      spdlog::warn(
          "rank {} (local rank {}, pid {}) on {} failed with {}; stopping the other workers",
          group.base_rank + w.local_rank, w.local_rank, w.pid, options.host_name, how);
    }
    return oom_kill;
  }

  void Carry(const lc::RecordHang& a) {
    const Worker& w = WorkerAt(a.local_rank);
    FailureRecord f = NewFailure(a.local_rank, ExitStatus{true, SIGTERM});
    f.when = hang_when;
    f.pid = w.pid;
    f.error_file = w.error_file;
    if (hang_report) {
      for (const auto& r : hang_report->ranks) {
        if (r.local_rank == a.local_rank) f.hang = r.cause;
      }
    }
    if (f.hang.empty()) f.hang = "hung";
    records.push_back(std::move(f));
    std::stable_sort(records.begin(), records.end(),
                     [](const auto& x, const auto& y) { return x.when < y.when; });
  }

  void Carry(const lc::ReportFailure&) { rdzv->ReportFailure(records); }

  void Carry(const lc::SignalWorkers& a) {
    using Why = lc::SignalWorkers::Why;
    if (a.why == Why::kStop) hang_watch.Stop();
    for (int lr : a.local_ranks) {
      const Worker& w = WorkerAt(lr);
      if (!w.running) continue;
      if (a.why == Why::kGraceOver) {
        spdlog::warn("local rank {} (pid {}) still running {} ms after the stop signal: SIGKILL",
                     lr, w.pid, options.shutdown_timeout.count());
      }
      ::kill(-w.pid, a.signo);
      if (a.why == Why::kStop && IsStopped(w.pid)) {
        // A stopped process keeps the signal pending and would only meet SIGKILL at the end
        // of the grace: let it run, so that it can act on the signal now.
        spdlog::warn(
            "rank {} (pid {}) was stopped (SIGSTOP or a debugger): sending SIGCONT so that it "
            "can act on {}",
            group.base_rank + lr, w.pid, SignalName(a.signo));
        ::kill(-w.pid, SIGCONT);
      }
    }
  }

  // Every worker has exited: end and reap whatever else the attempt started (which also
  // closes the last writers of the workers' output pipes) before anything else happens.
  void Carry(const lc::BeginEdge& a) {
    std::vector<pid_t> groups;
    for (const auto& w : workers) {
      if (w.pid > 0) groups.push_back(w.pid);
    }
    edge =
        std::make_unique<AttemptEdge>(io, group.restart_count, std::move(groups),
                                      std::move(attempt_cgroup), options.edge_timeout,
                                      [this, n = a.attempt](const EdgeReport& r) { OnEdge(n, r); });
    edge->Start();
  }

  void Carry(const lc::EndAttempt&) {
    streams.EndAttempt();
    hang_watch.Stop();
    if (file_timer) file_timer->Clear();
    for (const auto& w : workers) {
      if (w.pid > 0) guard->Forget(w.pid);
    }
    std::stable_sort(records.begin(), records.end(),
                     [](const auto& a, const auto& b) { return a.when < b.when; });
    for (auto& f : records) {
      if (f.pid != 0) f.stderr_tail = StderrTail(f.local_rank);  // complete now
    }
  }

  void Carry(const lc::Restarting& a) {
    if (!interrupted_at) interrupted_at = Now();
    Event("torchelastic.agent.restart", "AGENT",
          {{"reason", restart_reason}, {"spends_restart", a.spends_restart}});
    if (a.spends_restart) {
      spdlog::warn("restarting the worker group (restart {} of at most {}): {}",
                   group.restart_count + 1, options.max_restarts, restart_reason);
    } else {
      spdlog::warn("re-forming the job: {}", restart_reason);
    }
  }

  void Carry(const lc::ReportSuccess&) { rdzv->ReportSuccess(); }

  void Carry(const lc::Join&) {
    records.clear();
    JoinRendezvous();
  }

  void Carry(const lc::Leave& a) {
    rdzv->Leave("crun on " + options.host_name + " received " + SignalName(a.signo));
  }

  void Carry(const lc::Say& a) {
    if (a.level == lc::Say::Level::kInfo) {
      spdlog::info("{}", a.text);
    } else {
      spdlog::warn("{}", a.text);
    }
  }

  void Carry(const lc::Finish& a) {
    using How = lc::Finish::How;
    if (a.how == How::kSignal) {
      std::string how;
      for (const auto& w : workers) {
        if (w.pid <= 0) continue;
        how += (how.empty() ? "" : ", ") + std::string("rank ") +
               std::to_string(group.base_rank + w.local_rank) + " " + w.exit.Describe();
      }
      spdlog::warn("the workers stopped after {}: {}", SignalName(state.stopped_by_signal), how);
    } else if (a.how == How::kEdgeStuck) {
      if (!records.empty()) Report(records);
    } else if (a.how == How::kOutcome) {
      Conclude();
    }
    Finish(a.exit_code);
  }

  // ---- rendezvous events ----------------------------------------------------------------

  void OnAssignment(const GroupAssignment& g) override {
    offered = g;
    Feed(lc::OnAssignment(state, g.round, g.spare, Now()));
  }

  void OnStopAndRejoin(const std::string& reason, bool spends_restart) override {
    restart_reason = reason;
    Feed(lc::OnStopAndRejoin(state, spends_restart, Now()));
  }

  void OnFinished(const JobOutcome& o) override {
    if (state.phase == lc::Phase::kDone) return;
    outcome = o;
    Feed(lc::OnFinished(state, lc::Outcome{o.success, o.exit_code}, Now()));
  }

  // The service asks for this node's stacks: for a hang on another node, which prints them
  // all, or for `crun stacks --rdzv-endpoint`. Read without stopping anything; for a hang,
  // also printed here and kept under the attempt's log directory.
  void OnStacksRequest(std::uint64_t id, const std::string& reason) override {
    if (state.phase != lc::Phase::kRunning) {
      return rdzv->ReplyStacks(id, options.host_name, {}, "no workers running");
    }
    const bool hang = reason != crun::kStacksCommandReason;
    if (hang) spdlog::warn("reading this node's stacks for another node: {}", reason);
    hangs.ReadStacks([this, id, reason, hang, n = state.attempt,
                      round = group.round](const std::vector<RankStacks>& s) {
      rdzv->ReplyStacks(id, options.host_name, s, "");
      if (hang && n == state.attempt) hangs.ShowForOtherNode(round, reason, s);
    });
  }

  // A round was assigned (or this node is its spare): its metrics and event.
  void NoteRound() {
    if (meters) {
      meters->last_rendezvous_time->Set(
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count());
      meters->last_rendezvous_duration->Set(
          std::chrono::duration<double>(Now() - joined_at).count());
    }
    Event("torchelastic.rendezvous.round", "AGENT",
          {{"round", group.round},
           {"spare", group.spare},
           {"group_world_size", group.group_world_size},
           {"world_size", group.world_size},
           {"master_addr", group.master_addr},
           {"master_port", group.master_port}});
  }

  // ---- the attempt's edge -------------------------------------------------------------------

  // This attempt's cgroup, below crun's: a new one for every attempt (AttemptEdge).
  void OpenAttemptCgroup(int attempt) {
    attempt_cgroup.reset();
    if (!cgroup) return;
    auto a = AttemptCgroup::Create(*cgroup, attempt);
    if (!a.ok()) {
      spdlog::warn("{}: this attempt's workers run without a cgroup of their own",
                   a.status().message());
      return;
    }
    attempt_cgroup = std::move(a).value();
  }

  void OnEdge(int attempt, const EdgeReport& r) {
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
    } else if (!r.remaining.empty()) {
      spdlog::warn("attempt {}: {}", r.attempt, Joined(r.remaining));
    }
    spdlog::debug("attempt {}: its edge took {} us", r.attempt, r.took.count());
    Feed(lc::OnEdgeDone(state, attempt, r.complete, Now()));
  }

  // ---- failures and the job's end ---------------------------------------------------------

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
    if (meters) meters->Exit(kExitLaunch);
    FailureRecord f = NewFailure(lr, ExitStatus{false, code});
    f.stderr_tail = {why};
    records.push_back(std::move(f));
  }

  void Conclude() {
    if (outcome.success) return;
    const bool mine = !records.empty() && outcome.root_node_id == rdzv->node_id();
    if (mine) {
      Report(records);  // this node's full report, the same root cause first
    } else if (!outcome.root_report.empty()) {
      Report(outcome.root_report);
      std::fprintf(stderr, "crun: the job failed on node '%s': %s\n", outcome.root_node_id.c_str(),
                   outcome.reason.c_str());
    } else {
      std::fprintf(stderr, "crun: the job failed: %s\n", outcome.reason.c_str());
    }
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

  void Finish(int code) {
    Event(code == 0 ? "torchelastic.worker.status.SUCCEEDED" : "torchelastic.worker.status.FAILED",
          "AGENT", {{"state", code == 0 ? "SUCCEEDED" : "FAILED"}, {"exit_code", code}});
    boost::system::error_code ec;
    signals.cancel(ec);
    wake.cancel();
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

  void WorkerEvent(const Worker& w, const char* st) {
    nlohmann::json m{{"state", st},
                     {"global_rank", group.base_rank + w.local_rank},
                     {"local_rank", w.local_rank},
                     {"worker_id", std::to_string(w.pid)},
                     {"exit", w.exit.Describe()}};
    Event(std::string("torchelastic.worker.status.") + st, "WORKER", std::move(m));
  }

  // ---- workers ----------------------------------------------------------------------------

  // The worker of local rank `lr` (one of this crun's).
  Worker& WorkerAt(int lr) {
    return workers[static_cast<std::size_t>(lr - options.first_local_rank)];
  }

  std::vector<std::string> StderrTail(int lr) {
    const auto& w = WorkerAt(lr);
    if (w.err_pump) return {w.err_pump->tail().begin(), w.err_pump->tail().end()};
    return FileTail(w.dir + "/stderr.log", 20);
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

  // ---- hangs (docs/hangs.md) --------------------------------------------------------------

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
    if (!WriteWholeFile(options.log_dir + "/crun.pid", std::to_string(::getpid()) + "\n")) {
      spdlog::warn("cannot write {}/crun.pid", options.log_dir);
    }
  }

  // Before the first worker starts (so that a run that never starts one leaves its log
  // directory empty): the Python hook, for Python workers only (crun chose their interpreter;
  // native workers' stacks are read by eu-stack or gdb).
  void WriteRunFiles() {
    if (wrote_run_files || options.interpreter.empty()) return;
    wrote_run_files = true;
    const std::string dir = options.log_dir + "/python";
    std::error_code ec;
    if (std::filesystem::create_directories(dir, ec);
        !ec && WriteWholeFile(dir + "/sitecustomize.py", PythonHookSource())) {
      python_dir = dir;
    } else {
      spdlog::warn("cannot write {}/sitecustomize.py: Python workers' stacks need py-spy", dir);
    }
  }

  // `crun stacks PID`: every running rank's stacks, read now, as JSON.
  void OnControl(const std::string& request, std::function<void(std::string)> reply) {
    auto error = [&](const std::string& why) { reply(nlohmann::json{{"error", why}}.dump()); };
    if (request != "stacks") return error("unknown request '" + request + "'");
    if (state.phase != lc::Phase::kRunning) {
      return error(state.phase == lc::Phase::kStopping
                       ? "the workers are being stopped"
                       : "no workers are running (waiting for the rendezvous)");
    }
    hangs.ReadStacks([this, reply](const std::vector<RankStacks>& stacks) {
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

  std::vector<StackTarget> StackTargets() {
    std::vector<StackTarget> targets;
    for (auto& w : workers) {
      if (!w.running) continue;
      targets.push_back(
          {options.host_name, group.base_rank + w.local_rank, w.local_rank, w.pid, w.stacks.get()});
    }
    return targets;
  }

  void OnTimerExpired(pid_t pid, std::string cause) {
    Worker* w = WorkerOfPid(pid);
    if (w == nullptr) {
      spdlog::warn("file timer: {}, but pid {} is not (or no longer) one of this crun's workers",
                   cause, pid);
      return;
    }
    if (state.phase == lc::Phase::kRunning) hang_watch.Expire(w->local_rank, std::move(cause));
  }

  // A hang was declared: read every rank's stacks while all still run (HangResponder).
  void OnHang(std::vector<WorkerProgress> progress) {
    if (state.phase != lc::Phase::kRunning) return;
    hangs.OnHang(HangAttempt{state.attempt, group.round, group.restart_count, group.base_rank,
                             group.run_id},
                 progress);
  }

  // The hang's report is complete: the lifecycle records the hung ranks and stops the group.
  void OnHangReport(int attempt, HangReport h, std::chrono::system_clock::time_point when,
                    std::chrono::steady_clock::time_point declared) {
    std::vector<int> hung;
    for (const auto& r : h.ranks) {
      if (r.hung) hung.push_back(r.local_rank);
    }
    hang_report = std::move(h);
    hang_when = when;
    Feed(lc::OnHang(state, attempt, hung, declared, Now()));
  }

  // The failure record of local rank `lr` that says it hung, if there is one.
  FailureRecord* HangRecordOf(int lr) {
    for (auto& f : records) {
      if (f.local_rank == lr && !f.hang.empty()) return &f;
    }
    return nullptr;
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
  std::unique_ptr<ChildSignals> children;         // SIGCHLD
  std::unique_ptr<AttemptEdge> edge;              // the last attempt's end
  std::unique_ptr<GroupGuard> guard;
  asio::signal_set signals;
  asio::steady_timer wake;  // the lifecycle's next tick (the end of a stop's grace)
  WorkerStreams streams;
  HangWatch hang_watch;
  HangResponder hangs;
  std::unique_ptr<FileTimerServer> file_timer;
  std::unique_ptr<ControlServer> control_server;
  std::unique_ptr<OomWatch> oom;
  std::string python_dir;                 // holds the hook's sitecustomize.py; empty: not written
  std::optional<HangReport> hang_report;  // this attempt's hang
  std::chrono::system_clock::time_point hang_when;  // when it was declared
  bool wrote_run_files = false;
  std::vector<Worker> workers;
  std::vector<FailureRecord> records;  // this attempt's failures, in full
  GroupAssignment offered;             // the rendezvous's last assignment
  GroupAssignment group;               // the running attempt's
  std::string restart_reason;          // the rendezvous's last stop-and-rejoin
  JobOutcome outcome;
  lc::State state;
  std::deque<lc::Action> queue;  // actions not yet carried out (Feed)
  bool carrying = false;
};

LocalAgent::LocalAgent(asio::io_context& io, AgentOptions options,
                       std::unique_ptr<Rendezvous> rendezvous)
    : impl_(std::make_unique<Impl>(io, std::move(options), std::move(rendezvous))) {}

LocalAgent::~LocalAgent() = default;

int LocalAgent::Run() { return impl_->Run(); }

}  // namespace crun::agent
