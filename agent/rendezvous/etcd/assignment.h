// The etcd rendezvous's assignment role: what a node makes of the job document the decider
// publishes (rendezvous/etcd/job.h). Pure: the document and who this node is in, its group
// assignment for the round out (ranks as the decider's rules assign them from the members), or
// nothing when the round does not include it.
#pragma once

#include <optional>
#include <string>

#include "agent/rendezvous/assignment.h"
#include "rendezvous/etcd/job.h"

namespace crun::agent {

// Who this node is, as the rounds name it.
struct EtcdSelf {
  std::string run_id;
  std::string role = "default";
  std::string node_id;
  int nproc = 1;
  int max_restarts = 0;
  bool virtual_local_rank = false;
};

// This node's assignment in `doc`'s round, a spare's when it waits outside it, without the
// store's address (the round's group rank 0 serves it: HostsRoundStore). Nothing when this node
// is neither a member nor a spare: the decider has not taken its join yet.
std::optional<GroupAssignment> EtcdAssignment(const etcd::JobDoc& doc, const EtcdSelf& self);

// Whether `g`'s node serves the round's store: group rank 0 of the round, not a spare.
inline bool HostsRoundStore(const GroupAssignment& g) { return !g.spare && g.group_rank == 0; }

}  // namespace crun::agent
