// The etcd rendezvous's keys and what they hold (docs/rendezvous.md, "On etcd"): one prefix per
// run id, JSON values that an operator can read with etcdctl, and the decisions taken on them.
//
//   <root>/<run id>/layout              "crun-etcd-rendezvous/3": written once; another value
//                                       is a layout of another crun version, and agents refuse it
//   <root>/<run id>/state               the decider's document: the rules' state (rules.h) with
//                                       wall-clock deadlines, who has joined, the gathering
//                                       number, why the last round stopped, the outcome
//   <root>/<run id>/nodes/<node id>     an agent: bound to its lease (TTL = heartbeat timeout),
//                                       so that etcd deletes it when the agent dies or is cut off
//   <root>/<run id>/joins/<node id>     "ready for gathering G": written when its workers are down;
//                                       "G", or {"gathering": G, "ports": [...]} with the ports
//                                       it reserved for the round's workers (--contract)
//   <root>/<run id>/reports/<G>/<id>    how this node's workers ended in gathering G
//   <root>/<run id>/unhealthy/<id>     {"host", "reason"}: the node failed its health check and
//                                       stays out (docs/health.md); folded into the state and
//                                       deleted by the decider
//   <root>/<run id>/rounds/<round>      history: when each round formed, with whom; the last
//                                       kRoundsKept only
//   <root>/<run id>/ranks/<node id>     this node's place in the last round formed with it
//                                       (RankRecord), bound to its lease
//   <root>/<run id>/last_failure        the report that spent the last restart or ended the job
//   <root>/<run id>/a/job               what every agent acts on: the state without what only
//                                       the decider needs (who has joined, deadlines) and, unless
//                                       a member reserved ports, without the member list
//   <root>/<run id>/a/decider           the node id that decides (bound to its lease)
//   <root>/<run id>/a/stores/<round>    the round's c10d store, written by its group rank 0;
//                                       deleted once a later round forms
//   <root>/<run id>/a/refused/<id>      why a join was refused (bound to that agent's lease)
//   <root>/<run id>/figures/<id>        a node's slow-rank figures (stragglers.h)
//   <root>/<run id>/a/stragglers        the decider's slow-rank verdicts (stragglers.h)
//   <root>/<run id>/ledger/<id>         a node's goodput ledger (goodput.h)
//   <root>/<run id>/a/goodput           the job's, combined by the decider with the outcome
//
// Deciding (Decide): one agent at a time, the one that created a/decider, folds what the other
// keys say into the state with the pure rules and writes it back in a transaction that compares
// the state's revision, so two deciders can never both close a round. The decider watches the
// whole prefix; every other agent watches a/ only, so that a join or a node's key reaches one
// watcher, not all of them, and a/job changes only when the agents must act (a round formed,
// stop and rejoin, the outcome): N agents cost O(N) watch events per round, not O(N^2).
// a/job stays O(1) bytes as well: each node reads its own place from ranks/<id>, which the
// decider writes before it announces the round (Decision::rank_ops), so a round costs O(N)
// bytes in all. Only with --contract, where every worker needs every node's address and ports,
// does a/job list the members (O(N) to each node), as the service sends them.
//
// Tidy: the keys of a job do not grow with its rounds (rounds/ keeps the last kRoundsKept,
// a/stores/ the current round's), and once it has an outcome every key of the run is bound to one
// lease granted for it with the TTL of --rdzv-conf etcd_retention, so that etcd deletes them all
// when that runs out (Retention). A new job on the run id before then unbinds what it keeps.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/status.h"
#include "rendezvous/etcd/client.h"
#include "rendezvous/rules/rules.h"
#include "rendezvous/service/messages.h"

