#include "rendezvous/rules/rules.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

namespace crun::rdzv {
namespace {

std::string Hosts(const std::vector<NodeDescription>& nodes) {
  std::string out;
  for (const auto& n : nodes) {
    if (!out.empty()) out += ", ";
    out += n.host;
  }
  return out.empty() ? "none" : out;
}

std::optional<TimePoint> EarliestDeadline(const State& s) {
  if (s.phase != Phase::kGathering) return std::nullopt;
  std::optional<TimePoint> t = s.join_deadline;
  if (s.last_call_deadline && (!t || *s.last_call_deadline < *t)) t = s.last_call_deadline;
  return t;
}

// While running: when the first unfinished member's heartbeat runs out.
std::optional<TimePoint> NextHeartbeatDeadline(const State& s, TimePoint now) {
  TimePoint next = now + s.settings.heartbeat_timeout;
  for (const auto& m : s.members) {
    if (!m.succeeded) next = std::min(next, m.last_heartbeat + s.settings.heartbeat_timeout);
  }
  return next;
}

}  // namespace

std::vector<Assignment> AssignRanks(const std::vector<NodeDescription>& nodes) {
  int world = 0;
  for (const auto& n : nodes) world += n.nproc;
  std::vector<Assignment> out;
  out.reserve(nodes.size());
  int base = 0;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    out.push_back(
        {nodes[i].node_id, static_cast<int>(i), static_cast<int>(nodes.size()), base, world});
    base += nodes[i].nproc;
  }
  return out;
}

namespace {

// Forms a round from the joined nodes: the first max_nodes in rank order take part, the rest
// are spares.
// A round after a restart paid from the budget is no storm round: max_restarts bounds those.
// `ordered` with the last round's members first, in their order there (so that their ranks
// stay where their state is); where a node asked for a rank, that order stands.
std::vector<NodeDescription> PreferPrevious(std::vector<NodeDescription> ordered,
                                            const std::vector<std::string>& previous) {
  if (previous.empty()) return ordered;
  for (const auto& n : ordered) {
    if (n.requested_rank) return ordered;
  }
  std::unordered_map<std::string, std::size_t> place;
  for (std::size_t i = 0; i < previous.size(); ++i) place.emplace(previous[i], i);
  std::stable_sort(ordered.begin(), ordered.end(), [&](const auto& a, const auto& b) {
    const auto pa = place.find(a.node_id), pb = place.find(b.node_id);
    const std::size_t ka = pa == place.end() ? previous.size() : pa->second;
    const std::size_t kb = pb == place.end() ? previous.size() : pb->second;
    return ka < kb;
  });
  return ordered;
}

Transition Form(State s, TimePoint now) {
  std::vector<TimePoint> recent;
  for (auto t : s.round_times) {
    if (now - t < s.settings.storm_window) recent.push_back(t);
  }
  const bool paid = std::exchange(s.paid_round, false);
  if (!paid && static_cast<int>(recent.size()) >= s.settings.storm_rounds) {
    s.phase = Phase::kFailed;
    std::string reason =
        "restart storm: " + std::to_string(recent.size() + 1) + " rounds within " +
        std::to_string(s.settings.storm_window.count()) + " ms" +
        (s.lost_hosts.empty() ? std::string()
                              : fmt::format(" (lost: {})", fmt::join(s.lost_hosts, ", ")));
    return Transition{std::move(s), {FailJob{std::move(reason)}}, std::nullopt};
  }
  if (!paid) recent.push_back(now);
  s.round_times = std::move(recent);
  auto ordered = PreferPrevious(RankOrder(s.joined), s.previous);
  s.previous.clear();
  s.previous_awaited.clear();
  FormRound round;
  round.round = ++s.round;
  round.restart_count = s.restarts_used;
  const auto members =
      std::min<std::size_t>(ordered.size(), static_cast<std::size_t>(s.settings.max_nodes));
  const std::vector<NodeDescription> chosen(ordered.begin(),
                                            ordered.begin() + static_cast<std::ptrdiff_t>(members));
  round.assignments = AssignRanks(chosen);
  // The gathering began when its deadline was set; enough nodes were there when its last call
  // was (or now, where max_nodes came at once).
  if (s.join_deadline) {
    const TimePoint began = *s.join_deadline - s.settings.join_timeout;
    const TimePoint enough =
        s.last_call_deadline ? *s.last_call_deadline - s.settings.last_call_timeout : now;
    round.waited_for_nodes =
        std::max(std::chrono::duration_cast<std::chrono::milliseconds>(enough - began),
                 std::chrono::milliseconds(0));
  }
  s.members.clear();
  s.member_index.clear();
  s.members_succeeded = 0;
  s.spares.clear();
  for (const auto& n : chosen) {
    s.member_index[n.node_id] = s.members.size();
    s.members.push_back({n, now, false});
  }
  for (std::size_t i = members; i < ordered.size(); ++i) {
    round.spares.push_back(ordered[i].node_id);
    s.spares.push_back(ordered[i]);
  }
  s.joined.clear();
  s.phase = Phase::kRunning;
  s.join_deadline.reset();
  s.last_call_deadline.reset();
  return Transition{std::move(s), {std::move(round)}, now + s.settings.heartbeat_timeout};
}

// Everyone stops and joins again; a new gathering starts now.
// "; failed their health check: h3 (node-c): gpu: GPU 1 has 2 uncorrectable ECC errors ..."
std::string DescribeUnhealthy(const std::vector<UnhealthyNode>& nodes) {
  std::string out;
  for (const auto& n : nodes) {
    out += (out.empty() ? "; failed their health check: " : "; ") + n.host + " (" + n.node_id +
           "): " + n.reason;
  }
  return out;
}

Transition Regather(State s, std::string reason, bool spends_restart, TimePoint now,
                    std::string kind, TimePoint fault_at) {
  s.previous.clear();
  for (const auto& m : s.members) s.previous.push_back(m.node.node_id);
  s.previous_awaited = {s.previous.begin(), s.previous.end()};
  s.phase = Phase::kGathering;
  s.members.clear();
  s.member_index.clear();
  s.members_succeeded = 0;
  s.spares.clear();
  s.joined.clear();
  s.present.clear();  // everyone joins again
  s.join_deadline = now + s.settings.join_timeout;
  s.last_call_deadline.reset();
  s.paid_round = spends_restart;
  auto wake = s.join_deadline;
  const auto ago = std::chrono::duration_cast<std::chrono::milliseconds>(now - fault_at);
  return Transition{std::move(s),
                    {StopAndRejoin{std::move(reason), spends_restart, std::move(kind),
                                   std::max(ago, std::chrono::milliseconds(0))}},
                    wake};
}

}  // namespace

