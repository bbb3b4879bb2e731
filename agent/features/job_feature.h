// A per-job feature of the agent: something that starts with the job and hears of its rounds,
// attempts and workers, such as the metrics endpoint, torchelastic's events, Horovod's
// rendezvous server, the file timer, the warm template, the control socket and the OOM
// witnesses. LocalAgent holds a list of them and calls each hook in the list's order. A
// feature decides nothing of the lifecycle (supervise/lifecycle.h): it observes, serves, and
// adds to what an attempt's start gets; where it notices something the lifecycle must hear (a
// worker's file timer expired), it tells the part of the agent that feeds the lifecycle.
//
// A feature may hold a join until it has passed (BeforeJoin: the health gate), and may end the
// job on this node through the lifecycle (AgentView::leave_job).
//
// Adding one (docs/architecture.md): a file in this folder with a JobFeature and its factory,
// and a line in features.cc's list. Single-threaded: every hook runs on the agent's event loop.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "agent/agent_options.h"
#include "agent/frameworks/port_reservation.h"
#include "agent/observe/agent_metrics.h"
#include "agent/observe/run_presence.h"
#include "agent/rendezvous/rendezvous.h"
#include "agent/supervise/lifecycle.h"
#include "agent/workers/attempt_hangs.h"
#include "agent/workers/job_progress.h"
#include "agent/workers/worker_group.h"
#include "base/status.h"
#include "metrics/endpoint.h"

namespace crun::agent {

// The agent as its features see it: what each may read, and the parts it may use. Valid for
// the feature's whole life.
struct AgentView {
  boost::asio::io_context& io;
  const AgentOptions& options;
  // The running attempt's assignment (or the last round's, for a spare).
  const GroupAssignment& group;
  const lifecycle::State& lifecycle;
  WorkerGroup& workers;
  const Rendezvous& rendezvous;
  RunPresence& presence;
  // The ports this node reserved at its join (--contract), held until the workers start.
  PortReservation& reserved_ports;
  // The running attempt's hang watch, and the one place stacks are read.
  AttemptHangs& hangs;
  // The node's metrics (observe/agent_metrics.h): null without --metrics-port. Served by the
  // metrics endpoint; every feature may count into them.
  metrics::Registry* registry = nullptr;
  AgentMetrics* meters = nullptr;
  // The job's progress (workers/job_progress.h): the workers' heartbeats and step records, and
  // a feature that sees a step done (a snapshot saved) tells it.
  JobProgress& progress;
  // Slow ranks judged job-wide (health/straggler_exchange.h): the rendezvous's exchange, or
  // null where this node judges its own ranks.
  StragglerExchange* stragglers = nullptr;
  // This node leaves the job (docs/health.md): unhealthy before a join, or excluded from the
  // running one. The lifecycle decides (lifecycle::OnNodeLeaves): the rendezvous hears it, the
  // workers stop, the host is noted in --unhealthy-nodes-file, and crun exits with
  // report::kExitRequeueWithoutNode.
  std::function<void(lifecycle::NodeLeaves::Why why, const std::string& detail)> leave_job;
  // crun stops local rank `local_rank` of the running attempt as failed for `why` (--straggler-
  // action restart, docs/health.md): like a hang without the stacks, the group stops, the
  // failure (report::WorkerFailure::slow) goes to the rendezvous and the restart is spent.
  std::function<void(int local_rank, const std::string& why)> fail_rank;
  // The job's outcome, once the rendezvous said it (read at OnFinish).
  const JobOutcome& outcome;
  // This node's goodput ledger to the rendezvous (Rendezvous::ShareGoodput).
  std::function<void(const std::string& ledger_json)> share_goodput;
  // Pages the metrics endpoint serves beside /metrics (with --metrics-port), by path: a
  // feature adds its own ("/goodput").
  metrics::Pages& pages;
};

// One worker's exit, as the agent recorded it.
struct WorkerEnd {
  const Worker& worker;
  ExitStatus exit;
  bool hung = false;         // crun found it hung and stopped it
  bool stopping = false;     // crun was stopping the group when it exited
  bool stops_group = false;  // its failure stops the other workers
  // The failure recorded for it; null when its exit is not one (a success, a stop).
  const report::WorkerFailure* failure = nullptr;
};

// The join under way, which a feature may hold until it has passed (JobFeature::BeforeJoin).
class JoinGate {
 public:
  struct Held;
  explicit JoinGate(std::shared_ptr<Held> held) : held_(std::move(held)) {}
  // Holds the join until the function returned is called, once. A feature that fails instead
  // (leave_job) never calls it: the join does not happen.
  std::function<void()> Hold();

