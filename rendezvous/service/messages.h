// What agents and the rendezvous engine say to each other, as plain C++ values: the engine
// (engine.h) reads and writes these and knows nothing of protobuf or gRPC. The wire form is
// proto/crun/v1/rendezvous.proto; proto_messages.h converts between the two, in the gRPC
// adapter only. Field meanings are the .proto's; only what the engine or its callers use is here.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "rendezvous/report/report.h"
#include "rendezvous/rules/rules.h"
#include "rendezvous/rules/stragglers.h"

namespace crun::rdzv::msg {

// ---- agent -> service ------------------------------------------------------------------------

struct Node {
  std::string node_id;
  std::string host;
  std::vector<std::string> addresses;  // declared by the agent
  int nproc = 0;
  std::optional<int> requested_rank;
  std::uint64_t incarnation = 0;     // 0: unknown
  std::vector<std::uint16_t> ports;  // reserved for the round's workers (--contract)
};

struct Join {
  std::uint32_t protocol_version = 0;
  std::string run_id;
  Node node;
  Settings settings;  // wire defaults applied (a time of 0 on the wire: the default)
  std::string service_host;
  // Not empty: the node failed its health gate (docs/health.md) and does not join; this says
  // why, and the node leaves next.
  std::string unhealthy;
};

// What a node's snapshot store holds (docs/checkpoints.md), as its heartbeats say; -1: none.
struct NodeSnapshots {
  std::uint64_t bytes = 0;
  std::int64_t step = -1;
  std::int64_t disk_step = -1;
};

struct Heartbeat {
  std::uint64_t sequence = 0;
  NodeSnapshots snapshots;
  // Slow ranks (docs/health.md): this node's ranks' figures since its last beat, of the round
  // `compute_round`, each rank by its global RANK.
  std::vector<ComputeSample> compute;
  int compute_round = 0;
};

// One worker's end. At most one of exit_code and signal is set (neither: unknown).
// A node's failure report: the one model (rendezvous/report/report.h).
using WorkerFailure = report::WorkerFailure;
using FailureReport = report::FailureReport;

struct WorkersSucceeded {};

struct Leave {
  std::string reason;
};

// Stacks (docs/hangs.md). The engine forwards each node's stacks without reading them: they
// travel as the serialized NodeStacks message of the .proto.
struct StacksWanted {
  std::uint64_t request_id = 0;
  std::string reason;
  std::int64_t timeout_ms = 0;
};

struct StacksReply {
  std::uint64_t request_id = 0;
  std::string node_stacks;  // serialized crun.v1.NodeStacks
};

// The node's goodput ledger (rendezvous/goodput/ledger_json.h), at each change of where its
// time goes and once a minute.
struct Goodput {
  std::string ledger_json;
};

using AgentMessage = std::variant<Join, Heartbeat, FailureReport, WorkersSucceeded, Leave,
                                  StacksWanted, StacksReply, Goodput>;

// ---- service -> agent ------------------------------------------------------------------------

struct RoundMember {
  std::string host;
  std::string address;
  int nproc = 0;
  std::vector<std::uint16_t> ports;
};

struct Assignment {
  int round = 0;
  int group_rank = 0;
  int group_world_size = 0;
  int base_rank = 0;
  int world_size = 0;
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
  bool spare = false;
  bool durable_service = false;
  bool judges_stragglers = true;         // this service judges slow ranks job-wide (always)
  std::int64_t waited_for_nodes_ms = 0;  // rdzv::FormRound::waited_for_nodes
  // Group-rank order; one list shared by every node's assignment of the round (the service
  // encodes it once, EncodeMembers): null or empty where no node reserved ports.
  std::shared_ptr<const std::vector<RoundMember>> members;
};

struct StopAndRejoin {
  std::string reason;
  bool spends_restart = false;
  std::string kind;               // rdzv::StopAndRejoin::kind
  std::int64_t fault_ms_ago = 0;  // rdzv::StopAndRejoin::fault_ago
};

struct JobFinished {
  bool success = false;
  std::string reason;
  std::optional<FailureReport> root_cause;
  int exit_code = 0;
  std::vector<std::string> goodput;  // every node's ledger, as JSON: the job's is combined
};

struct Refused {
  std::string reason;
};

struct StacksRequest {
  std::uint64_t request_id = 0;
  std::string reason;
};

struct StacksResult {
  std::uint64_t request_id = 0;
  std::vector<std::string> nodes;  // each a serialized crun.v1.NodeStacks
  std::vector<std::string> missing;
  std::string run_id;
  int round = 0;
};

// A rank the job-wide detector named slow (or cleared), with the host its node declared.
struct StragglerVerdict {
  StragglerChange change;
  std::string host;
};

// The detector's changes in round `round`, to every node of it.
struct Stragglers {
  int round = 0;
  std::vector<StragglerVerdict> changes;
};

using ServiceMessage = std::variant<Assignment, StopAndRejoin, JobFinished, Refused, StacksRequest,
                                    StacksResult, Stragglers>;

// ---- status ----------------------------------------------------------------------------------

// A goodput ledger's figures (docs/observability.md, "Goodput").
struct GoodputFigures {
  bool known = false;  // its workers report progress
  double ratio = 0;
  std::vector<std::pair<std::string, double>> seconds;  // by category, in the ledger's order
  int incidents = 0;
  std::string summary;
};

struct NodeStatus {
  std::string node_id;
  std::string host;
  std::string state;  // joined, member, spare, succeeded, unhealthy
  int group_rank = -1;
  int nproc = 0;
  std::int64_t last_heartbeat_ms_ago = 0;
  NodeSnapshots snapshots;
  std::string reason;                       // unhealthy: why its health check failed
  std::vector<StragglerChange> stragglers;  // its ranks named slow now
  std::optional<GoodputFigures> goodput;    // as its ledger said, carried to now
};

struct JobStatus {
  std::string run_id;
  std::string phase;  // gathering, running, succeeded, failed
  int round = 0;
  int restarts_used = 0;
  int max_restarts = 0;
  std::vector<NodeStatus> nodes;
  std::string last_failure;
  std::vector<std::string> lost_hosts;  // node ids
  int unhealthy_reports = 0;            // health gates failed, all told
  int min_nodes = 0;
  int max_nodes = 0;
  int world_size = 0;
  std::optional<GoodputFigures> goodput;  // combined from its nodes' ledgers
};

struct StatusResponse {
  std::vector<JobStatus> jobs;
};

}  // namespace crun::rdzv::msg
