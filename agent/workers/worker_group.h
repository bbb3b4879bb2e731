// The process side of the agent: it carries out the lifecycle's actions on processes (start,
// signal, end and reap) and decides nothing; supervise/lifecycle.h decides. It holds the
// running attempt's workers, crun's cgroup and the attempt's own, the guard that ends the
// workers if crun dies, SIGCHLD (orphans that come to crun are reaped as they end), the OOM
// witnesses and the attempt's edge.
//
// Single-threaded: everything runs on the io_context given. The workers' exits and streams
// reach the caller through the AttemptStartContext of each Start.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "agent/supervise/attempt_edge.h"
#include "agent/supervise/group_guard.h"
#include "agent/supervise/lifecycle.h"
#include "agent/supervise/worker_cgroup.h"
#include "agent/warm/warm_template.h"
#include "agent/workers/attempt_start.h"
#include "base/status.h"

namespace crun::agent {

class WorkerGroup {
 public:
  // `options` must outlive the group.
  WorkerGroup(boost::asio::io_context& io, const AgentOptions& options);
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Before any worker: crun's cgroup (or, logged, why there is none), the guard, the
  // subreaper and SIGCHLD. An error names what could not be set up.
  Status Prepare();
  // Attempt `attempt`: its own cgroup, then every local rank (StartWorkers); the ones that
  // started are guarded and their exits watched.
  std::vector<WorkerStart> Start(int attempt, AttemptStartContext context, WorkerStreams& streams);
  // Local rank `lr` exited (its watcher said so and reaped it).
  void Exited(int lr, ExitStatus exit);
  // The lifecycle's SignalWorkers, to the process group of each named rank still running; a
  // stopped one (SIGSTOP, a debugger) is also continued so that it acts on a stop signal now.
  // `base_rank` names ranks in the log.
  void Signal(const lifecycle::SignalWorkers& action, int base_rank);
  // Every worker has exited: end and reap whatever else the attempt started (AttemptEdge),
  // then `done(complete)`; false when something was still there at the edge's deadline.
  void BeginEdge(int attempt_label, std::function<void(bool complete)> done);
  // The attempt is over: its process groups are no longer the guard's.
  void EndAttempt();
  // --warm: starts the template (agent/warm) that later workers are forked from.
  void StartWarm(WarmOptions options);
  // Runs `done` when an attempt may start: at once, or once a template that is still
  // importing is ready (or given up on: the attempt then starts cold).
  void WhenReadyToStart(std::function<void()> done);
  // The job is over: the template ends, the workers' hang and stack pipes close, SIGCHLD is
  // no longer read.
  void Close();

  // The worker of local rank `lr` (one of this crun's).
  Worker& at(int lr);
  const std::vector<Worker>& workers() const { return workers_; }
  // The running worker that is `pid` or started it (its process group, else its ancestry).
  Worker* OfPid(pid_t pid);
  // How many of the attempt's workers run, and how many have exited.
  int running() const;
  int exited() const;
  // "rank R <how it exited>, ..." for every worker that started (`base_rank`: RANK of local
  // rank 0).
  std::string DescribeExits(int base_rank) const;
  // The children this process owns (supervise/children.h): the workers, the guard, the
  // template and the stack tools. The one registry of this process.
  ChildRegistry& children() { return registry_; }
  // crun's cgroup for the workers; "" when it has none.
  std::string cgroup_dir() const;

 private:
  void OnEdge(const EdgeReport& r);

  boost::asio::io_context& io_;
  const AgentOptions& options_;
  ChildRegistry registry_;                // first made, last gone: every child below is owned in it
  std::unique_ptr<WorkerCgroup> cgroup_;  // null where the machine gives crun none
  std::unique_ptr<AttemptCgroup> attempt_cgroup_;  // the running attempt's, until its edge
  std::unique_ptr<ChildSignals> children_;         // SIGCHLD
  std::unique_ptr<AttemptEdge> edge_;              // the last attempt's end
  std::unique_ptr<GroupGuard> guard_;
  std::unique_ptr<WarmTemplate> warm_;  // before guard_ goes: it forgets its group there
  std::vector<Worker> workers_;
};

// The last lines of a worker's stderr: what its pump kept, else its log file's.
std::vector<std::string> StderrTail(const Worker& w);

}  // namespace crun::agent
