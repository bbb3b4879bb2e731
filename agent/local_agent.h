// LocalAgent: runs this node's workers through attempts until they all succeed, the restart
// budget is spent, or a signal stops the job. Single-threaded: everything happens on the
// io_context passed in, which Run() drives.
//
// * A worker's exit is noticed the moment it happens (ExitWatcher); on a failure the rest of
//   the group is stopped: stop signal -> grace (shutdown_timeout) -> SIGKILL, each to the
//   worker's whole process group.
// * Signals in `forward_signals` are passed to every worker's process group. SIGUSR1 and
//   SIGUSR2 are notices (Slurm's `--signal=USR1@60` warning): passed on, and the workers go on
//   being supervised as before; whatever they do next (checkpoint and exit 0, fail) is judged
//   as usual. Any other signal stops the job: the same grace/kill sequence, and Run() returns
//   128 + signal. A second SIGINT or SIGQUIT while stopping ends the grace at once; a repeated
//   SIGTERM or SIGHUP does not (Slurm repeats SIGTERM at a time limit).
// * Exit code: 0 when all workers succeed; otherwise the root cause's (the first failure in
//   time): its exit code, or 128 + its signal.
#pragma once

#include <memory>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "agent/agent_options.h"
#include "agent/features/job_feature.h"
#include "agent/rendezvous/rendezvous.h"

namespace crun::agent {

class LocalAgent {
 public:
  // `features`: the job's per-node features (features/job_feature.h), each made if the
  // options ask for it; their hooks are called in this order.
  LocalAgent(boost::asio::io_context& io, AgentOptions options,
             std::unique_ptr<Rendezvous> rendezvous,
             const std::vector<FeatureFactory>& features = DefaultFeatures());
  ~LocalAgent();
  // Blocks until the job ends; returns crun's exit code.
  int Run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace crun::agent