namespace crun::etcd {

inline constexpr char kLayout[] = "crun-etcd-rendezvous/3";
inline constexpr char kDefaultRoot[] = "/crun/rdzv";
inline constexpr int kRoundsKept = 10;  // rounds/ history kept for operators
// etcd refuses a transaction of more operations than its --max-txn-ops (128 by default): one
// decision stays well under it, tidying at most kMaxTidied keys of each kind per pass.
inline constexpr std::size_t kMaxTxnOps = 128;
inline constexpr std::size_t kMaxTidied = 16;
inline constexpr std::chrono::seconds kDefaultRetention{3600};

using WallClock = std::chrono::system_clock;

struct Keys {
  Keys(const std::string& root, const std::string& run_id);
  std::string prefix;  // "<root>/<run id>/"
  std::string layout() const { return prefix + "layout"; }
  std::string state() const { return prefix + "state"; }
  std::string announce() const { return prefix + "a/"; }  // what every agent watches
  std::string job() const { return announce() + "job"; }
  std::string decider() const { return announce() + "decider"; }
  std::string nodes() const { return prefix + "nodes/"; }
  std::string node(const std::string& id) const { return nodes() + id; }
  std::string joins() const { return prefix + "joins/"; }
  std::string join(const std::string& id) const { return joins() + id; }
  std::string reports() const { return prefix + "reports/"; }
  std::string reports(int gathering) const { return reports() + std::to_string(gathering) + "/"; }
  std::string report(int gathering, const std::string& id) const { return reports(gathering) + id; }
  std::string stores() const { return announce() + "stores/"; }
  std::string store(int round) const { return stores() + std::to_string(round); }
  std::string unhealthy() const { return prefix + "unhealthy/"; }
  std::string unhealthy(const std::string& id) const { return unhealthy() + id; }
  std::string ranks() const { return prefix + "ranks/"; }
  std::string rank(const std::string& id) const { return ranks() + id; }
  std::string rounds() const { return prefix + "rounds/"; }
  std::string round(int n) const;  // zero-padded, so that keys sort by round
  std::string last_failure() const { return prefix + "last_failure"; }
  std::string refusals() const { return announce() + "refused/"; }
  std::string refusal(const std::string& id) const { return refusals() + id; }
};

// Runs `f`, a reader of one of these keys' JSON: a value it cannot read (a parse or type error,
// a field missing) is a ProtocolError naming `what`.
template <typename F>
auto Guarded(const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    return ProtocolError(what + ": " + e.what());
  }
}

// An agent, as its nodes/ key describes it.
struct NodeRecord {
  rdzv::NodeDescription node;
  std::vector<std::string> addresses;
  rdzv::Settings settings;
};
std::string EncodeNode(const NodeRecord& r);

// A join: the gathering it is for, and the ports the node reserved for that round's workers.
struct JoinRecord {
  int gathering = 0;
  std::vector<std::uint16_t> ports;
};
// "G" without ports (what agents before --contract wrote, and still write without ports).
std::string EncodeJoin(const JoinRecord& j);
StatusOr<JoinRecord> DecodeJoin(const std::string& id, const std::string& text);
StatusOr<NodeRecord> DecodeNode(const std::string& id, const std::string& json);

// How one node's workers ended: success, or failure with the report (rendezvous/report/report.h's
// JSON; opaque here), what it says in one line and the exit code it implies.
struct Report {
  bool success = false;
  std::string what;
  int exit_code = 1;
  std::string report_json;
};
std::string EncodeReport(const Report& r);
StatusOr<Report> DecodeReport(const std::string& json);

// A node's unhealthy/ key.
std::string EncodeUnhealthy(const rdzv::UnhealthyNode& u);
StatusOr<rdzv::UnhealthyNode> DecodeUnhealthy(const std::string& id, const std::string& json);

// ranks/<node id>: a node's place in a round, as the decider's rules assigned it. `token` names
// the decision (JobDoc::ranks_token): a record of another decision is not this round's.
struct RankRecord {
  std::string token;
  int round = 0;
  bool spare = false;
  int group_rank = 0;
  int group_world_size = 0;
  int base_rank = 0;
};
std::string EncodeRank(const RankRecord& r);
StatusOr<RankRecord> DecodeRank(const std::string& id, const std::string& text);

// rounds/<round>: who formed it, node ids in group-rank order.
struct RoundHistory {
  int round = 0;
  int world_size = 0;
  std::vector<std::string> nodes;
  std::vector<std::string> spares;
};
StatusOr<RoundHistory> DecodeRound(const std::string& text);