Status Settings::Validate() const {
  if (min_nodes < 1)
    return InvalidArgument("min nodes (" + std::to_string(min_nodes) + ") must be >= 1");
  if (max_nodes < min_nodes) {
    return InvalidArgument("max nodes (" + std::to_string(max_nodes) + ") must be >= min nodes (" +
                           std::to_string(min_nodes) + ")");
  }
  if (max_nodes > kMaxNodes) {
    return InvalidArgument("max nodes (" + std::to_string(max_nodes) +
                           ") must be <= " + std::to_string(kMaxNodes));
  }
  auto positive = [](const char* name, Millis v) -> Status {
    if (v.count() > kMaxTimeout.count()) {
      return InvalidArgument(std::string(name) + " (" + std::to_string(v.count()) +
                             " ms) must be at most 30 days");
    }
    if (v.count() > 0) return Status::Ok();
    return InvalidArgument(std::string(name) + " (" + std::to_string(v.count()) +
                           " ms) must be positive");
  };
  CRUN_RETURN_IF_ERROR(positive("join_timeout", join_timeout));
  CRUN_RETURN_IF_ERROR(positive("heartbeat_timeout", heartbeat_timeout));
  if (last_call_timeout.count() < 0 || last_call_timeout > kMaxTimeout) {
    return InvalidArgument("last_call_timeout (" + std::to_string(last_call_timeout.count()) +
                           " ms) must be 0 to 30 days");
  }
  if (max_restarts < 0) {
    return InvalidArgument("max restarts (" + std::to_string(max_restarts) + ") must be >= 0");
  }
  if (max_restarts_without_progress < 0) {
    return InvalidArgument("max restarts without progress (" +
                           std::to_string(max_restarts_without_progress) + ") must be >= 0");
  }
  if (max_repeated_failures < 0) {
    return InvalidArgument("max repeated failures (" + std::to_string(max_repeated_failures) +
                           ") must be >= 0");
  }
  if (!contracts.Known()) {
    return InvalidArgument("--contract " + contracts.ToString() +
                           " names contracts this crun does not know (is the agent newer?)");
  }
  return Status::Ok();
}

