#include "rendezvous/service/job_status.h"

#include <chrono>

namespace crun::rdzv {

int ExitCodeOf(const msg::FailureReport& report) {
  if (report.failures.empty()) return 1;
  const auto& f = report.failures.front();
  if (f.signal) return 128 + *f.signal;
  return f.exit_code.value_or(0) != 0 ? *f.exit_code : 1;
}

std::string Describe(const msg::FailureReport& report) {
  if (report.failures.empty()) return "a worker on " + report.host + " failed";
  const auto& f = report.failures.front();
  std::string how = f.signal ? "signal " + std::to_string(*f.signal)
                             : "exit code " + std::to_string(f.exit_code.value_or(0));
  if (!f.oom.empty()) how += " (" + f.oom + ")";
  if (!f.hang.empty()) how = "a hang: " + f.hang;
  std::string out = "rank " + std::to_string(f.rank) + " (local rank " +
                    std::to_string(f.local_rank) + ") on " + report.host + " failed with " + how;
  if (!f.message.empty()) out += ": " + f.message;
  return out;
}

msg::JobStatus DescribeJob(const std::string& run_id, const State& s, int world_size,
                           const std::string& last_failure, TimePoint now) {
  auto age_ms = [&](TimePoint t) { return std::chrono::duration_cast<Millis>(now - t).count(); };
  msg::JobStatus j;
  j.run_id = run_id;
  j.phase = PhaseName(s.phase);
  j.round = s.round;
  j.restarts_used = s.restarts_used;
  j.max_restarts = s.settings.max_restarts;
  j.min_nodes = s.settings.min_nodes;
  j.max_nodes = s.settings.max_nodes;
  j.world_size = world_size;
  j.last_failure = last_failure;
  j.lost_hosts.assign(s.lost_hosts.begin(), s.lost_hosts.end());
  auto add = [&](const NodeDescription& n, const char* state, int rank) -> msg::NodeStatus& {
    auto& ns = j.nodes.emplace_back();
    ns.node_id = n.node_id;
    ns.host = n.host;
    ns.state = state;
    ns.group_rank = rank;
    ns.nproc = n.nproc;
    return ns;
  };
  // Members are kept in group-rank order.
  int rank = 0;
  for (const auto& m : s.members) {
    add(m.node, m.succeeded ? "succeeded" : "member", rank++).last_heartbeat_ms_ago =
        age_ms(m.last_heartbeat);
  }
  for (const auto& n : s.spares) add(n, "spare", -1);
  for (const auto& n : s.joined) add(n, "joined", -1);
  return j;
}

}  // namespace crun::rdzv
