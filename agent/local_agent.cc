// LocalAgent carries out the lifecycle's decisions (supervise/lifecycle.h): it turns the
// rendezvous's events, the workers' exits, their streams' ends, the attempt's edge, signals and
// hangs into lifecycle events, and the actions that come back into system calls. What to do
// next is never decided here.
#include "agent/local_agent.h"

#include <signal.h>
#include <unistd.h>

#include <deque>
#include <filesystem>

#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/spdlog.h>

#include "agent/failures/attempt_failures.h"
#include "agent/failures/report_format.h"
#include "agent/failures/report_publish.h"
#include "agent/frameworks/horovod_kv.h"
#include "agent/frameworks/port_reservation.h"
#include "agent/hangs/file_timer.h"
#include "agent/hangs/hang_responder.h"
#include "agent/hangs/stack_summary.h"
#include "agent/observe/run_presence.h"
#include "agent/observe/torchelastic_events.h"
#include "agent/workers/attempt_start.h"
#include "agent/workers/worker_group.h"
#include "base/fd_writer.h"
#include "base/host_addresses.h"
#include "base/security.h"
#include "metrics/endpoint.h"
#include "proto/protocol_version.h"

namespace crun::agent {
namespace {

namespace asio = boost::asio;
namespace lc = lifecycle;

std::string DirectoryOf(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
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
        workers(io_, options),
        failures(options.host_name),
        events(options.torchelastic_events, options.host_name),
        presence(io_, options.log_dir, options.interpreter),
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

  // The workers' processes (cgroup, guard, SIGCHLD), the hang tools and metrics.
  Status Prepare() {
    if (auto s = workers.Prepare(); !s.ok()) return s;
    if (!options.warm_modules.empty()) StartWarm();
    if (auto s = PrepareFileTimer(); !s.ok()) return s;
    return StartMetrics();
  }

  // --warm: the template gets the workers' interpreter and the environment every worker
  // shares (crun's, with the hook's directory on PYTHONPATH), so that what the imports read
  // from it (OMP_NUM_THREADS) is what a cold worker's would.
  void StartWarm() {
    presence.WritePythonHook();
    Environment env = CurrentEnvironment();
    HangChannels hook;
    hook.python_dir = presence.python_dir();
    AddHangChannels(hook, env);
    const std::string dir = options.log_dir + "/warm";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    workers.StartWarm({options.command[0], options.command, options.warm_modules, dir,
                       dir + "/template.log", ToEnvp(env)});
  }

  // The /metrics endpoint, when asked for; an error names its address.
  Status StartMetrics() {
    if (!options.metrics) return Status::Ok();
    registry.OnScrape([this] { RefreshMetrics(); });
    auto started =
        metrics::ServeMetrics(io, *options.metrics, [this] { return registry.Render(); });
    if (!started.ok()) return started.status();
    metrics_server = std::move(started).value();
    FdWriter::Stderr().Write("crun: metrics on " + metrics_server->url() + "\n");
    return Status::Ok();
  }

  // What the page shows of the workers' states, read at each scrape.
  void RefreshMetrics() {
    const bool stopping = state.phase == lc::Phase::kStopping;
    meters->workers_running->Set(stopping ? 0 : workers.running());
    meters->workers_stopping->Set(stopping ? workers.running() : 0);
    meters->workers_exited->Set(workers.exited());
  }

  // Starts the file-timer server (before any worker, which gets its pipe).
  Status PrepareFileTimer() {
    if (!options.file_timer) return Status::Ok();
    const std::string path =
        options.timer_file.empty() ? options.log_dir + "/timer.pipe" : options.timer_file;
    auto server = FileTimerServer::Open(
        io, path,
        [this](pid_t pid) {
          if (Worker* w = workers.OfPid(pid)) ++*w->progress;
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
    reserved = PortReservation();
    if (const int n = PortLayout(options.contracts, options.nproc).count(); n > 0) {
      auto r = PortReservation::Reserve(n);
      if (r.ok()) {
        reserved = std::move(r).value();
      } else {  // the workers' start then fails naming the missing ports
        spdlog::error("cannot reserve {} ports for --contract {}: {}", n,
                      options.contracts.ToString(), r.status().message());
      }
    }
    rdzv->Join(reserved.ports());
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
    failures.Clear();
    presence.WritePythonHook();
    workers.WhenReadyToStart([this, n = a.attempt] { StartAttempt(n); });
  }

  // The workers of attempt `n`; the lifecycle hears how each start went.
  void StartAttempt(int n) {
    ServeHorovod();
    reserved.Release();  // the workers bind these ports themselves
    AttemptStartContext c;
    c.group = group;
    c.base = CurrentEnvironment();
    c.python_dir = presence.python_dir();
    if (file_timer) c.timer_file = file_timer->path();
    c.on_exit = [this, n](int lr, ExitStatus s) { Feed(lc::OnWorkerExit(state, n, lr, s, Now())); };
    c.on_stream_closed = [this, n](int lr) { Feed(lc::OnStreamClosed(state, n, lr, Now())); };
    std::vector<lc::Launch> launches;
    for (auto& s : workers.Start(n, std::move(c), streams)) {
      const int lr = s.launch.local_rank;
      if (s.launch.started) {
        hang_watch.Watch(lr, workers.at(lr).pid, workers.at(lr).progress);
      } else {
        if (meters) meters->Exit(kExitLaunch);
        failures.LaunchFailed(group.base_rank + lr, lr, s.launch.code, s.why);
      }
      launches.push_back(s.launch);
    }
    Feed(lc::OnLaunched(state, n, launches, Now()));
  }

  // --contract horovod: group rank 0 (with one crun per Slurm task, its local rank 0's) serves
  // the round's HTTP rendezvous (agent/frameworks/horovod_kv.h), fresh for every round, on the port
  // it reserved; only the round's nodes may connect where their addresses are known.
  void ServeHorovod() {
    horovod.reset();
    horovod_kv.reset();
    const ContractSet& c = options.contracts;
    if (!c.Has(Contract::kHorovod) || group.group_rank != 0 || options.first_local_rank != 0 ||
        group.members.empty()) {
      return;
    }
    http::HttpServerOptions o;
    o.name = "Horovod's rendezvous";
    o.bound_fd = reserved.Take(*PortLayout(c, options.nproc).Horovod()).release();
    if (o.bound_fd < 0) return;  // none reserved: the workers' start says so
    o.max_connections = static_cast<std::size_t>(group.world_size) * 2 + 16;
    o.io_timeout = std::chrono::seconds(30);
    o.body_limit = 1 << 20;
    std::vector<std::vector<std::string>> members;
    for (const auto& m : group.members) {
      members.push_back(IsIpLiteral(m.address) ? std::vector<std::string>{m.address}
                                               : std::vector<std::string>{});
    }
    o.allowed_peers = RoundAllowList(members, /*with_loopback=*/true);
    horovod_kv = std::make_unique<HorovodKv>(HorovodKv::ScopeSizes(group), HorovodKv::Limits{});
    auto served =
        http::HttpServer::Serve(io, o, [kv = horovod_kv.get()](const http::HttpRequest& r) {
          return kv->Handle(r);
        });
    if (!served.ok()) {  // the workers' hvd.init() then fails, naming the address
      spdlog::error("cannot serve Horovod's rendezvous: {}", served.status().message());
      return;
    }
    horovod = std::move(served).value();
    spdlog::info("Horovod's rendezvous for round {} on port {}", group.round, horovod->port());
  }

  void Carry(const lc::WaitAsSpare& a) {
    group = offered;
    NoteRound();
    spdlog::info("round {}: this node is a spare (the round is full); waiting", a.round);
  }

  void Carry(const lc::AttemptStarted&) {
    nlohmann::json pids = nlohmann::json::array();
    for (const auto& w : workers.workers()) pids.push_back(w.pid);
    events.Emit("torchelastic.worker.status.HEALTHY", "AGENT",
                {{"state", "HEALTHY"},
                 {"round", group.round},
                 {"world_size", group.world_size},
                 {"first_rank", group.base_rank + options.first_local_rank},
                 {"pids", pids}},
                group);
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
    workers.Exited(a.local_rank, a.exit);
    Worker& w = workers.at(a.local_rank);
    hang_watch.Forget(a.local_rank);
    events.WorkerStatus(w, a.exit.success() ? "SUCCEEDED" : "FAILED", group);
    const bool hang_end = a.record == lc::WorkerExited::Record::kHangEnd;
    bool oom_kill = false;
    if (hang_end) {
      failures.HangEnded(w, a.exit);
    } else if (a.record == lc::WorkerExited::Record::kFailure) {
      const bool oom_witness = a.exit.signaled && a.exit.value == SIGKILL;
      const report::WorkerFailure& f = failures.Exited(w, group.base_rank + w.local_rank, a.exit,
                                                       oom_witness ? workers.OomKillOf(w.pid) : "");
      oom_kill = !f.oom.empty();
      if (a.stops_group) {
        if (!interrupted_at) interrupted_at = Now();
        spdlog::warn(
            "rank {} (local rank {}, pid {}) on {} failed with {}{}; stopping the other workers",
            f.rank, f.local_rank, f.pid, options.host_name, a.exit.Describe(),
            oom_kill ? ": " + f.oom : "");
      }
    }
    if (meters) meters->Exit(ExitCauseOf(a.exit, hang_end, oom_kill, a.stopping));
  }

  void Carry(const lc::RecordHang& a) {
    failures.Hung(workers.at(a.local_rank), group.base_rank + a.local_rank);
  }

  void Carry(const lc::ReportFailure&) { rdzv->ReportFailure(failures.report()); }

  void Carry(const lc::SignalWorkers& a) {
    if (a.why == lc::SignalWorkers::Why::kStop) hang_watch.Stop();
    workers.Signal(a, group.base_rank);
  }

  // Every worker has exited: end and reap whatever else the attempt started (which also
  // closes the last writers of the workers' output pipes) before anything else happens.
  void Carry(const lc::BeginEdge& a) {
    workers.BeginEdge(group.restart_count, [this, n = a.attempt](bool complete) {
      Feed(lc::OnEdgeDone(state, n, complete, Now()));
    });
  }

  void Carry(const lc::EndAttempt&) {
    if (horovod) horovod->Stop();  // the round's rendezvous ends with its workers
    streams.EndAttempt();
    hang_watch.Stop();
    if (file_timer) file_timer->Clear();
    workers.EndAttempt();
    failures.Complete([this](int lr) { return StderrTail(workers.at(lr)); });
  }

  void Carry(const lc::Restarting& a) {
    if (!interrupted_at) interrupted_at = Now();
    events.Emit("torchelastic.agent.restart", "AGENT",
                {{"reason", restart_reason}, {"spends_restart", a.spends_restart}}, group);
    if (a.spends_restart) {
      spdlog::warn("restarting the worker group (restart {} of at most {}): {}",
                   group.restart_count + 1, options.max_restarts, restart_reason);
    } else {
      spdlog::warn("re-forming the job: {}", restart_reason);
    }
  }

  void Carry(const lc::ReportSuccess&) { rdzv->ReportSuccess(); }

  void Carry(const lc::Join&) {
    failures.ClearRecords();
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
      for (const auto& w : workers.workers()) {
        if (w.pid <= 0) continue;
        how += (how.empty() ? "" : ", ") + std::string("rank ") +
               std::to_string(group.base_rank + w.local_rank) + " " + w.exit.Describe();
      }
      spdlog::warn("the workers stopped after {}: {}", SignalName(state.stopped_by_signal), how);
    } else if (a.how == How::kEdgeStuck) {
      if (!failures.report().failures.empty()) Report(failures.report());
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
    events.Emit("torchelastic.rendezvous.round", "AGENT",
                {{"round", group.round},
                 {"spare", group.spare},
                 {"group_world_size", group.group_world_size},
                 {"world_size", group.world_size},
                 {"master_addr", group.master_addr},
                 {"master_port", group.master_port}},
                group);
  }

  // ---- the job's end ----------------------------------------------------------------------

  void Conclude() {
    if (outcome.success) return;
    const auto& own = failures.report();
    if (!own.failures.empty() && outcome.root_node_id == rdzv->node_id()) {
      Report(own);  // this node's full report, the same root cause first
    } else if (!outcome.root_report.failures.empty()) {
      Report(outcome.root_report);
      FdWriter::Stderr().Write("crun: the job failed on node '" + outcome.root_node_id +
                               "': " + outcome.reason + "\n");
    } else {
      FdWriter::Stderr().Write("crun: the job failed: " + outcome.reason + "\n");
    }
  }

  void Report(const report::FailureReport& report) {
    ReportContext c;
    c.run_id = group.run_id;
    c.host = options.host_name;
    c.role = group.role;
    c.entrypoint = options.entrypoint;
    c.attempt = group.restart_count;
    c.max_restarts = options.max_restarts;
    c.interpreter = options.interpreter;
    c.hang = failures.HangBehind(report);
    PublishReport(c, report, options.log_dir, options.parent_error_file);
  }

  void Finish(int code) {
    events.Emit(code == 0 ? "torchelastic.worker.status.SUCCEEDED"
                          : "torchelastic.worker.status.FAILED",
                "AGENT", {{"state", code == 0 ? "SUCCEEDED" : "FAILED"}, {"exit_code", code}},
                group);
    boost::system::error_code ec;
    signals.cancel(ec);
    wake.cancel();
    // Nothing of the job is left to wait for: the event loop ends once these are gone.
    hang_watch.Stop();
    presence.Close();  // what stays is what was logged or reported
    file_timer.reset();
    workers.Close();
    if (metrics_server) metrics_server->Stop();
    if (horovod) horovod->Stop();
    rdzv->Leave(code == 0 ? "done" : "exit code " + std::to_string(code));
  }

  // ---- hangs (docs/hangs.md) --------------------------------------------------------------

  // What only matters once workers run, made right after the first ones started, off the path
  // to starting them: the OOM witnesses, the control socket (`crun stacks`) and crun.pid.
  void StartObservers() {
    workers.StartOomWatch();
    presence.Announce([this](const std::string& request, std::function<void(std::string)> reply) {
      OnControl(request, std::move(reply));
    });
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
    for (const auto& w : workers.workers()) {
      if (!w.running) continue;
      targets.push_back(
          {options.host_name, group.base_rank + w.local_rank, w.local_rank, w.pid, w.stacks.get()});
    }
    return targets;
  }

  void OnTimerExpired(pid_t pid, std::string cause) {
    Worker* w = workers.OfPid(pid);
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
    failures.NoteHang(std::move(h), when);
    Feed(lc::OnHang(state, attempt, hung, declared, Now()));
  }

  asio::io_context& io;
  AgentOptions options;
  std::unique_ptr<Rendezvous> rdzv;
  PortReservation reserved;  // this round's ports (--contract), until its workers start
  std::unique_ptr<HorovodKv> horovod_kv;  // --contract horovod on group rank 0: this round's
  std::unique_ptr<http::HttpServer> horovod;
  metrics::Registry registry;
  std::unique_ptr<AgentMetrics> meters;  // null without options.metrics
  std::unique_ptr<http::HttpServer> metrics_server;
  std::chrono::steady_clock::time_point joined_at;  // of the rendezvous under way
  // The first failure or stop seen since the workers last started (recovery_seconds).
  std::optional<std::chrono::steady_clock::time_point> interrupted_at;
  asio::signal_set signals;
  asio::steady_timer wake;  // the lifecycle's next tick (the end of a stop's grace)
  WorkerStreams streams;
  HangWatch hang_watch;
  HangResponder hangs;
  std::unique_ptr<FileTimerServer> file_timer;
  WorkerGroup workers;
  AttemptFailures failures;
  TorchelasticEvents events;
  RunPresence presence;
  GroupAssignment offered;     // the rendezvous's last assignment
  GroupAssignment group;       // the running attempt's
  std::string restart_reason;  // the rendezvous's last stop-and-rejoin
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