Status Settings::CheckCompatible(const Settings& o) const {
  auto differ = [](const char* what, const std::string& mine, const std::string& theirs) {
    return InvalidArgument(std::string(what) + " differs: this job uses " + mine +
                           ", the joining agent " + theirs);
  };
  auto text = [](const SettingField& f, const Settings& s) {
    return f.kind == SettingField::Kind::kContracts ? s.contracts.ToString()
                                                    : std::to_string(f.get(s));
  };
  // The fields that every agent must give alike, in the list's order; fields that share a flag
  // (--nnodes: min and max) are said together, "min:max".
  const auto& fields = SettingFields();
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (fields[i].agree == nullptr) continue;
    const std::string flag = fields[i].agree;
    std::string mine, theirs;
    bool same = true;
    for (std::size_t k = i; k < fields.size() && fields[k].agree && fields[k].agree == flag; ++k) {
      mine += (k > i ? ":" : "") + text(fields[k], *this);
      theirs += (k > i ? ":" : "") + text(fields[k], o);
      same = same && fields[k].get(*this) == fields[k].get(o);
      i = k;
    }
    if (!same) return differ(flag.c_str(), mine, theirs);
  }
  return Status::Ok();
}

const char* PhaseName(Phase p) {
  switch (p) {
    case Phase::kGathering:
      return "gathering";
    case Phase::kRunning:
      return "running";
    case Phase::kFailed:
      return "failed";
    case Phase::kSucceeded:
      return "succeeded";
  }
  return "?";
}

std::vector<NodeDescription> RankOrder(std::vector<NodeDescription> nodes) {
  std::stable_sort(nodes.begin(), nodes.end(), [](const auto& a, const auto& b) {
    if (a.requested_rank.has_value() != b.requested_rank.has_value()) {
      return a.requested_rank.has_value();  // imposed ranks first
    }
    if (a.requested_rank && *a.requested_rank != *b.requested_rank) {
      return *a.requested_rank < *b.requested_rank;
    }
    if (a.host != b.host) return a.host < b.host;
    return a.node_id < b.node_id;
  });
  return nodes;
}

std::string RankClaimedTwice(int rank, const std::string& holder, const std::string& claimant) {
  return "node rank " + std::to_string(rank) + " is claimed twice: by host " + holder +
         " (in the job) and by host " + claimant +
         "; give each node its own (--node-rank, PET_NODE_RANK, JOB_COMPLETION_INDEX)";
}

namespace {

// Another host's node that was given the same rank as `node` (by --node-rank, a pod's index
// or Slurm): two nodes that would both run as that rank. The same host's is its earlier agent,
// restarted (a pod the controller restarted keeps its host name): it may wait as a spare.
// Scans only for a node with an imposed rank.
const NodeDescription* RankClaimedElsewhere(const State& s, const NodeDescription& node) {
  if (!node.requested_rank) return nullptr;
  auto other = [&](const NodeDescription& d) {
    return d.requested_rank == node.requested_rank && d.host != node.host;
  };
  for (const auto& d : s.joined) {
    if (other(d)) return &d;
  }
  for (const auto& m : s.members) {
    if (other(m.node)) return &m.node;
  }
  for (const auto& d : s.spares) {
    if (other(d)) return &d;
  }
  return nullptr;
}

}  // namespace

