#include "agent/rendezvous/etcd/assignment.h"

#include <algorithm>
#include <vector>

#include "rendezvous/service/rules.h"

namespace crun::agent {

std::optional<GroupAssignment> EtcdAssignment(const etcd::JobDoc& doc, const EtcdSelf& self) {
  const auto& s = doc.state;
  std::vector<rdzv::NodeDescription> nodes;
  for (const auto& m : s.members) nodes.push_back(m.node);
  int rank = -1;
  int base = 0;
  for (const auto& a : rdzv::AssignRanks(nodes)) {
    if (a.node_id != self.node_id) continue;
    rank = a.group_rank;
    base = a.base_rank;
    break;
  }
  const bool spare = std::any_of(s.spares.begin(), s.spares.end(),
                                 [&](const auto& n) { return n.node_id == self.node_id; });
  if (rank < 0 && !spare) return std::nullopt;
  GroupAssignment g;
  g.run_id = self.run_id;
  g.role = self.role;
  g.local_world_size = self.nproc;
  g.restart_count = s.restarts_used;
  g.max_restarts = self.max_restarts;
  g.round = s.round;
  g.virtual_local_rank = self.virtual_local_rank;
  g.group_world_size = static_cast<int>(s.members.size());
  for (const auto& m : s.members) {
    g.members.push_back({m.node.host, m.node.address, m.node.nproc, m.node.ports});
  }
  g.world_size = doc.world_size;
  g.role_world_size = doc.world_size;
  if (spare) {
    g.spare = true;
  } else {
    g.group_rank = rank;
    g.base_rank = base;
    g.base_role_rank = base;
  }
  return g;
}

}  // namespace crun::agent
