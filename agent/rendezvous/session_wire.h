// The agent's side of its session with crun's rendezvous service on the wire (crun.v1,
// proto/crun/v1/rendezvous.proto), in one place: what it says (its join, heartbeats, failures,
// stacks) built from its own types, and what it hears (an assignment, the job's end, slow-rank
// verdicts, other nodes' stacks) read back into them. The service's side is
// rendezvous/service/proto_messages.h; a failure report's one conversion is the report's own
// (rendezvous/report/report_proto.h).
//
// Stacks: threads and frames travel; the tools' raw output stays on its node (in its own report
// and attempt_<n>/stacks/). `crun stacks --rdzv-endpoint` reads them back here too.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "agent/hangs/stack_model.h"
#include "agent/health/straggler_exchange.h"
#include "agent/rendezvous/assignment.h"
#include "agent/rendezvous/rendezvous.h"
#include "agent/rendezvous/service_rendezvous.h"
#include "crun/v1/rendezvous.pb.h"
#include "proto/protocol_version.h"
#include "rendezvous/report/report.h"

namespace crun::agent {

// ---- what the agent says ----
// Its join (or, with `unhealthy`, its failed health check), with the job's settings and the
// ports it reserved for the round. `incarnation`: this agent's, so that a node id taken over on
// return is told apart.
v1::AgentMessage JoinMessage(const ServiceRendezvousOptions& o, std::uint64_t incarnation,
                             const std::vector<std::uint16_t>& ports, const std::string& unhealthy);
// A heartbeat: its sequence, the node's snapshot facts, and the slow-rank figures waiting in
// `stragglers` (taken: its outbox is empty afterwards). Either may be null.
v1::AgentMessage HeartbeatMessage(std::uint64_t sequence, const SnapshotFacts* snapshot,
                                  StragglerExchange* stragglers);
// The workers failed: the report as it is (its node_id says whose).
v1::AgentMessage FailureMessage(const report::FailureReport& failures);
v1::AgentMessage StacksWantedMessage(std::uint64_t id, const std::string& reason,
                                     std::chrono::milliseconds timeout);
// The workers all succeeded; the node leaves for `reason`; its goodput ledger (JSON,
// rendezvous/goodput/ledger_json.h).
v1::AgentMessage SucceededMessage();
v1::AgentMessage LeaveMessage(const std::string& reason);
v1::AgentMessage GoodputMessage(const std::string& ledger_json);
// A node's answer to a stacks request. One larger than kMaxNodeStacksBytes keeps only each
// rank's main thread (and says so in `error`), so that one node's answer never crowds out the
// others'.
inline constexpr std::size_t kMaxNodeStacksBytes = std::size_t{1} << 20;
v1::AgentMessage StacksReplyMessage(std::uint64_t id, const std::string& node_id,
                                    const std::string& host, const std::vector<RankStacks>& ranks,
                                    const std::string& error);
v1::NodeStacks NodeStacksToProto(const std::string& node_id, const std::string& host,
                                 const std::vector<RankStacks>& ranks, const std::string& error);

// ---- what it hears ----
// This node's place in a round (`self`: what it knows of itself). The members are the round's
// other nodes, as their contracts need them.
GroupAssignment AssignmentFromProto(const v1::RoundAssignment& a, const RoundSelf& self);
StopNotice StopFromProto(const v1::StopAndRejoin& s);
JobOutcome OutcomeFromProto(const v1::JobFinished& f);
std::vector<SlowRankVerdict> VerdictsFromProto(const v1::Stragglers& s);
RemoteStacks RemoteStacksFromProto(const v1::StacksResult& result);

}  // namespace crun::agent