Transition OnJoin(State s, const NodeDescription& node, const Settings& its_settings,
                  TimePoint now) {
  using Kind = RefuseJoin::Kind;
  auto refuse = [&](std::string why, Kind kind) {
    Transition t{s, {RefuseJoin{node.node_id, std::move(why), kind}}, EarliestDeadline(s)};
    return t;
  };
  if (auto c = s.settings.CheckCompatible(its_settings); !c.ok()) {
    return refuse(c.message(), Kind::kSettingsMismatch);
  }
  if (s.phase == Phase::kFailed) return refuse("the job has already failed", Kind::kJobEnded);
  if (s.phase == Phase::kSucceeded) return refuse("the job has already finished", Kind::kJobEnded);
  if (s.present.count(node.node_id) != 0) {
    return refuse("another agent already joined as node '" + node.node_id + "'",
                  Kind::kDuplicateNode);
  }
  if (const NodeDescription* holder = RankClaimedElsewhere(s, node)) {
    return refuse(RankClaimedTwice(*node.requested_rank, holder->host, node.host),
                  Kind::kDuplicateNode);
  }
  if (node.nproc < 1 || node.nproc > kMaxNprocPerNode) {
    return refuse("nproc " + std::to_string(node.nproc) + " must be 1 to " +
                      std::to_string(kMaxNprocPerNode),
                  Kind::kInvalid);
  }
  // Exactly what its contracts' port layout says (rendezvous/contracts/contract_set.h).
  if (auto fits = PortLayout(its_settings.contracts, node.nproc).Check(node.ports.size());
      !fits.ok()) {
    return refuse(fits.message(), Kind::kInvalid);
  }
  if (s.phase == Phase::kRunning) {
    if (static_cast<int>(s.members.size()) >= s.settings.max_nodes) {
      s.spares.push_back(node);  // held for a node that is lost
      s.present.insert(node.node_id);
      auto wake = NextHeartbeatDeadline(s, now);
      std::vector<Action> told{KeepAsSpare{node.node_id, s.round, s.restarts_used}};
      return Transition{std::move(s), std::move(told), wake};
    }
    // Scale-up: a membership change, not a failure.
    auto t = Regather(std::move(s), "node " + node.host + " joined: scaling up", false, now,
                      kStopScaleUp, now);
    t.state.joined.push_back(node);
    t.state.present.insert(node.node_id);
    return t;
  }

  s.joined.push_back(node);
  s.present.insert(node.node_id);
  s.previous_awaited.erase(node.node_id);
  if (!s.join_deadline) s.join_deadline = now + s.settings.join_timeout;
  const int count = static_cast<int>(s.joined.size());
  // Full: formed at once, unless a member of the last round is still on its way back (its
  // workers stopping): then at the last call, with it if it came.
  if (count >= s.settings.max_nodes && s.previous_awaited.empty()) return Form(std::move(s), now);
  if (count >= s.settings.min_nodes && !s.last_call_deadline) {
    s.last_call_deadline = now + s.settings.last_call_timeout;
  }
  auto wake = EarliestDeadline(s);
  return Transition{std::move(s), {}, wake};
}

Transition OnTick(State s, TimePoint now) {
  if (s.phase == Phase::kRunning) {
    // A node whose workers all succeeded is done: its silence is no loss.
    for (const auto& m : s.members) {
      if (!m.succeeded && now - m.last_heartbeat >= s.settings.heartbeat_timeout) {
        const std::string id = m.node.node_id;
        const auto silent =
            std::chrono::duration_cast<std::chrono::milliseconds>(now - m.last_heartbeat);
        const TimePoint last = m.last_heartbeat;
        return OnNodeLost(std::move(s), id, now,
                          "no heartbeat for " + std::to_string(silent.count()) +
                              " ms (heartbeat_timeout " +
                              std::to_string(s.settings.heartbeat_timeout.count()) + " ms)",
                          last);
      }
    }
    auto wake = NextHeartbeatDeadline(s, now);
    return {std::move(s), {}, wake};
  }
  if (s.phase != Phase::kGathering) return {std::move(s), {}, std::nullopt};
  const int count = static_cast<int>(s.joined.size());
  if (s.last_call_deadline && now >= *s.last_call_deadline && count >= s.settings.min_nodes) {
    return Form(std::move(s), now);
  }
  if (s.join_deadline && now >= *s.join_deadline && count < s.settings.min_nodes) {
    s.phase = Phase::kFailed;
    std::string reason =
        "only " + std::to_string(count) + " of at least " + std::to_string(s.settings.min_nodes) +
        " nodes joined within " + std::to_string(s.settings.join_timeout.count()) +
        " ms (joined: " + Hosts(s.joined) + ")" +
        (s.lost_hosts.empty() ? std::string()
                              : fmt::format("; lost: {}", fmt::join(s.lost_hosts, ", "))) +
        DescribeUnhealthy(s.unhealthy);
    Transition t{std::move(s), {FailJob{std::move(reason)}}, std::nullopt};
    return t;
  }
  auto wake = EarliestDeadline(s);
  return Transition{std::move(s), {}, wake};
}