 private:
  std::shared_ptr<Held> held_;
};

class JobFeature {
 public:
  virtual ~JobFeature() = default;

  // Once, before the first join; an error ends the job before any worker runs.
  virtual Status Prepare() { return Status::Ok(); }
  // Before each join (the first, and every rejoin): a feature that must pass first holds it.
  virtual void BeforeJoin(JoinGate&) {}
  // A feature held the join (after every BeforeJoin); OnJoining follows once it passes.
  virtual void OnJoinHeld() {}
  // The join is asked for now.
  virtual void OnJoining() {}
  // Once, before the workers' streams are made: a feature that reads their output says so.
  virtual void ConfigureStreams(StreamOptions&) {}
  // A round was assigned (or this node is its spare); `waited` since this node joined it.
  virtual void OnRound(std::chrono::steady_clock::duration /*waited*/) {}
  // The attempt's workers are about to start: what their start gets (a pipe, a variable).
  virtual void BeforeStart(AttemptStartContext&) {}
  // Each local rank's start, as it went.
  virtual void OnLaunched(const std::vector<WorkerStart>&) {}
  // The attempt's workers run.
  virtual void OnAttemptStarted() {}
  // What killed worker `w` (it ended with `exit`), where this feature witnessed it (the kernel's
  // OOM killer): the report's words; "" otherwise. The first feature that answers is taken.
  virtual std::string KillerOf(const Worker& /*w*/, const ExitStatus& /*exit*/) { return ""; }
  virtual void OnWorkerExited(const WorkerEnd&) {}
  // The attempt's failure goes to the rendezvous (its first failure is the root cause), or its
  // success: each heard just before the rendezvous is told.
  virtual void OnFailureReported(const report::FailureReport&) {}
  virtual void OnSucceeded() {}
  // The group is restarted or the job re-formed, as the rendezvous said (stop.reason, ...).
  virtual void OnRestarting(const StopNotice& /*stop*/) {}
  // The attempt's workers and everything they started are gone.
  virtual void OnAttemptEnded() {}
  // The job ends with `exit_code`: nothing the feature started may outlive this.
  virtual void OnFinish(int /*exit_code*/) {}
};

// Makes a feature for the job `agent` runs, or null when its options do not ask for it.
using FeatureFactory = std::function<std::unique_ptr<JobFeature>(AgentView& agent)>;

// Every feature crun has, in the order their hooks are called (features.cc).
std::vector<FeatureFactory> DefaultFeatures();

// The features one job has: those of `factories` that its options ask for, in order.
class JobFeatures {
 public:
  // A factory may read the view's options and rendezvous only: the parts it names after
  // them may not be made yet.
  JobFeatures(const std::vector<FeatureFactory>& factories, AgentView& agent);

  // Calls `hook(feature)` on every feature, in order.
  template <typename Hook>
  void Each(const Hook& hook) const {
    for (const auto& f : list_) hook(*f);
  }
  // Every feature's Prepare, in order, until one fails.
  Status Prepare();
  // Every feature's BeforeJoin; `join` runs once none holds the join any more (at once when
  // none held it).
  void BeforeJoin(std::function<void()> join);
  // The first feature's answer to KillerOf; "" when none knows.
  std::string KillerOf(const Worker& w, const ExitStatus& exit);

 private:
  std::vector<std::unique_ptr<JobFeature>> list_;
};

}  // namespace crun::agent