struct Outcome {
  bool success = false;
  int exit_code = 0;
  std::string reason;
  std::string root_node_id;
  std::string root_report_json;  // as in Report
};

struct JobDoc {
  std::uint64_t job = 1;  // a new job on a run id whose job ended and whose agents all left
  int gathering = 0;      // +1 at every "stop and rejoin"
  rdzv::State state;
  std::string stop_reason;
  bool stop_spends_restart = false;
  std::string stop_kind;           // rdzv::StopAndRejoin::kind
  std::int64_t stop_fault_ms = 0;  // when the fault was, wall milliseconds; 0: not said
  std::string last_failure;        // one line, for status
  int world_size = 0;              // of the last round
  std::optional<Outcome> outcome;
  // The decider that wrote it judges slow ranks job-wide (stragglers.h): always written true;
  // false in a document of a crun before it, whose agents judge their own ranks alone.
  bool judges_stragglers = true;
  // The lease that every key of the run is bound to once the job has its outcome (Retention);
  // 0: none yet, or retention off.
  std::int64_t retention_lease = 0;
  // The decision that formed the running round, as its ranks/ records name it; empty in a
  // document of a crun before them.
  std::string ranks_token;
};
// Times are written as wall-clock milliseconds and read back against this machine's clocks
// (`now` and `wall` taken together): agents on different hosts agree to within their clocks'
// skew, which moves deadlines of seconds by that much.
std::string EncodeJob(const JobDoc& doc, rdzv::TimePoint now, WallClock::time_point wall);
StatusOr<JobDoc> DecodeJob(const std::string& json, rdzv::TimePoint now,
                           WallClock::time_point wall);

// What is under the prefix, as a watch keeps it.
using Mirror = std::map<std::string, KeyValue>;

// What agents other than the decider read (a/job): `doc` without who has joined, the deadlines
// and who has succeeded, so that it stays the same while a round gathers or ends, and without
// the members unless one of them reserved ports (--contract). The spares stay: a node kept as
// one while the round runs learns it when they change.
std::string EncodePublicJob(const JobDoc& doc, rdzv::TimePoint now, WallClock::time_point wall);

// How long a finished job's keys outlive it (--rdzv-conf etcd_retention; 0: until removed by
// hand), and the lease granted for that when the decision before asked (needs_lease).
struct Retention {
  std::chrono::seconds ttl{0};  // off: what options default to is kDefaultRetention
  std::int64_t lease = 0;
};

struct Decision {
  bool write = false;  // the state changed: write it (and `ops`) if it is still at...
  std::int64_t job_mod_revision = 0;  // ...this revision (0: it does not exist yet)
  std::string job_json;               // the state (the public a/job, when it changed, in ops)
  std::int64_t job_lease = 0;         // the state's lease (the retention's, once it ends)
  // The job has ended and no retention lease was given: grant one of Retention.ttl and decide
  // again with it (this decision binds nothing).
  bool needs_lease = false;
  std::vector<Op> ops;  // to apply in the same transaction
  // A round formed: each node's ranks/ record, to write before that transaction (in
  // transactions of at most kMaxTxnOps, each only while the state is still at
  // job_mod_revision), so that a node that reads a/job's new round finds its own.
  std::vector<Op> rank_ops;
  std::vector<std::string> log;            // what was decided, one line each
  std::optional<rdzv::TimePoint> wake_at;  // decide again then (a deadline), if nothing else
  Status error = Status::Ok();  // the mirror cannot be decided on (the layout, a corrupt doc)
};

// The node that decides (a/decider); empty when none.
std::string Decider(const Keys& keys, const Mirror& mirror);

// Folds everything the mirror says into the job document (see the file comment).
Decision Decide(const Keys& keys, const Mirror& mirror, rdzv::TimePoint now,
                WallClock::time_point wall, const Retention& retention = {});

// The job as `crun status` shows it.
StatusOr<rdzv::msg::JobStatus> StatusOf(const Keys& keys, const std::string& run_id,
                                        const Mirror& mirror, rdzv::TimePoint now,
                                        WallClock::time_point wall);

}  // namespace crun::etcd
