// LocalAgent carries out the lifecycle's decisions (supervise/lifecycle.h): it turns the
// rendezvous's events, the workers' exits, their streams' ends, the attempt's edge, signals and
// hangs into lifecycle events, and the actions that come back into system calls. What to do
// next is never decided here. Whatever else a job has is a feature (features/job_feature.h):
// each hears of rounds, attempts and exits through its hooks.
#include "agent/local_agent.h"

#include <signal.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>

#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/spdlog.h>

#include "agent/failures/report_publish.h"
#include "agent/health/health_checks.h"
#include "agent/workers/attempt_hangs.h"

namespace crun::agent {
namespace {

namespace asio = boost::asio;
namespace lc = lifecycle;
StreamOptions StreamOptionsOf(const AgentOptions& o, const JobFeatures& features) {
  StreamOptions s{o.redirects,      o.tees,           o.console_ranks, o.prefix_template,
                  o.stdout_filters, o.stderr_filters, o.host_name,     o.hang_timeout.count() > 0};
  features.Each([&](JobFeature& f) { f.ConfigureStreams(s); });
  return s;
}

}  // namespace

struct LocalAgent::Impl final : RendezvousEvents {
  Impl(asio::io_context& io_, AgentOptions o, std::unique_ptr<Rendezvous> r,
       const std::vector<FeatureFactory>& factories)
      : io(io_),
        options(std::move(o)),
        rdzv(std::move(r)),
        registry(options.metrics ? std::make_unique<metrics::Registry>() : nullptr),
        meters(registry ? std::make_unique<AgentMetrics>(*registry, MetricLabels()) : nullptr),
        state(lc::Initial({options.first_local_rank, options.nproc, options.shutdown_timeout})),
        view{io_,
             options,
             group,
             state,
             workers,
             *rdzv,
             presence,
             reserved,
             hangs,
             registry.get(),
             meters.get(),
             steps,
             [this](const std::string& why) { ExcludeNode(why); },
             [this](int lr, const std::string& why) { FailRank(lr, why); }},
        features(factories, view),
        streams(io_, StreamOptionsOf(options, features)),
        signals(io_),
        wake(io_),
        workers(io_, options),
        failures(options.host_name),
        presence(io_, options.log_dir, options.interpreter),
        hangs(io_, options, workers, *rdzv, state, group,
              [this](int attempt, std::vector<int> hung, HangReport h,
                     std::chrono::system_clock::time_point when,
                     std::chrono::steady_clock::time_point declared) {
                failures.NoteHang(std::move(h), when);
                Feed(lc::OnHang(state, attempt, hung, declared, Now()));
              }) {
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

  // The workers' processes (cgroup, guard, SIGCHLD), then every feature.
  Status Prepare() {
    if (auto s = workers.Prepare(); !s.ok()) return s;
    return features.Prepare();
  }

  void ArmSignals() {
    signals.async_wait([this](const boost::system::error_code& ec, int signo) {
      if (ec) return;
      Feed(lc::OnSignal(state, signo, Now()));
      if (state.phase != lc::Phase::kDone) ArmSignals();
    });
  }

  // Joins, after the health gate when there is one (docs/health.md).
  void JoinRendezvous() {
    joined_at = Now();
    if (options.health.checks.empty()) return JoinNow();
    gate = RunHealthGate(io, workers.children(), options.health,
                         [this](HealthVerdict v) { HealthChecked(std::move(v)); });
  }

  void JoinNow() {
    reserved = ReserveContractPorts(options.contracts, options.nproc);
    rdzv->Join(reserved.ports());
  }

  void HealthChecked(HealthVerdict v) {
    gate.reset();
    if (meters) meters->HealthChecked(v.ok(), v.took);
    if (state.phase == lc::Phase::kDone) return;
    if (v.ok()) return JoinNow();
    const std::string why = "this node (" + options.host_name +
                            ") failed its health check and does not join: " + v.Describe();
    rdzv->ReportUnhealthy(v.Describe());
    NoteUnhealthyNode(options.unhealthy_nodes_file, options.host_name);
    outcome = JobOutcome{};
    outcome.exit_code = report::kExitRequeueWithoutNode;
    outcome.reason = why;
    outcome.root_node_id = rdzv->node_id();
    Feed(lc::OnFinished(state, lc::Outcome{false, report::kExitRequeueWithoutNode}, Now()));
  }

  // AgentView::exclude_node: this node leaves a running job (docs/health.md).
  void ExcludeNode(const std::string& why) {
    if (state.phase == lc::Phase::kDone || excluded) return;
    excluded = true;
    const std::string said = "this node (" + options.host_name + ") leaves the job: " + why;
    spdlog::error("crun: {}", said);
    rdzv->Leave("excluded: " + why);
    NoteUnhealthyNode(options.unhealthy_nodes_file, options.host_name);
    outcome = JobOutcome{};
    outcome.exit_code = report::kExitRequeueWithoutNode;
    outcome.reason = said;
    outcome.root_node_id = rdzv->node_id();
    Feed(lc::OnFinished(state, lc::Outcome{false, report::kExitRequeueWithoutNode}, Now()));
  }

  // AgentView::fail_rank: a running rank crun judged failed (docs/health.md).
  void FailRank(int lr, const std::string& why) {
    if (state.phase != lc::Phase::kRunning) return;  // stopping already, or not started
    const bool running =
        std::any_of(state.workers.begin(), state.workers.end(), [&](const auto& w) {
          return w.local_rank == lr && w.state == lc::Worker::State::kRunning;
        });
    if (!running) return;
    const Worker* w = &workers.at(lr);
    spdlog::error(
        "crun: rank {} (local rank {}, pid {}) on {} is slow: {}; stopping the group to restart "
        "it (--straggler-action restart)",
        group.base_rank + lr, lr, w->pid, options.host_name, why);
    failures.NoteSlow(lr, why, std::chrono::system_clock::now());
    Feed(lc::OnHang(state, state.attempt, {lr}, Now(), Now()));
  }

  static std::chrono::steady_clock::time_point Now() { return std::chrono::steady_clock::now(); }

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
    features.Each([&](JobFeature& f) { f.OnRound(Now() - joined_at); });
    failures.Clear();
    presence.WritePythonHook();
    workers.WhenReadyToStart([this, n = a.attempt] { StartAttempt(n); });
  }

