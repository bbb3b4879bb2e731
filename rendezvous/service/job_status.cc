#include "rendezvous/service/job_status.h"

#include <chrono>

#include "rendezvous/service/job_goodput.h"

namespace crun::rdzv {

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
  j.unhealthy_reports = s.unhealthy_reports;
  for (const auto& u : s.unhealthy) {
    if (s.present.count(u.node_id) != 0 || s.member_index.count(u.node_id) != 0) continue;
    NodeDescription n;
    n.node_id = u.node_id;
    n.host = u.host;
    n.nproc = 0;
    add(n, "unhealthy", -1).reason = u.reason;
  }
  return j;
}

void DescribeGoodput(const std::vector<goodput::NodeLedger>& nodes, msg::JobStatus& job) {
  if (nodes.empty()) return;
  for (auto& n : job.nodes) {
    for (const auto& l : nodes) {
      if (l.node != n.node_id) continue;
      n.goodput = FiguresOf(l.totals, l.incidents.size(), l.steps_known, l.progress_known);
    }
  }
  const goodput::JobLedger combined = goodput::Combine(nodes);
  job.goodput = FiguresOf(combined.totals, combined.incidents.size(), combined.steps_known,
                          combined.progress_known);
}

}  // namespace crun::rdzv
