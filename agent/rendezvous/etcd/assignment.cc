#include "agent/rendezvous/etcd/assignment.h"

namespace crun::agent {

std::optional<GroupAssignment> EtcdAssignment(const etcd::JobDoc& doc,
                                              const etcd::RankRecord& place, const EtcdSelf& self) {
  const auto& s = doc.state;
  if (doc.ranks_token.empty() || place.token != doc.ranks_token || place.round != s.round) {
    return std::nullopt;
  }
  GroupAssignment g;
  g.run_id = self.run_id;
  g.role = self.role;
  g.local_world_size = self.nproc;
  g.restart_count = s.restarts_used;
  g.max_restarts = self.max_restarts;
  g.round = s.round;
  g.virtual_local_rank = self.virtual_local_rank;
  g.group_world_size = place.group_world_size;
  for (const auto& m : s.members) {
    g.members.push_back({m.node.host, m.node.address, m.node.nproc, m.node.ports});
  }
  g.world_size = doc.world_size;
  g.role_world_size = doc.world_size;
  g.spare = place.spare;
  if (!place.spare) {
    g.group_rank = place.group_rank;
    g.base_rank = place.base_rank;
    g.base_role_rank = place.base_rank;
  }
  return g;
}

}  // namespace crun::agent
