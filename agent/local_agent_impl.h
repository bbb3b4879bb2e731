// LocalAgent's parts (local_agent.h), shared by its two halves: local_agent.cc turns what
// happens (the rendezvous's events, the workers' exits, their streams' ends, the attempt's
// edge, signals, hangs) into lifecycle events; agent_actions.cc carries out the actions the
// lifecycle (supervise/lifecycle.h) answers with. What to do next is decided in neither.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include "agent/failures/report_publish.h"
#include "agent/local_agent.h"
#include "agent/workers/attempt_hangs.h"

namespace crun::agent {

struct LocalAgent::Impl final : RendezvousEvents {
  Impl(boost::asio::io_context& io, AgentOptions o, std::unique_ptr<Rendezvous> r,
       const std::vector<FeatureFactory>& factories);

  // ---- events in (local_agent.cc) ---------------------------------------------------------
  int Run();
  void ArmSignals();
  void JoinRendezvous();  // after every feature's BeforeJoin has passed
  void FailRank(int lr, const std::string& why);
  void OnAssignment(const GroupAssignment& g) override;
  void OnStopAndRejoin(const StopNotice& stop) override;
  void OnFinished(const JobOutcome& o) override;
  void OnStacksRequest(std::uint64_t id, const std::string& reason) override;
  static std::chrono::steady_clock::time_point Now() { return std::chrono::steady_clock::now(); }

  // Takes the lifecycle's next state and carries out its actions, in order. An action may feed
  // another event (a start answers at once): its actions queue behind those under way.
  void Feed(lifecycle::Transition t);

  // ---- actions out (agent_actions.cc) -----------------------------------------------------
  void Carry(const lifecycle::StartAttempt& a);
  void StartAttempt(int n);
  void Carry(const lifecycle::WaitAsSpare& a);
  void Carry(const lifecycle::AttemptStarted&);
  void Carry(const lifecycle::WorkerExited& a);
  void Carry(const lifecycle::RecordHang& a);
  void Carry(const lifecycle::ReportFailure&);
  bool AttemptProgressed();
  void Carry(const lifecycle::SignalWorkers& a);
  void Carry(const lifecycle::BeginEdge& a);
  void Carry(const lifecycle::EndAttempt&);
  void Carry(const lifecycle::Restarting& a);
  void Carry(const lifecycle::ReportSuccess&);
  void Carry(const lifecycle::Join&);
  void Carry(const lifecycle::Leave& a);
  void Carry(const lifecycle::LeaveJob& a);
  void Carry(const lifecycle::Say& a);
  void Carry(const lifecycle::Finish& a);
  JobEnd End() const;
  void Finish(int code);

  boost::asio::io_context& io;
  AgentOptions options;
  std::unique_ptr<Rendezvous> rdzv;
  std::unique_ptr<metrics::Registry> registry;  // with --metrics-port
  std::unique_ptr<AgentMetrics> meters;
  // The job's heartbeats, step records and snapshot saves (AgentView::progress).
  JobProgress progress;
  PortReservation reserved;  // this round's ports (--contract), until its workers start
  metrics::Pages pages;      // beside /metrics (AgentView::pages)
  std::chrono::steady_clock::time_point joined_at;  // of the rendezvous under way
  GroupAssignment offered;                          // the rendezvous's last assignment
  GroupAssignment group;                            // the running attempt's
  lifecycle::State state;
  AgentView view;  // names parts made after the features: see JobFeatures
  JobFeatures features;
  WorkerStreams streams;
  boost::asio::signal_set signals;
  boost::asio::steady_timer wake;  // the lifecycle's next tick (the end of a stop's grace)
  WorkerGroup workers;
  AttemptFailures failures;
  RunPresence presence;
  AttemptHangs hangs;
  StopNotice restart;  // the rendezvous's last stop-and-rejoin
  // The running attempt's progress (crash loops): the job's progress count when it began, its
  // start, and its first worker failure. `progress` is declared before the view.
  std::uint64_t progress_before = 0;
  std::chrono::steady_clock::time_point attempt_began;
  std::optional<std::chrono::steady_clock::time_point> first_failure;
  JobOutcome outcome;
  std::deque<lifecycle::Action> queue;  // actions not yet carried out (Feed)
  bool carrying = false;
};

}  // namespace crun::agent
