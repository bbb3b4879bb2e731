// `crun stacks` across a job's nodes (engine.h): a request fanned out to every running node's
// session, the answers gathered up to a size and a deadline, and the whole sent back.
#include <algorithm>

#include "rendezvous/service/engine_job.h"

namespace crun::rdzv {

crun::Status Engine::AskStacks(const std::string& run_id, std::uint64_t query, Millis timeout,
                               TimePoint now) {
  StacksAsk ask;
  ask.run_id = run_id;
  ask.query = query;
  return FanOutStacks(std::move(ask), kStacksCommandReason, std::nullopt, timeout, now).status();
}

crun::StatusOr<std::uint64_t> Engine::FanOutStacks(StacksAsk ask, const std::string& reason,
                                                   std::optional<SessionId> except, Millis timeout,
                                                   TimePoint now) {
  auto it = jobs_.find(ask.run_id);
  if (it == jobs_.end()) return NotFound("no job with run id '" + ask.run_id + "'");
  const Job& job = *it->second;
  if (job.state.phase != Phase::kRunning) {
    return NotFound("job '" + ask.run_id + "' has no running workers (it is " +
                    PhaseName(job.state.phase) + ")");
  }
  if (timeout <= Millis(0)) timeout = std::chrono::seconds(15);
  timeout = std::clamp<Millis>(timeout, std::chrono::seconds(1), std::chrono::seconds(120));
  const std::uint64_t id = next_ask_++;
  ask.deadline = now + timeout;
  ask.result.run_id = ask.run_id;
  ask.result.round = job.state.round;
  for (const auto& m : job.state.members) {
    auto s = job.sessions.find(m.node.node_id);
    if (s == job.sessions.end() || s->second == except || m.succeeded) continue;
    ask.waiting[s->second] = m.node.node_id;
  }
  for (const auto& [session, node] : ask.waiting) {
    hooks_.send(session, msg::StacksRequest{id, reason});
  }
  const bool none = ask.waiting.empty();
  Log(ask.run_id + ": stacks asked of " + std::to_string(ask.waiting.size()) + " nodes (" + reason +
      ")");
  asks_.emplace(id, std::move(ask));
  if (none) CompleteStacks(id);
  return id;
}

void Engine::OnStacksReply(SessionId session, const msg::StacksReply& reply) {
  auto it = asks_.find(reply.request_id);
  if (it == asks_.end()) return;  // late: the answer went out without it
  auto& ask = it->second;
  auto w = ask.waiting.find(session);
  if (w == ask.waiting.end()) return;
  if (ask.bytes + reply.node_stacks.size() > kMaxStacksBytes) {
    ask.result.missing.push_back(w->second +
                                 " (its stacks did not fit in the answer: see that node's "
                                 "own report or run crun stacks there)");
  } else {
    ask.bytes += reply.node_stacks.size();
    ask.result.nodes.push_back(reply.node_stacks);
  }
  ask.waiting.erase(w);
  if (ask.waiting.empty()) CompleteStacks(reply.request_id);
}

void Engine::CompleteStacks(std::uint64_t id) {
  auto it = asks_.find(id);
  if (it == asks_.end()) return;
  StacksAsk ask = std::move(it->second);
  asks_.erase(it);
  for (const auto& [session, node] : ask.waiting) {
    ask.result.missing.push_back(node + " (no answer in time)");
  }
  if (ask.requester) {
    hooks_.send(*ask.requester, ask.result);
  } else if (hooks_.stacks_done) {
    hooks_.stacks_done(ask.query, ask.result);
  }
}

}  // namespace crun::rdzv