// Cheap: heartbeats arrive from every node every interval. The engine's next Tick does the
// scan for silent nodes.
Transition OnHeartbeat(State s, const std::string& node_id, TimePoint now) {
  if (auto it = s.member_index.find(node_id); it != s.member_index.end()) {
    s.members[it->second].last_heartbeat = now;
  }
  return {std::move(s), {}, std::nullopt};
}

Failure FailureOf(const report::FailureReport& report) {
  const std::string last =
      report.failures.empty() ? "" : report::LastTracebackLine(report.failures.front());
  return {report::Describe(report), report::DescribeCause(report), last, report::FailureWay(report),
          report.before_progress};
}

int FailedJobExitCode(const FailJob& fail, std::optional<int> root_exit) {
  if (fail.exit_code != 0) return fail.exit_code;
  return root_exit.value_or(1);
}

bool CountCrash(CrashLoop& loop, const Failure& f, int limit) {
  const bool same = !f.way.empty() && f.way == loop.way;
  loop.repeats = f.way.empty() ? 0 : (same ? loop.repeats + 1 : 1);
  loop.attempts = !f.before_progress || f.way.empty() ? 0 : (same ? loop.attempts + 1 : 1);
  loop.way = f.way;
  return limit > 0 && loop.attempts >= limit;
}

std::string DescribeCrashLoop(const Failure& f, int attempts) {
  return "crash loop: " + f.cause + " in " + std::to_string(attempts) +
         " attempts before any step" + (f.last_line.empty() ? "" : ": " + f.last_line) +
         " (--max-restarts-without-progress " + std::to_string(attempts) +
         "; the job itself is broken: exit code " + std::to_string(report::kExitDoNotRequeue) +
         " asks the scheduler not to requeue it)";
}

std::optional<FailJob> OnFailure(int& restarts_used, CrashLoop& loop, const Failure& f,
                                 const Settings& settings) {
  // Before the budget: a loop that ends with the budget still asks not to be requeued.
  if (CountCrash(loop, f, settings.max_restarts_without_progress)) {
    return FailJob{DescribeCrashLoop(f, loop.attempts), report::kExitDoNotRequeue};
  }
  // The same failure after every resume: the job, not the machines, is broken.
  if (settings.max_repeated_failures > 0 && loop.repeats >= settings.max_repeated_failures) {
    return FailJob{"repeated failure: " + f.cause + " in " + std::to_string(loop.repeats) +
                       " attempts in a row, progress or not" +
                       (f.last_line.empty() ? "" : ": " + f.last_line) +
                       " (--max-repeated-failures " + std::to_string(loop.repeats) +
                       "; the job itself is broken: exit code " +
                       std::to_string(report::kExitDoNotRequeue) +
                       " asks the scheduler not to requeue it)",
                   report::kExitDoNotRequeue};
  }
  if (SpendRestart(restarts_used, settings.max_restarts)) return std::nullopt;
  return FailJob{f.what + (settings.max_restarts > 0
                               ? " (after " + std::to_string(restarts_used) + " restarts)"
                               : std::string())};
}

Transition OnWorkerFailed(State s, const std::string& node_id, const Failure& failure,
                          TimePoint now) {
  const std::string& what = failure.what;
  const bool member = s.member_index.count(node_id) != 0;
  if (s.phase != Phase::kRunning || !member) return {std::move(s), {}, std::nullopt};  // handled
  if (auto fail = OnFailure(s.restarts_used, s.crash_loop, failure, s.settings)) {
    s.phase = Phase::kFailed;
    return {std::move(s), {std::move(*fail)}, std::nullopt};
  }
  return Regather(std::move(s), what, true, now, kStopPeer, now);
}

