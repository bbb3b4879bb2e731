// The agent's view of the rendezvous: "give me this node's assignment for the next round".
// On one node (this file) the answer is computed in-process and the round's store is a fresh
// crun store on the agent's own event loop; the multi-node service (#4) implements the same
// interface over gRPC.
#pragma once

#include <memory>

#include <boost/asio/io_context.hpp>

#include "agent/worker_env.h"
#include "rendezvous/server/store_server.h"

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

struct LocalRendezvousOptions {
  std::string run_id;
  std::string role = "default";
  int nproc = 1;
  int max_restarts = 0;
  std::string store_host = "127.0.0.1";  // where the round's store listens; workers' MASTER_ADDR
  std::uint16_t store_port = 0;          // 0: a free port each round
  bool virtual_local_rank = false;
};

// Runs on `io`'s thread (NextRound starts the store there).
std::unique_ptr<Rendezvous> MakeLocalRendezvous(boost::asio::io_context& io,
                                                const LocalRendezvousOptions& options);

}  // namespace crun::agent
