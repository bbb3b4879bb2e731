// LocalAgent, events in: it turns the rendezvous's events, the workers' exits, their streams'
// ends, the attempt's edge, signals and hangs into lifecycle events (supervise/lifecycle.h);
// agent_actions.cc carries out the actions that come back. What to do next is never decided
// here. Whatever else a job has is a feature (features/job_feature.h): each hears of joins,
// rounds, attempts and exits through its hooks.
#include <signal.h>

#include <algorithm>

#include <spdlog/spdlog.h>

#include "agent/local_agent_impl.h"

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

// The metrics' labels: this node is the rendezvous's node id.
AgentMetricLabels MetricLabels(const AgentOptions& o, const Rendezvous& r) {
  AgentMetricLabels labels = o.metric_labels;
  labels.node = r.node_id();
  return labels;
}

}  // namespace

LocalAgent::Impl::Impl(asio::io_context& io_, AgentOptions o, std::unique_ptr<Rendezvous> r,
                       const std::vector<FeatureFactory>& factories)
    : io(io_),
      options(std::move(o)),
      rdzv(std::move(r)),
      registry(options.metrics ? std::make_unique<metrics::Registry>() : nullptr),
      meters(registry ? std::make_unique<AgentMetrics>(*registry, MetricLabels(options, *rdzv))
                      : nullptr),
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
           progress,
           rdzv->stragglers(),
           [this](lc::NodeLeaves::Why why, const std::string& detail) {
             Feed(lc::OnNodeLeaves(state, {why, detail, report::kExitRequeueWithoutNode}, Now()));
           },
           [this](int lr, const std::string& why) { FailRank(lr, why); },
           outcome,
           [this](const std::string& ledger_json) { rdzv->ShareGoodput(ledger_json); },
           pages},
      features(factories, view),
      streams(io_, StreamOptionsOf(options, features)),
      signals(io_),
      wake(io_),
      workers(io_, options),
      failures(options.host_name),
      presence(io_, options.log_dir, options.interpreter),
      hangs(io_, options, workers, *rdzv, state, group, progress,
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

// The workers' processes (cgroup, guard, SIGCHLD), then every feature; then the first join.
int LocalAgent::Impl::Run() {
  Status prepared = workers.Prepare();
  if (prepared.ok()) prepared = features.Prepare();
  if (!prepared.ok()) {
    spdlog::error("{}", prepared.message());
    return 1;
  }
  for (int s : options.forward_signals) signals.add(s);
  ArmSignals();
  rdzv->Start(this);
  JoinRendezvous();
  io.run();
  return state.exit_code;
}

void LocalAgent::Impl::ArmSignals() {
  signals.async_wait([this](const boost::system::error_code& ec, int signo) {
    if (ec) return;
    Feed(lc::OnSignal(state, signo, Now()));
    if (state.phase != lc::Phase::kDone) ArmSignals();
  });
}

// Joins once every feature that holds the join (the health gate) has passed.
void LocalAgent::Impl::JoinRendezvous() {
  joined_at = Now();
  features.BeforeJoin([this] {
    if (state.phase == lc::Phase::kDone) return;
    reserved = ReserveContractPorts(options.contracts, options.nproc);
    features.Each([](JobFeature& f) { f.OnJoining(); });
    rdzv->Join(reserved.ports());
  });
}

// AgentView::fail_rank: a running rank crun judged failed (docs/health.md).
void LocalAgent::Impl::FailRank(int lr, const std::string& why) {
  if (state.phase != lc::Phase::kRunning) return;  // stopping already, or not started
  const bool running = std::any_of(state.workers.begin(), state.workers.end(), [&](const auto& w) {
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

void LocalAgent::Impl::Feed(lc::Transition t) {
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

// ---- rendezvous events ----------------------------------------------------------------------

void LocalAgent::Impl::OnAssignment(const GroupAssignment& g) {
  offered = g;
  Feed(lc::OnAssignment(state, g.round, g.spare, Now()));
}

void LocalAgent::Impl::OnStopAndRejoin(const StopNotice& stop) {
  restart = stop;
  Feed(lc::OnStopAndRejoin(state, stop.spends_restart, Now()));
}

void LocalAgent::Impl::OnFinished(const JobOutcome& o) {
  if (state.phase == lc::Phase::kDone) return;
  outcome = o;
  Feed(lc::OnFinished(state, lc::Outcome{o.success, o.exit_code}, Now()));
}

void LocalAgent::Impl::OnStacksRequest(std::uint64_t id, const std::string& reason) {
  hangs.AnswerStacksRequest(id, reason);
}

LocalAgent::LocalAgent(asio::io_context& io, AgentOptions options,
                       std::unique_ptr<Rendezvous> rendezvous,
                       const std::vector<FeatureFactory>& features)
    : impl_(std::make_unique<Impl>(io, std::move(options), std::move(rendezvous), features)) {}

LocalAgent::~LocalAgent() = default;

int LocalAgent::Run() { return impl_->Run(); }

}  // namespace crun::agent