Transition OnNodeLost(State s, const std::string& node_id, TimePoint now, const std::string& cause,
                      std::optional<TimePoint> last_heard) {
  s.present.erase(node_id);
  // A lost member of the last round is not waited for; where it was the last one awaited, a
  // full gathering forms now.
  std::erase(s.previous, node_id);
  if (s.previous_awaited.erase(node_id) != 0 && s.previous_awaited.empty() &&
      s.phase == Phase::kGathering && static_cast<int>(s.joined.size()) >= s.settings.max_nodes) {
    return Form(std::move(s), now);
  }
  auto spare = std::find_if(s.spares.begin(), s.spares.end(),
                            [&](const auto& n) { return n.node_id == node_id; });
  if (spare != s.spares.end()) {  // a spare leaving changes nothing that runs
    s.spares.erase(spare);
    auto wake = s.phase == Phase::kRunning ? NextHeartbeatDeadline(s, now) : EarliestDeadline(s);
    return {std::move(s), {}, wake};
  }
  auto joined = std::find_if(s.joined.begin(), s.joined.end(),
                             [&](const auto& n) { return n.node_id == node_id; });
  if (joined != s.joined.end()) {
    s.lost_hosts.push_back(node_id);  // the id: several nodes may share a host name
    s.joined.erase(joined);
    if (static_cast<int>(s.joined.size()) < s.settings.min_nodes) s.last_call_deadline.reset();
    auto wake = EarliestDeadline(s);
    return {std::move(s), {}, wake};
  }
  auto index = s.member_index.find(node_id);
  if (s.phase != Phase::kRunning || index == s.member_index.end()) {
    return {std::move(s), {}, std::nullopt};
  }
  const Member& member = s.members[index->second];
  if (member.succeeded) {  // done already
    auto wake = NextHeartbeatDeadline(s, now);
    return {std::move(s), {}, wake};
  }
  const std::string host = member.node.host;
  s.lost_hosts.push_back(node_id);
  // A membership change: survivors and spares re-join; the budget is not spent.
  auto t = Regather(std::move(s), "node " + host + " (" + node_id + ") was lost: " + cause, false,
                    now, kStopNodeLost, last_heard.value_or(now));
  std::erase(t.state.previous, node_id);
  t.state.previous_awaited.erase(node_id);
  return t;
}

Transition OnUnhealthy(State s, const UnhealthyNode& node, TimePoint now) {
  ++s.unhealthy_reports;
  std::erase_if(s.unhealthy, [&](const UnhealthyNode& u) { return u.node_id == node.node_id; });
  s.unhealthy.push_back(node);
  if (s.unhealthy.size() > kMaxUnhealthyKept) s.unhealthy.erase(s.unhealthy.begin());
  if (s.member_index.count(node.node_id) != 0 && s.phase == Phase::kRunning) {
    // A member runs no health gate; a report from one is its loss, as a dropped session is.
    return OnNodeLost(std::move(s), node.node_id, now, "it failed its health check");
  }
  s.present.erase(node.node_id);
  std::erase_if(s.spares, [&](const NodeDescription& n) { return n.node_id == node.node_id; });
  const auto before = s.joined.size();
  std::erase_if(s.joined, [&](const NodeDescription& n) { return n.node_id == node.node_id; });
  if (s.joined.size() != before && static_cast<int>(s.joined.size()) < s.settings.min_nodes) {
    s.last_call_deadline.reset();
  }
  if (s.phase != Phase::kGathering) return {std::move(s), {}, std::nullopt};
  auto wake = EarliestDeadline(s);
  return {std::move(s), {}, wake};
}

Transition OnNodeSucceeded(State s, const std::string& node_id, TimePoint /*now*/) {
  if (auto it = s.member_index.find(node_id); it != s.member_index.end()) {
    Member& m = s.members[it->second];
    if (!m.succeeded) ++s.members_succeeded;
    m.succeeded = true;
  }
  if (s.phase == Phase::kRunning && s.members_succeeded == static_cast<int>(s.members.size())) {
    s.phase = Phase::kSucceeded;
    return {std::move(s), {SucceedJob{}}, std::nullopt};
  }
  return {std::move(s), {}, std::nullopt};
}

}  // namespace crun::rdzv
