// The agent's view of the rendezvous: "give me this node's assignment for the next round".
// Implementations: the in-process one for a single node (launcher/local_rendezvous.h), and
// the multi-node service's client over gRPC (issue 4).
#pragma once

#include "agent/worker_env.h"
#include "rendezvous/store/status.h"

namespace crun::agent {

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  // The assignment for round `attempt`; its MASTER_ADDR:MASTER_PORT is a store nobody used
  // before, so a restarted worker can never read a key of an earlier attempt.
  virtual StatusOr<GroupAssignment> NextRound(int attempt) = 0;
  // Closes the last round's store.
  virtual void Shutdown() = 0;
};

}  // namespace crun::agent
