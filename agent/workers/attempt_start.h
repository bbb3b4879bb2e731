// Starting an attempt's workers, in two phases: each worker is prepared (its log directory, its
// command line, its environment, its output streams and hang channels) and forked, waiting;
// then all exec at once and each start is confirmed (supervise/spawn.h). A worker that could
// not be started is answered with the shell's code (127 not found, 126 cannot run, 1 no log
// directory); when one fails in the first phase, the ranks after it are not tried.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "agent/agent_options.h"
#include "agent/hangs/hang_watch.h"
#include "agent/hangs/stack_pipe.h"
#include "agent/hangs/worker_pipe.h"
#include "agent/output/line_pump.h"
#include "agent/output/worker_streams.h"
#include "agent/supervise/exit_watcher.h"
#include "agent/supervise/lifecycle.h"
#include "agent/supervise/spawn.h"
#include "agent/warm/warm_template.h"
#include "agent/workers/job_progress.h"
#include "agent/workers/worker_env.h"

namespace crun::agent {

// One worker of the running attempt, as crun holds it.
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

// What an attempt's start needs beyond the agent's options.
struct AttemptStartContext {
  GroupAssignment group;
  Environment base;    // crun's environment, the workers' starting point
  int cgroup_fd = -1;  // the attempt's cgroup (AttemptCgroup), -1: none
  std::string cgroup_dir;
  std::string python_dir;      // the hook's sitecustomize.py; empty: none
  std::string python_sdk_dir;  // crun_worker.py; empty: none
  std::string timer_file;      // the file timer's pipe; empty: none
  // The job's progress (AgentView::progress): every local rank's heartbeats and step records
  // are told to it, on a pipe each worker gets in CRUN_HEARTBEAT_FD; null: no pipe.
  JobProgress* progress = nullptr;
  // Where workers are forked from when it is ready (agent/warm); null: cold starts only.
  WarmTemplate* warm = nullptr;
  // Where the workers are owned (the worker group's registry); set by WorkerGroup::Start.
  ChildRegistry* children = nullptr;
  // Called on the event loop: a worker exited; one of its streams was read to its end.
  std::function<void(int local_rank, ExitStatus)> on_exit;
  std::function<void(int local_rank)> on_stream_closed;
};

// A rank's start: the lifecycle's Launch, and why it failed.
struct WorkerStart {
  lifecycle::Launch launch;
  std::string why;
};

// Starts every local rank of `options` into `workers` (resized, one per local rank).
std::vector<WorkerStart> StartWorkers(boost::asio::io_context& io, const AgentOptions& options,
                                      const AttemptStartContext& context, WorkerStreams& streams,
                                      std::vector<Worker>& workers);

}  // namespace crun::agent