  // The workers of attempt `n`; the lifecycle hears how each start went.
  void StartAttempt(int n) {
    AttemptStartContext c;
    c.group = group;
    c.base = CurrentEnvironment();
    c.python_dir = presence.python_dir();
    c.python_sdk_dir = presence.python_sdk_dir();
    c.on_exit = [this, n](int lr, ExitStatus s) { Feed(lc::OnWorkerExit(state, n, lr, s, Now())); };
    c.on_stream_closed = [this, n](int lr) { Feed(lc::OnStreamClosed(state, n, lr, Now())); };
    c.steps = steps;
    steps_before = *steps;
    attempt_began = Now();
    first_failure.reset();
    features.Each([&](JobFeature& f) { f.BeforeStart(c); });
    reserved.Release();  // the workers bind these ports themselves
    const auto starts = workers.Start(n, std::move(c), streams);
    std::vector<lc::Launch> launches;
    for (const auto& s : starts) {
      const int lr = s.launch.local_rank;
      if (s.launch.started) {
        hangs.watch().Watch(lr, workers.at(lr).pid, workers.at(lr).progress);
      } else {
        failures.LaunchFailed(group.base_rank + lr, lr, s.launch.code, s.why);
      }
      launches.push_back(s.launch);
    }
    features.Each([&](JobFeature& f) { f.OnLaunched(starts); });
    Feed(lc::OnLaunched(state, n, launches, Now()));
  }

  void Carry(const lc::WaitAsSpare& a) {
    group = offered;
    features.Each([&](JobFeature& f) { f.OnRound(Now() - joined_at); });
    spdlog::info("round {}: this node is a spare (the round is full); waiting", a.round);
  }

  void Carry(const lc::AttemptStarted&) {
    features.Each([](JobFeature& f) { f.OnAttemptStarted(); });
    const int first = group.base_rank + options.first_local_rank;
    spdlog::info("round {} (restart {}): started {} workers, ranks {}..{} of {} (store {}:{})",
                 group.round, group.restart_count, options.nproc, first, first + options.nproc - 1,
                 group.world_size, group.master_addr, group.master_port);
  }

  void Carry(const lc::WorkerExited& a) {
    using Record = lc::WorkerExited::Record;
    workers.Exited(a.local_rank, a.exit);
    Worker& w = workers.at(a.local_rank);
    hangs.watch().Forget(a.local_rank);
    WorkerEnd end{w, a.exit, a.record == Record::kHangEnd, a.stopping};
    if (end.hung) {
      failures.HangEnded(w, a.exit);
    } else if (a.record == Record::kFailure) {
      end.failure =
          &failures.Exited(w, group.base_rank + w.local_rank, a.exit, features.KillerOf(w, a.exit));
      end.stops_group = a.stops_group;
      if (!first_failure) first_failure = Now();
    }
    features.Each([&](JobFeature& f) { f.OnWorkerExited(end); });
    if (end.stops_group) WarnStopping(*end.failure, a.exit, options.host_name, options.nproc);
  }

  void Carry(const lc::RecordHang& a) {
    failures.Hung(workers.at(a.local_rank), group.base_rank + a.local_rank);
  }

  void Carry(const lc::ReportFailure&) {
    report::FailureReport r = failures.report();
    r.before_progress = !AttemptProgressed();
    rdzv->ReportFailure(r);
  }

  // Whether the attempt had made progress by its first failure (docs/health.md): a step
  // heartbeat from any local rank, or a run of at least --progress-after. Output is none: a
  // banner printed before a failing import would hide the loop.
  bool AttemptProgressed() {
    for (const auto& w : workers.workers()) {
      if (w.heartbeat) w.heartbeat->Drain();
    }
    if (*steps > steps_before) return true;
    const auto end = first_failure.value_or(Now());
    return end - attempt_began >= options.progress_after;
  }

