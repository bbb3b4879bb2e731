// Rendezvous rules: pure functions of (state, event, now) that return the next state and the
// actions to take. No I/O, threads or clocks: the engine (engine.h) and etcd's decider feed
// events and apply actions; tests drive the rules as tables with invented times.
// docs/rendezvous.md.
//
// Rounds: nodes join; a round forms at once when max_nodes have joined, or when the last-call
// window closes with at least min_nodes; nodes beyond max_nodes are spares; too few nodes by
// the join deadline fail the job. While a round runs: a worker failure anywhere stops every
// node and re-forms (one job-wide restart budget); a lost node (dropped session, or no
// heartbeat within heartbeat_timeout) re-forms without spending the budget; a late joiner
// triggers a scale-up round while below max_nodes and is a spare otherwise; too many rounds
// too fast (membership changes, not restarts paid from the budget) is a restart storm and fails
// the job; when every member succeeds, the job does.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

#include "base/status.h"
#include "rendezvous/contracts/contract_set.h"
#include "rendezvous/report/report.h"
#include "rendezvous/rules/settings.h"

namespace crun::rdzv {

using TimePoint = std::chrono::steady_clock::time_point;

// The job's restart budget (--max-restarts), one rule for every rendezvous (the service's
// rules, etcd's decider through them, and one node or the static backend): a failure restarts
// the job while fewer than `max` restarts were used, spending one (true); otherwise the job
// ends (false, nothing spent).
inline bool SpendRestart(int& used, int max) {
  if (used >= max) return false;
  ++used;
  return true;
}

// A node's workers failed, as the rules weigh it (FailureOf makes it from the node's report).
struct Failure {
  std::string what;       // report::Describe: the restart's reason
  std::string cause;      // report::DescribeCause
  std::string last_line;  // report::LastTracebackLine of the root cause
  std::string way;        // report::FailureWay: equal ways failed the same way
  bool before_progress = false;
};
Failure FailureOf(const report::FailureReport& report);

// Failures in a row that failed the same way (docs/health.md), one rule for every rendezvous, as
// SpendRestart is: `attempts` counts those before any progress (a failure after progress starts
// it over), `repeats` those with or without (--max-repeated-failures). Another way starts both
// over.
struct CrashLoop {
  std::string way;  // the last failure's
  int attempts = 0;
  int repeats = 0;
};
// Counts `f` into `loop`; true when `attempts` has reached `limit` (limit 0: never).
bool CountCrash(CrashLoop& loop, const Failure& f, int limit);
// "crash loop: rank 3 (local rank 1) on node-b failed with exit code 1 in 3 attempts before
// any step: ValueError: ..." and the option that stopped it.
std::string DescribeCrashLoop(const Failure& f, int attempts);

struct FailJob;
// A failure of the job's workers, weighed by the one rule every rendezvous runs (the service's
// rules, etcd's decider through them, each static node, followers included): a crash loop ends
// the job first, asking not to be requeued (even with restarts left); else a restart is spent,
// or, with none left, the job ends "(after N restarts)". nullopt: restart (one spent).
std::optional<FailJob> OnFailure(int& restarts_used, CrashLoop& loop, const Failure& f,
                                 const Settings& settings);

struct NodeDescription {
  std::string node_id;  // unique per agent: a second agent with the same id is refused
  std::string host;
  int nproc = 1;
  // A scheduler-imposed order (Slurm's node index); nodes without one come after, by host.
  std::optional<int> requested_rank;
  // Opaque to the rules, passed to the round's members: where other nodes reach this one's
  // workers, and the ports it reserved for them (--contract).
  std::string address;
  std::vector<std::uint16_t> ports;
};

struct Assignment {
  std::string node_id;
  int group_rank = 0;
  int group_world_size = 0;
  int base_rank = 0;   // RANK of the node's local rank 0
  int world_size = 0;  // workers in the round
};

// Ranks from members, the one assignment function of every rendezvous that forms rounds (the
// service's rules, and etcd's agents reading the round the decider formed): `nodes` in
// group-rank order; node i is group rank i, and its workers are the ranks from the number of
// workers of the nodes before it.
std::vector<Assignment> AssignRanks(const std::vector<NodeDescription>& nodes);

// The refusal of a second node that claims `rank`, naming the host that holds it and the one
// refused: the same words on every backend.
std::string RankClaimedTwice(int rank, const std::string& holder, const std::string& claimant);

// Actions the engine carries out.
struct FormRound {
  int round = 0;
  int restart_count = 0;                // job-wide: TORCHELASTIC_RESTART_COUNT on every node
  std::vector<Assignment> assignments;  // in group-rank order
  std::vector<std::string> spares;      // joined, kept for a node that is lost
  // How long the gathering waited for enough nodes (min_nodes): from its start until the last
  // of them joined. The goodput ledger's "waiting" (docs/observability.md).
  std::chrono::milliseconds waited_for_nodes{0};
};
struct RefuseJoin {
  enum class Kind { kSettingsMismatch, kJobEnded, kDuplicateNode, kInvalid };
  std::string node_id;
  std::string reason;
  Kind kind = Kind::kInvalid;
};
struct FailJob {
  std::string reason;
  int exit_code = 0;  // the job's, when not the root cause's (a crash loop's)
};
// The exit code of a job that `fail` ended: its own when it has one, else that of the failure
// that decided (`root_exit`), else 1. The service and etcd both answer with it.
int FailedJobExitCode(const FailJob& fail, std::optional<int> root_exit);
// Every node stops its workers now and joins again (pushed to all nodes at once).
struct StopAndRejoin {
  std::string reason;
  bool spends_restart = false;  // a failure (true) or a membership change (false)
  // What stopped the job, for the goodput ledger's incident: kStopPeer (a worker failed),
  // kStopNodeLost, kStopScaleUp; and how long before this the fault was (a lost node's last
  // heartbeat; 0 where it is now).
  std::string kind;
  std::chrono::milliseconds fault_ago{0};
};
inline constexpr char kStopPeer[] = "peer";
inline constexpr char kStopNodeLost[] = "node lost";
inline constexpr char kStopScaleUp[] = "scale-up";
struct SucceedJob {};
// A node that joined a running round that is full: it is kept as a spare, and told so now
// rather than at the next round, so that it can say it waits.
struct KeepAsSpare {
  std::string node_id;
  int round = 0;
  int restart_count = 0;
};
using Action = std::variant<FormRound, RefuseJoin, FailJob, StopAndRejoin, SucceedJob, KeepAsSpare>;

enum class Phase { kGathering, kRunning, kFailed, kSucceeded };
// "gathering", "running", "failed", "succeeded": in status and in etcd's job document.
const char* PhaseName(Phase p);

// A node that failed its health gate (docs/health.md) and stayed out: who, and why.
struct UnhealthyNode {
  std::string node_id;
  std::string host;
  std::string reason;
};
inline constexpr std::size_t kMaxUnhealthyKept = 16;  // the newest, for status and reports

struct Member {
  NodeDescription node;
  TimePoint last_heartbeat;
  bool succeeded = false;
};

struct State {
  Settings settings;
  Phase phase = Phase::kGathering;
  int round = -1;                       // the last round formed
  std::vector<NodeDescription> joined;  // in join order, while gathering
  std::optional<TimePoint> join_deadline;
  std::optional<TimePoint> last_call_deadline;
  std::vector<Member> members;          // the running round's nodes
  std::vector<NodeDescription> spares;  // connected, outside the round
  // The last round's members (ids, in group-rank order) that the next round prefers, as long
  // as they come back within the last call: their workers' state is where they run (the
  // snapshot store), so a spare that rejoins faster does not take their place. A lost one
  // is left out.
  std::vector<std::string> previous;
  std::unordered_set<std::string> previous_awaited;  // of `previous`, those not joined yet
  std::vector<std::string> lost_hosts;               // node ids of lost nodes, for reports
  // Nodes whose health gate failed, newest last (at most kMaxUnhealthyKept; one per node id),
  // and how many reports came in all.
  std::vector<UnhealthyNode> unhealthy;
  int unhealthy_reports = 0;
  int restarts_used = 0;
  CrashLoop crash_loop;  // the failures in a row before any progress, and how they failed
  // The rounds that count towards a restart storm: those formed after a membership change.
  // Restarts paid from the budget do not count (max_restarts is their limit).
  std::vector<TimePoint> round_times;
  bool paid_round = false;  // the gathering under way follows a restart paid from the budget
  // Indexes, so that an event costs O(1) whatever the number of nodes:
  std::unordered_set<std::string> present;                    // ids in joined, members, spares
  std::unordered_map<std::string, std::size_t> member_index;  // id -> position in members
  int members_succeeded = 0;
};

// The functions take the state by value: the engine moves it in (no copy, whatever its size)
// and tests pass copies.
struct Transition {
  State state;
  std::vector<Action> actions;
  // When Tick must be called next (a deadline). nullopt: the previous deadline still holds
  // (or, once the job has ended, none is needed). A Tick earlier than needed is harmless.
  std::optional<TimePoint> wake_at;
};

// A node asks to join the current gathering.
Transition OnJoin(State state, const NodeDescription& node, const Settings& its_settings,
                  TimePoint now);
// Time passed: deadlines may have expired, heartbeats may be missing.
Transition OnTick(State state, TimePoint now);
Transition OnHeartbeat(State state, const std::string& node_id, TimePoint now);
// A worker on `node_id` failed, as `failure` says.
Transition OnWorkerFailed(State state, const std::string& node_id, const Failure& failure,
                          TimePoint now);
// The node's session broke (agent died) or the engine gave up on it.
// `cause` ends the reason every node prints: "node h (id) was lost: <cause>". `last_heard`:
// when it was last heard of (its last heartbeat), the fault's time; now when not given.
Transition OnNodeLost(State state, const std::string& node_id, TimePoint now,
                      const std::string& cause, std::optional<TimePoint> last_heard = std::nullopt);
// A node failed its health gate and stays out of the job (it leaves after saying so): it is
// counted, named in status, and in the reason if too few nodes join; were it waiting in the
// gathering or as a spare, it no longer is.
Transition OnUnhealthy(State state, const UnhealthyNode& node, TimePoint now);
// Every worker of the node succeeded.
Transition OnNodeSucceeded(State state, const std::string& node_id, TimePoint now);

// The order of group ranks: requested rank first (ascending), then host, then node id.
std::vector<NodeDescription> RankOrder(std::vector<NodeDescription> nodes);

}  // namespace crun::rdzv
