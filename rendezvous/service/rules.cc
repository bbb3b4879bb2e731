#include "rendezvous/service/rules.h"

#include <algorithm>

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

// Forms a round from the joined nodes: the first max_nodes in rank order take part, the rest
// are spares.
Transition Form(State s) {
  auto ordered = RankOrder(s.joined);
  FormRound round;
  round.round = ++s.round;
  const int members = std::min<int>(static_cast<int>(ordered.size()), s.settings.max_nodes);
  int world = 0;
  for (int i = 0; i < members; ++i) world += ordered[static_cast<std::size_t>(i)].nproc;
  int base = 0;
  for (int i = 0; i < members; ++i) {
    const auto& n = ordered[static_cast<std::size_t>(i)];
    round.assignments.push_back({n.node_id, i, members, base, world});
    base += n.nproc;
  }
  for (std::size_t i = static_cast<std::size_t>(members); i < ordered.size(); ++i) {
    round.spares.push_back(ordered[i].node_id);
  }
  s.phase = Phase::kRunning;
  s.join_deadline.reset();
  s.last_call_deadline.reset();
  Transition t{std::move(s), {std::move(round)}, std::nullopt};
  return t;
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
  if (s.phase == Phase::kRunning) {
    return refuse("round " + std::to_string(s.round) + " is running (joining a running job "
                  "comes with scale-up)");
  }
  const bool taken = std::any_of(s.joined.begin(), s.joined.end(),
                                 [&](const auto& n) { return n.node_id == node.node_id; });
  if (taken) return refuse("another agent already joined as node '" + node.node_id + "'");
  if (node.nproc < 1) return refuse("nproc " + std::to_string(node.nproc) + " must be >= 1");

  s.joined.push_back(node);
  if (!s.join_deadline) s.join_deadline = now + s.settings.join_timeout;
  const int count = static_cast<int>(s.joined.size());
  if (count >= s.settings.max_nodes) return Form(std::move(s));
  if (count >= s.settings.min_nodes && !s.last_call_deadline) {
    s.last_call_deadline = now + s.settings.last_call_timeout;
  }
  Transition t{s, {}, EarliestDeadline(s)};
  return t;
}

Transition OnTick(const State& state, TimePoint now) {
  State s = state;
  if (s.phase != Phase::kGathering) return {s, {}, std::nullopt};
  const int count = static_cast<int>(s.joined.size());
  if (s.last_call_deadline && now >= *s.last_call_deadline && count >= s.settings.min_nodes) {
    return Form(std::move(s));
  }
  if (s.join_deadline && now >= *s.join_deadline && count < s.settings.min_nodes) {
    s.phase = Phase::kFailed;
    std::string reason = "only " + std::to_string(count) + " of at least " +
                         std::to_string(s.settings.min_nodes) + " nodes joined within " +
                         std::to_string(s.settings.join_timeout.count()) + " ms (joined: " +
                         Hosts(s.joined) + ")";
    Transition t{std::move(s), {FailJob{std::move(reason)}}, std::nullopt};
    return t;
  }
  Transition t{s, {}, EarliestDeadline(s)};
  return t;
}

}  // namespace crun::rdzv
