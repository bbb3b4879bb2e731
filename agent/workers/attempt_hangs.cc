#include "agent/workers/attempt_hangs.h"

#include <spdlog/spdlog.h>

#include "proto/protocol_version.h"

namespace crun::agent {
namespace {

std::string DirectoryOf(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

HangResponderOptions ResponderOptionsOf(const AgentOptions& o) {
  return {o.host_name,      o.entrypoint, o.log_dir,
          o.stack_deadline, o.tool_path,  o.command.empty() ? "" : DirectoryOf(o.command[0])};
}

}  // namespace

AttemptHangs::AttemptHangs(boost::asio::io_context& io, const AgentOptions& options,
                           WorkerGroup& workers, Rendezvous& rendezvous,
                           const lifecycle::State& state, const GroupAssignment& group,
                           JobProgress& progress, Concluded concluded)
    : options_(options),
      workers_(workers),
      rendezvous_(rendezvous),
      state_(state),
      group_(group),
      concluded_(std::move(concluded)),
      watch_(
          io, options.hang_timeout, [this](std::vector<WorkerProgress> p) { OnHang(p); },
          options.hang_after_steps),
      responder_(
          io, workers.children(), ResponderOptionsOf(options), [this] { return Targets(); },
          [this](const std::string& why, std::chrono::milliseconds timeout,
                 std::function<void(RemoteStacks)> done) {
            rendezvous_.AskStacks(why, timeout, std::move(done));
          },
          [this](int attempt) { return lifecycle::IsLive(state_, attempt); },
          [this](int attempt, HangReport h, std::chrono::system_clock::time_point when,
                 std::chrono::steady_clock::time_point declared) {
            std::vector<int> hung;
            for (const auto& r : h.ranks) {
              if (r.hung) hung.push_back(r.local_rank);
            }
            concluded_(attempt, std::move(hung), std::move(h), when, declared);
          }) {
  if (options.hang_after_steps > 0) {
    progress.Listen({nullptr, [this](int lr, const StepRecord&) { watch_.Stepped(lr); }, nullptr});
  }
}

std::vector<StackTarget> AttemptHangs::Targets() const {
  std::vector<StackTarget> targets;
  for (const auto& w : workers_.workers()) {
    if (!w.running) continue;
    targets.push_back(
        {options_.host_name, group_.base_rank + w.local_rank, w.local_rank, w.pid, w.stacks.get()});
  }
  return targets;
}

// A hang was declared: read every rank's stacks while all still run.
void AttemptHangs::OnHang(const std::vector<WorkerProgress>& progress) {
  if (state_.phase != lifecycle::Phase::kRunning) return;
  responder_.OnHang(HangAttempt{state_.attempt, group_.round, group_.restart_count,
                                group_.base_rank, group_.run_id},
                    progress);
}

void AttemptHangs::AnswerStacksRequest(std::uint64_t id, const std::string& reason) {
  if (state_.phase != lifecycle::Phase::kRunning) {
    return rendezvous_.ReplyStacks(id, options_.host_name, {}, "no workers running");
  }
  const bool hang = reason != crun::kStacksCommandReason;
  if (hang) spdlog::warn("reading this node's stacks for another node: {}", reason);
  responder_.ReadStacks([this, id, reason, hang, n = state_.attempt,
                         round = group_.round](const std::vector<RankStacks>& s) {
    rendezvous_.ReplyStacks(id, options_.host_name, s, "");
    if (hang && n == state_.attempt) responder_.ShowForOtherNode(round, reason, s);
  });
}

}  // namespace crun::agent
