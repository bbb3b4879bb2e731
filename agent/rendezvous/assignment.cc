#include "agent/rendezvous/assignment.h"

#include <utility>

namespace crun::agent {

GroupAssignment MakeGroupAssignment(const RoundSelf& self, const RoundPlace& place,
                                    std::vector<RoundMember> members) {
  GroupAssignment g;
  g.run_id = self.run_id;
  g.role = self.role;
  g.max_restarts = self.max_restarts;
  g.virtual_local_rank = self.virtual_local_rank;
  g.local_world_size = place.local_world_size > 0 ? place.local_world_size : self.nproc;
  g.group_rank = place.group_rank;
  g.group_world_size = place.group_world_size;
  g.world_size = place.world_size;
  g.base_rank = place.base_rank;
  g.round = place.round;
  g.restart_count = place.restart_count;
  g.spare = place.spare;
  // One role: crun runs every worker of a job in the role it was given.
  g.role_world_size = place.world_size;
  g.base_role_rank = place.base_rank;
  g.members = std::move(members);
  return g;
}

}  // namespace crun::agent
