// The running attempt's hangs (docs/hangs.md): the watch that declares a worker hung when it
// makes no progress, and the one place stacks are read (HangResponder) for a hang, for
// `crun stacks` and for another node's request through the rendezvous. A declared hang is
// read (every rank's stacks, here and on the other nodes) while all still run; the complete
// report goes to `concluded`, and what to do about it is the lifecycle's to decide.
//
// Single-threaded, on the io_context given.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "agent/agent_options.h"
#include "agent/hangs/hang_responder.h"
#include "agent/hangs/hang_watch.h"
#include "agent/rendezvous/rendezvous.h"
#include "agent/supervise/lifecycle.h"
#include "agent/workers/job_progress.h"
#include "agent/workers/worker_group.h"

namespace crun::agent {

class AttemptHangs {
 public:
  // The report of a hang of the lifecycle's `attempt`, declared at `when` (`declared` on the
  // steady clock); `hung`: the local ranks found hung.
  using Concluded = std::function<void(int attempt, std::vector<int> hung, HangReport report,
                                       std::chrono::system_clock::time_point when,
                                       std::chrono::steady_clock::time_point declared)>;

  // Everything passed in must outlive this; `state` and `group` are read as they are now (the
  // lifecycle's state and the running attempt's assignment).
  // Step records in `progress` pace the watch (--hang-after-steps).
  AttemptHangs(boost::asio::io_context& io, const AgentOptions& options, WorkerGroup& workers,
               Rendezvous& rendezvous, const lifecycle::State& state, const GroupAssignment& group,
               JobProgress& progress, Concluded concluded);

  HangWatch& watch() { return watch_; }
  HangResponder& stacks() { return responder_; }

  // The rendezvous asks for this node's stacks: for a hang on another node, which prints them
  // all, or for `crun stacks --rdzv-endpoint`. Read without stopping anything; for a hang,
  // also printed here and kept under the attempt's log directory.
  void AnswerStacksRequest(std::uint64_t id, const std::string& reason);

 private:
  std::vector<StackTarget> Targets() const;
  void OnHang(const std::vector<WorkerProgress>& progress);

  const AgentOptions& options_;
  WorkerGroup& workers_;
  Rendezvous& rendezvous_;
  const lifecycle::State& state_;
  const GroupAssignment& group_;
  Concluded concluded_;
  HangWatch watch_;
  HangResponder responder_;
};

}  // namespace crun::agent
