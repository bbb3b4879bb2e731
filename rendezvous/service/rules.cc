#include "rendezvous/service/rules.h"

#include <algorithm>

namespace crun::rdzv {
namespace {

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) {
    if (!out.empty()) out += ", ";
    out += i;
  }
  return out;
}

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

// Forms a round from the joined nodes: the first max_nodes in rank order take part, the rest
// are spares.
Transition Form(State s, TimePoint now) {
  std::vector<TimePoint> recent;
  for (auto t : s.round_times) {
    if (now - t < s.settings.storm_window) recent.push_back(t);
  }
  if (static_cast<int>(recent.size()) >= s.settings.storm_rounds) {
    s.phase = Phase::kFailed;
    std::string reason = "restart storm: " + std::to_string(recent.size() + 1) + " rounds within " +
                         std::to_string(s.settings.storm_window.count()) + " ms" +
                         (s.lost_hosts.empty() ? std::string() : " (lost: " + Join(s.lost_hosts) + ")");
    return Transition{std::move(s), {FailJob{std::move(reason)}}, std::nullopt};
  }
  recent.push_back(now);
  s.round_times = std::move(recent);
  auto ordered = RankOrder(s.joined);
  FormRound round;
  round.round = ++s.round;
  round.restart_count = s.restarts_used;
  const int members = std::min<int>(static_cast<int>(ordered.size()), s.settings.max_nodes);
  int world = 0;
  for (int i = 0; i < members; ++i) world += ordered[static_cast<std::size_t>(i)].nproc;
  int base = 0;
  s.members.clear();
  s.spares.clear();
  for (int i = 0; i < members; ++i) {
    const auto& n = ordered[static_cast<std::size_t>(i)];
    round.assignments.push_back({n.node_id, i, members, base, world});
    s.members.push_back({n, now, false});
    base += n.nproc;
  }
  for (std::size_t i = static_cast<std::size_t>(members); i < ordered.size(); ++i) {
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
Transition Regather(State s, std::string reason, bool spends_restart, TimePoint now) {
  s.phase = Phase::kGathering;
  s.members.clear();
  s.spares.clear();
  s.joined.clear();
  s.join_deadline = now + s.settings.join_timeout;
  s.last_call_deadline.reset();
  auto wake = s.join_deadline;
  return Transition{std::move(s), {StopAndRejoin{std::move(reason), spends_restart}}, wake};
}

}  // namespace

Status Settings::Validate() const {
  if (min_nodes < 1) return InvalidArgument("min nodes (" + std::to_string(min_nodes) + ") must be >= 1");
  if (max_nodes < min_nodes) {
    return InvalidArgument("max nodes (" + std::to_string(max_nodes) + ") must be >= min nodes (" +
                           std::to_string(min_nodes) + ")");
  }
  auto positive = [](const char* name, Millis v) -> Status {
    if (v.count() > 0) return Status::Ok();
    return InvalidArgument(std::string(name) + " (" + std::to_string(v.count()) +
                           " ms) must be positive");
  };
  CRUN_RETURN_IF_ERROR(positive("join_timeout", join_timeout));
  CRUN_RETURN_IF_ERROR(positive("heartbeat_timeout", heartbeat_timeout));
  if (last_call_timeout.count() < 0) {
    return InvalidArgument("last_call_timeout (" + std::to_string(last_call_timeout.count()) +
                           " ms) must not be negative");
  }
  if (max_restarts < 0) {
    return InvalidArgument("max restarts (" + std::to_string(max_restarts) + ") must be >= 0");
  }
  return Status::Ok();
}

Status Settings::CheckCompatible(const Settings& o) const {
  auto differ = [](const char* what, const std::string& mine, const std::string& theirs) {
    return InvalidArgument(std::string(what) + " differs: this job uses " + mine +
                           ", the joining agent " + theirs);
  };
  if (o.min_nodes != min_nodes || o.max_nodes != max_nodes) {
    return differ("--nnodes", std::to_string(min_nodes) + ":" + std::to_string(max_nodes),
                  std::to_string(o.min_nodes) + ":" + std::to_string(o.max_nodes));
  }
  if (o.max_restarts != max_restarts) {
    return differ("--max-restarts", std::to_string(max_restarts), std::to_string(o.max_restarts));
  }
  return Status::Ok();
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

Transition OnJoin(const State& state, const NodeDescription& node, const Settings& its_settings,
                  TimePoint now) {
  State s = state;
  auto refuse = [&](std::string why) {
    Transition t{s, {RefuseJoin{node.node_id, std::move(why)}}, EarliestDeadline(s)};
    return t;
  };
  if (auto c = state.settings.CheckCompatible(its_settings); !c.ok()) return refuse(c.message());
  if (s.phase == Phase::kFailed) return refuse("the job has already failed");
  if (s.phase == Phase::kSucceeded) return refuse("the job has already finished");
  const bool taken =
      std::any_of(s.joined.begin(), s.joined.end(),
                  [&](const auto& n) { return n.node_id == node.node_id; }) ||
      std::any_of(s.members.begin(), s.members.end(),
                  [&](const auto& m) { return m.node.node_id == node.node_id; }) ||
      std::any_of(s.spares.begin(), s.spares.end(),
                  [&](const auto& n) { return n.node_id == node.node_id; });
  if (taken) return refuse("another agent already joined as node '" + node.node_id + "'");
  if (node.nproc < 1) return refuse("nproc " + std::to_string(node.nproc) + " must be >= 1");
  if (s.phase == Phase::kRunning) {
    if (static_cast<int>(s.members.size()) >= s.settings.max_nodes) {
      s.spares.push_back(node);  // held for a node that is lost
      return Transition{s, {}, now + s.settings.heartbeat_timeout};
    }
    // Scale-up: a membership change, not a failure.
    auto t = Regather(std::move(s), "node " + node.host + " joined: scaling up", false, now);
    t.state.joined.push_back(node);
    return t;
  }

  s.joined.push_back(node);
  if (!s.join_deadline) s.join_deadline = now + s.settings.join_timeout;
  const int count = static_cast<int>(s.joined.size());
  if (count >= s.settings.max_nodes) return Form(std::move(s), now);
  if (count >= s.settings.min_nodes && !s.last_call_deadline) {
    s.last_call_deadline = now + s.settings.last_call_timeout;
  }
  Transition t{s, {}, EarliestDeadline(s)};
  return t;
}

Transition OnTick(const State& state, TimePoint now) {
  State s = state;
  if (s.phase == Phase::kRunning) {
    // A node whose workers all succeeded is done: its silence is no loss.
    for (const auto& m : s.members) {
      if (!m.succeeded && now - m.last_heartbeat >= s.settings.heartbeat_timeout) {
        return OnNodeLost(s, m.node.node_id, now);
      }
    }
    TimePoint next = now + s.settings.heartbeat_timeout;
    for (const auto& m : s.members) {
      if (!m.succeeded) next = std::min(next, m.last_heartbeat + s.settings.heartbeat_timeout);
    }
    return {s, {}, next};
  }
  if (s.phase != Phase::kGathering) return {s, {}, std::nullopt};
  const int count = static_cast<int>(s.joined.size());
  if (s.last_call_deadline && now >= *s.last_call_deadline && count >= s.settings.min_nodes) {
    return Form(std::move(s), now);
  }
  if (s.join_deadline && now >= *s.join_deadline && count < s.settings.min_nodes) {
    s.phase = Phase::kFailed;
    std::string reason = "only " + std::to_string(count) + " of at least " +
                         std::to_string(s.settings.min_nodes) + " nodes joined within " +
                         std::to_string(s.settings.join_timeout.count()) + " ms (joined: " +
                         Hosts(s.joined) + ")" +
                         (s.lost_hosts.empty() ? std::string()
                                               : "; lost: " + Join(s.lost_hosts));
    Transition t{std::move(s), {FailJob{std::move(reason)}}, std::nullopt};
    return t;
  }
  Transition t{s, {}, EarliestDeadline(s)};
  return t;
}

Transition OnHeartbeat(const State& state, const std::string& node_id, TimePoint now) {
  State s = state;
  for (auto& m : s.members) {
    if (m.node.node_id == node_id) m.last_heartbeat = now;
  }
  return OnTick(s, now);
}

Transition OnWorkerFailed(const State& state, const std::string& node_id, const std::string& what,
                          TimePoint now) {
  State s = state;
  const bool member = std::any_of(s.members.begin(), s.members.end(),
                                  [&](const auto& m) { return m.node.node_id == node_id; });
  if (s.phase != Phase::kRunning || !member) return {s, {}, std::nullopt};  // already handled
  if (s.restarts_used >= s.settings.max_restarts) {
    s.phase = Phase::kFailed;
    std::string reason = what + (s.settings.max_restarts > 0
                                     ? " (after " + std::to_string(s.restarts_used) + " restarts)"
                                     : std::string());
    return {std::move(s), {FailJob{std::move(reason)}}, std::nullopt};
  }
  ++s.restarts_used;
  return Regather(std::move(s), what, true, now);
}

Transition OnNodeLost(const State& state, const std::string& node_id, TimePoint now) {
  State s = state;
  auto spare = std::find_if(s.spares.begin(), s.spares.end(),
                            [&](const auto& n) { return n.node_id == node_id; });
  if (spare != s.spares.end()) {  // a spare leaving changes nothing that runs
    s.spares.erase(spare);
    return {s, {}, s.phase == Phase::kRunning ? std::optional(now + s.settings.heartbeat_timeout)
                                              : EarliestDeadline(s)};
  }
  auto joined = std::find_if(s.joined.begin(), s.joined.end(),
                             [&](const auto& n) { return n.node_id == node_id; });
  if (joined != s.joined.end()) {
    s.lost_hosts.push_back(joined->host);
    s.joined.erase(joined);
    if (static_cast<int>(s.joined.size()) < s.settings.min_nodes) s.last_call_deadline.reset();
    return {s, {}, EarliestDeadline(s)};
  }
  auto member = std::find_if(s.members.begin(), s.members.end(),
                             [&](const auto& m) { return m.node.node_id == node_id; });
  if (s.phase != Phase::kRunning || member == s.members.end()) return {s, {}, std::nullopt};
  if (member->succeeded) return {s, {}, now + s.settings.heartbeat_timeout};  // done already
  const std::string host = member->node.host;
  s.lost_hosts.push_back(host);
  // A membership change: survivors and spares re-join; the budget is not spent.
  return Regather(std::move(s), "node " + host + " (" + node_id + ") was lost", false, now);
}

Transition OnNodeSucceeded(const State& state, const std::string& node_id, TimePoint now) {
  State s = state;
  for (auto& m : s.members) {
    if (m.node.node_id == node_id) m.succeeded = true;
  }
  if (s.phase == Phase::kRunning &&
      std::all_of(s.members.begin(), s.members.end(), [](const auto& m) { return m.succeeded; })) {
    s.phase = Phase::kSucceeded;
    return {std::move(s), {SucceedJob{}}, std::nullopt};
  }
  return OnTick(s, now);
}

}  // namespace crun::rdzv