  void Carry(const lc::SignalWorkers& a) {
    if (a.why == lc::SignalWorkers::Why::kStop) hangs.watch().Stop();
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
    features.Each([](JobFeature& f) { f.OnAttemptEnded(); });
    streams.EndAttempt();
    hangs.watch().Stop();
    workers.EndAttempt();
    failures.Complete([this](int lr) { return StderrTail(workers.at(lr)); });
  }

  void Carry(const lc::Restarting& a) {
    features.Each([&](JobFeature& f) { f.OnRestarting(restart_reason, a.spends_restart); });
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
    spdlog::log(a.level == lc::Say::Level::kInfo ? spdlog::level::info : spdlog::level::warn, "{}",
                a.text);
  }

  void Carry(const lc::Finish& a) {
    using How = lc::Finish::How;
    if (a.how == How::kSignal) {
      spdlog::warn("the workers stopped after {}: {}", SignalName(state.stopped_by_signal),
                   workers.DescribeExits(group.base_rank));
    } else if (a.how == How::kEdgeStuck) {
      if (!failures.report().failures.empty()) PublishFailures(End(), failures.report());
    } else if (a.how == How::kOutcome) {
      PublishOutcome(End(), outcome);
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

  void OnStacksRequest(std::uint64_t id, const std::string& reason) override {
    hangs.AnswerStacksRequest(id, reason);
  }

  // ---- the job's end ----------------------------------------------------------------------

  // What the job's end publishes, for this node's attempt.
  JobEnd End() const {
    const ReportContext c{.run_id = group.run_id,
                          .host = options.host_name,
                          .role = group.role,
                          .entrypoint = options.entrypoint,
                          .attempt = group.restart_count,
                          .max_restarts = options.max_restarts,
                          .interpreter = options.interpreter,
                          .hang = nullptr};
    return {c, failures, rdzv->node_id(), options.log_dir, options.parent_error_file};
  }

  void Finish(int code) {
    if (gate) gate->Cancel();
    features.Each([code](JobFeature& f) { f.OnFinish(code); });
    boost::system::error_code ec;
    signals.cancel(ec);
    wake.cancel();
    // Nothing of the job is left to wait for: the event loop ends once these are gone.
    hangs.watch().Stop();
    presence.Close();  // what stays is what was logged or reported
    workers.Close();
    rdzv->Leave(code == 0 ? "done" : "exit code " + std::to_string(code));
  }

  // The metrics' labels: this node is the rendezvous's node id.
  AgentMetricLabels MetricLabels() const {
    AgentMetricLabels labels = options.metric_labels;
    labels.node = rdzv->node_id();
    return labels;
  }

  asio::io_context& io;
  AgentOptions options;
  std::unique_ptr<Rendezvous> rdzv;
  std::unique_ptr<metrics::Registry> registry;  // with --metrics-port
  std::unique_ptr<AgentMetrics> meters;
  // The job's step heartbeats and snapshot saves (AgentView::steps).
  ProgressCounter steps = std::make_shared<std::uint64_t>(0);
  PortReservation reserved;             // this round's ports (--contract), until its workers start
  std::shared_ptr<HealthGateRun> gate;  // the health gate under way, before a join
  bool excluded = false;                // this node left the running job (ExcludeNode)
  std::chrono::steady_clock::time_point joined_at;  // of the rendezvous under way
  GroupAssignment offered;                          // the rendezvous's last assignment
  GroupAssignment group;                            // the running attempt's
  lc::State state;
  AgentView view;  // names parts made after the features: see JobFeatures
  JobFeatures features;
  WorkerStreams streams;
  asio::signal_set signals;
  asio::steady_timer wake;  // the lifecycle's next tick (the end of a stop's grace)
  WorkerGroup workers;
  AttemptFailures failures;
  RunPresence presence;
  AttemptHangs hangs;
  std::string restart_reason;  // the rendezvous's last stop-and-rejoin
  // The running attempt's progress (crash loops): the job's steps when it began, its start,
  // and its first worker failure. `steps` is declared before the view.
  std::uint64_t steps_before = 0;
  std::chrono::steady_clock::time_point attempt_began;
  std::optional<std::chrono::steady_clock::time_point> first_failure;
  JobOutcome outcome;
  std::deque<lc::Action> queue;  // actions not yet carried out (Feed)
  bool carrying = false;
};

LocalAgent::LocalAgent(asio::io_context& io, AgentOptions options,
                       std::unique_ptr<Rendezvous> rendezvous,
                       const std::vector<FeatureFactory>& features)
    : impl_(std::make_unique<Impl>(io, std::move(options), std::move(rendezvous), features)) {}

LocalAgent::~LocalAgent() = default;

int LocalAgent::Run() { return impl_->Run(); }

}  // namespace crun::agent
