// LocalAgent, actions out: each action of the lifecycle (supervise/lifecycle.h), carried out
// in system calls, rendezvous calls and the features' hooks. local_agent.cc feeds the events.
#include <spdlog/spdlog.h>

#include "agent/health/health_checks.h"
#include "agent/local_agent_impl.h"

namespace crun::agent {

namespace lc = lifecycle;

void LocalAgent::Impl::Carry(const lc::StartAttempt& a) {
  group = offered;
  features.Each([&](JobFeature& f) { f.OnRound(Now() - joined_at); });
  failures.Clear();
  presence.WritePythonHook();
  workers.WhenReadyToStart([this, n = a.attempt] { StartAttempt(n); });
}

// The workers of attempt `n`; the lifecycle hears how each start went.
void LocalAgent::Impl::StartAttempt(int n) {
  AttemptStartContext c;
  c.group = group;
  c.base = CurrentEnvironment();
  c.python_dir = presence.python_dir();
  c.python_sdk_dir = presence.python_sdk_dir();
  c.on_exit = [this, n](int lr, ExitStatus s) { Feed(lc::OnWorkerExit(state, n, lr, s, Now())); };
  c.on_stream_closed = [this, n](int lr) { Feed(lc::OnStreamClosed(state, n, lr, Now())); };
  c.progress = &progress;
  progress_before = progress.count();
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

void LocalAgent::Impl::Carry(const lc::WaitAsSpare& a) {
  group = offered;
  features.Each([&](JobFeature& f) { f.OnRound(Now() - joined_at); });
  spdlog::info("round {}: this node is a spare (the round is full); waiting", a.round);
}

void LocalAgent::Impl::Carry(const lc::AttemptStarted&) {
  features.Each([](JobFeature& f) { f.OnAttemptStarted(); });
  const int first = group.base_rank + options.first_local_rank;
  spdlog::info("round {} (restart {}): started {} workers, ranks {}..{} of {} (store {}:{})",
               group.round, group.restart_count, options.nproc, first, first + options.nproc - 1,
               group.world_size, group.master_addr, group.master_port);
}

void LocalAgent::Impl::Carry(const lc::WorkerExited& a) {
  using Record = lc::WorkerExited::Record;
  workers.Exited(a.local_rank, a.exit);
  Worker& w = workers.at(a.local_rank);
  if (w.heartbeat) w.heartbeat->Drain();  // what it wrote before it ended is heard first
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

void LocalAgent::Impl::Carry(const lc::RecordHang& a) {
  failures.Hung(workers.at(a.local_rank), group.base_rank + a.local_rank);
}

void LocalAgent::Impl::Carry(const lc::ReportFailure&) {
  report::FailureReport r = failures.report();
  r.before_progress = !AttemptProgressed();
  r.node_id = rdzv->node_id();  // whose: every backend sends it as it is
  features.Each([&](JobFeature& f) { f.OnFailureReported(r); });
  rdzv->ReportFailure(r);
}

// Whether the attempt had made progress by its first failure (docs/health.md): a step
// heartbeat from any local rank, or a run of at least --progress-after. Output is none: a
// banner printed before a failing import would hide the loop.
bool LocalAgent::Impl::AttemptProgressed() {
  for (const auto& w : workers.workers()) {
    if (w.heartbeat) w.heartbeat->Drain();
  }
  if (progress.count() > progress_before) return true;
  const auto end = first_failure.value_or(Now());
  return end - attempt_began >= options.progress_after;
}

void LocalAgent::Impl::Carry(const lc::SignalWorkers& a) {
  if (a.why == lc::SignalWorkers::Why::kStop) hangs.watch().Stop();
  workers.Signal(a, group.base_rank);
}

// Every worker has exited: end and reap whatever else the attempt started (which also closes
// the last writers of the workers' output pipes) before anything else happens.
void LocalAgent::Impl::Carry(const lc::BeginEdge& a) {
  workers.BeginEdge(group.restart_count, [this, n = a.attempt](bool complete) {
    Feed(lc::OnEdgeDone(state, n, complete, Now()));
  });
}

void LocalAgent::Impl::Carry(const lc::EndAttempt&) {
  features.Each([](JobFeature& f) { f.OnAttemptEnded(); });
  streams.EndAttempt();
  hangs.watch().Stop();
  workers.EndAttempt();
  failures.Complete([this](int lr) { return StderrTail(workers.at(lr)); });
}

void LocalAgent::Impl::Carry(const lc::Restarting& a) {
  restart.spends_restart = a.spends_restart;
  features.Each([&](JobFeature& f) { f.OnRestarting(restart); });
  if (a.spends_restart) {
    spdlog::warn("restarting the worker group (restart {} of at most {}): {}",
                 group.restart_count + 1, options.max_restarts, restart.reason);
  } else {
    spdlog::warn("re-forming the job: {}", restart.reason);
  }
}

void LocalAgent::Impl::Carry(const lc::ReportSuccess&) {
  features.Each([](JobFeature& f) { f.OnSucceeded(); });
  rdzv->ReportSuccess();
}

void LocalAgent::Impl::Carry(const lc::Join&) {
  failures.ClearRecords();
  JoinRendezvous();
}

void LocalAgent::Impl::Carry(const lc::Leave& a) {
  rdzv->Leave("crun on " + options.host_name + " received " + SignalName(a.signo));
}

// The one tail of a node that leaves the job to be requeued without it (docs/health.md).
void LocalAgent::Impl::Carry(const lc::LeaveJob& a) {
  const auto& l = a.leaves;
  const std::string said =
      "this node (" + options.host_name + ") " +
      (l.why == lc::NodeLeaves::Why::kUnhealthy ? "failed its health check and does not join: "
                                                : "leaves the job: ") +
      l.detail;
  if (l.why == lc::NodeLeaves::Why::kUnhealthy) {
    rdzv->ReportUnhealthy(l.detail);
  } else {
    spdlog::error("crun: {}", said);
    rdzv->Leave("excluded: " + l.detail);
  }
  NoteUnhealthyNode(options.unhealthy_nodes_file, options.host_name);
  outcome = JobOutcome{};
  outcome.exit_code = l.exit_code;
  outcome.reason = said;
  outcome.root_node_id = rdzv->node_id();
}

void LocalAgent::Impl::Carry(const lc::Say& a) {
  spdlog::log(a.level == lc::Say::Level::kInfo ? spdlog::level::info : spdlog::level::warn, "{}",
              a.text);
}

void LocalAgent::Impl::Carry(const lc::Finish& a) {
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

// What the job's end publishes, for this node's attempt.
JobEnd LocalAgent::Impl::End() const {
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

void LocalAgent::Impl::Finish(int code) {
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

}  // namespace crun::agent
