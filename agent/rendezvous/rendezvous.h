// The agent's view of the rendezvous. The agent asks to join; the rendezvous answers with
// events: an assignment for a round, "stop your workers and join again", or the job's final
// outcome. The agent reports how its workers ended. Implementations: the in-process one for a
// single node, torchrun's static backend and one crun per Slurm task
// (agent/rendezvous/static_rendezvous.h), the gRPC client of the rendezvous service
// (agent/rendezvous/service_rendezvous.h), and the one kept in etcd
// (agent/rendezvous/etcd_rendezvous.h).
//
// Events are delivered on the agent's event loop and never from inside a call below.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "agent/hangs/stack_model.h"
#include "agent/health/straggler_exchange.h"
#include "agent/rendezvous/assignment.h"
#include "rendezvous/report/report.h"

namespace crun::agent {

struct JobOutcome {
  bool success = false;
  int exit_code = 0;         // what this crun exits with: the same on every node
  std::string reason;        // "all workers succeeded", "only 1 of at least 2 nodes joined ..."
  std::string root_node_id;  // the node whose failure ended the job, if one did
  report::FailureReport root_report;  // its failures, the root cause first
  // Every node's goodput ledger as the rendezvous last had it (JSON), where it combines the
  // job's: the job's ledger is combined from them (rendezvous/goodput/job_ledger.h).
  std::vector<std::string> goodput;
  // Or the job's ledger as the rendezvous combined it itself (etcd's decider: the "job"
  // element of ledger_json.h, without segments), and of how many nodes.
  std::string job_goodput;
  std::size_t job_nodes = 0;
};

// Why the rendezvous stops the running round (RendezvousEvents::OnStopAndRejoin).
struct StopNotice {
  std::string reason;
  bool spends_restart = false;  // a failure caused it (else a membership change)
  // rdzv::kStopPeer, kStopNodeLost or kStopScaleUp; "" where the rendezvous does not say. And
  // how long before the notice the fault was (a lost node's last heartbeat): the goodput
  // ledger's "detecting" (docs/observability.md).
  std::string kind;
  std::chrono::milliseconds fault_ago{0};
};

class RendezvousEvents {
 public:
  virtual ~RendezvousEvents() = default;
  // A round formed. group.spare: this node waits outside it, for a node that is lost.
  virtual void OnAssignment(const GroupAssignment& group) = 0;
  // Stop the workers; Join() again once they are down.
  virtual void OnStopAndRejoin(const StopNotice& stop) = 0;
  virtual void OnFinished(const JobOutcome& outcome) = 0;
  // The service asks for this node's stacks (a hang on another node, or `crun stacks`): read
  // them without stopping anything and answer with Rendezvous::ReplyStacks(id, ...).
  virtual void OnStacksRequest(std::uint64_t id, const std::string& reason) = 0;
};

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual void Start(RendezvousEvents* events) = 0;
  // Ready for the next round (no workers running). `ports`: what this node reserved for the
  // round's workers (agent/frameworks/contracts.h), published with the join where the rendezvous
  // exchanges them; each round's GroupAssignment::members carries every node's.
  virtual void Join(const std::vector<std::uint16_t>& ports) = 0;
  // The first failure of this node's round, the root cause first; sent at once so every
  // node can stop. Its node_id names this node (the agent sets it).
  virtual void ReportFailure(const report::FailureReport& failures) = 0;
  // Every worker of this node exited 0.
  virtual void ReportSuccess() = 0;
  // Instead of a join: this node failed its health gate (docs/health.md), for `why`, and
  // leaves next. A rendezvous that keeps a job's state counts and names it there.
  virtual void ReportUnhealthy(const std::string& why) = 0;
  // This node leaves the job (a signal stopped it); no events follow.
  virtual void Leave(const std::string& reason) = 0;
  // Identity in reports: which node a root cause came from.
  // This node's goodput ledger (JSON, rendezvous/goodput/ledger_json.h), for a rendezvous
  // that combines the job's (the service, etcd); the others keep none.
  virtual void ShareGoodput(const std::string& /*ledger_json*/) {}
  virtual std::string node_id() const = 0;
  // Slow ranks judged job-wide (health/straggler_exchange.h): the exchange of a rendezvous that
  // carries every node's figures to one judge, which the agent hands to its features; null where
  // each node judges its own ranks.
  virtual StragglerExchange* stragglers() { return nullptr; }
  // The stacks of every other node of the running round, for a hang here (docs/hangs.md):
  // `done` once each has answered, or within `timeout` (and a second) with what came; at once
  // and empty for a single node.
  virtual void AskStacks(const std::string& reason, std::chrono::milliseconds timeout,
                         std::function<void(RemoteStacks)> done) = 0;
  // This node's answer to OnStacksRequest(id); `error` when it has none ("no workers running").
  virtual void ReplyStacks(std::uint64_t id, const std::string& host,
                           const std::vector<RankStacks>& ranks, const std::string& error) = 0;
};

}  // namespace crun::agent
