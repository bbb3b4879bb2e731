// LocalAgent: runs this node's workers through attempts until they all succeed, the restart
// budget is spent, or a signal stops the job. Single-threaded: everything happens on the
// io_context passed in, which Run() drives.
//
// * A worker's exit is noticed the moment it happens (ExitWatcher); on a failure the rest of
//   the group is stopped: stop signal -> grace (shutdown_timeout) -> SIGKILL, each to the
//   worker's whole process group.
// * Signals in `forward_signals` are passed to every worker's process group, then the same
//   grace/kill sequence; Run() returns 128 + signal.
// * Exit code: 0 when all workers succeed; otherwise the root cause's (the first failure in
//   time): its exit code, or 128 + its signal.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "agent/process.h"
#include "agent/rendezvous.h"

namespace crun::agent {

struct AgentOptions {
  // The worker command line; "${local_rank}" in it is replaced per worker.
  std::vector<std::string> command;
  int nproc = 1;
  int max_restarts = 0;
  std::chrono::milliseconds shutdown_timeout{30'000};
  std::vector<int> forward_signals;  // empty: SIGTERM, SIGINT, SIGHUP, SIGQUIT
  std::string host_name;             // for reports
};

struct WorkerFailure {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = 0;
  ExitStatus exit;
  std::chrono::system_clock::time_point when;
};

class LocalAgent {
 public:
  LocalAgent(boost::asio::io_context& io, AgentOptions options,
             std::unique_ptr<Rendezvous> rendezvous);
  ~LocalAgent();
  // Blocks until the job ends; returns crun's exit code.
  int Run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace crun::agent
