#include "agent/rendezvous/etcd/assignment.h"

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

}  // namespace crun::agent
