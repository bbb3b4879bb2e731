#include "agent/rendezvous/etcd/assignment.h"

#include <spdlog/spdlog.h>

namespace crun::agent {

std::optional<GroupAssignment> EtcdAssignment(const etcd::JobDoc& doc,
                                              const etcd::RankRecord& place,
                                              const RoundSelf& self) {
  const auto& s = doc.state;
  if (doc.ranks_token.empty() || place.token != doc.ranks_token || place.round != s.round) {
    return std::nullopt;
  }
  std::vector<RoundMember> members;
  for (const auto& m : s.members) {
    members.push_back({m.node.host, m.node.address, m.node.nproc, m.node.ports});
  }
  RoundPlace at{.group_world_size = place.group_world_size,
                .world_size = doc.world_size,
                .round = s.round,
                .restart_count = s.restarts_used,
                .spare = place.spare};
  if (!place.spare) {
    at.group_rank = place.group_rank;
    at.base_rank = place.base_rank;
  }
  return MakeGroupAssignment(self, at, std::move(members));
}

JobOutcome EtcdOutcome(const etcd::Outcome& o) {
  JobOutcome out;
  out.success = o.success;
  out.exit_code = o.exit_code;
  out.reason = o.reason;
  out.root_node_id = o.root_node_id;
  if (!o.root_report_json.empty()) {
    if (auto report = report::FromJson(o.root_report_json); report.ok()) {
      out.root_report = std::move(*report);
    } else {
      spdlog::warn("the job's root cause in etcd cannot be read: {}", report.status().message());
    }
  }
  return out;
}

etcd::Report EtcdFailure(const report::FailureReport& failures) {
  etcd::Report r;
  r.what = report::Describe(failures);
  r.exit_code = report::ExitCodeOf(failures);
  r.report_json = report::ToJson(failures);
  return r;
}

}  // namespace crun::agent
