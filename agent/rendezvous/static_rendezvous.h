// The static rendezvous: the one without crun's service or etcd (service_rendezvous.h,
// etcd_rendezvous.h), for a fixed set of nodes: one node (torchrun's standalone), torchrun's
// static backend, and one crun per Slurm task. The assignment is computed in-process; on one node
// each round's store is a fresh crun store on the agent's own event loop (so a restarted worker
// never reads a key of an earlier attempt).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/io_context.hpp>

#include "agent/rendezvous/assignment.h"
#include "agent/rendezvous/rendezvous.h"
#include "rendezvous/rules/settings.h"

namespace crun::agent {

struct StaticRendezvousOptions {
  std::string run_id;
  std::string role = "default";
  int nproc = 1;
  // The job's settings, as the other backends take them: its nodes (max_nodes), its restart
  // budget and crash-loop limit, run through the same rules (rdzv::OnFailure), join_timeout
  // (how long to wait for the other crun processes on the shared store) and its contracts.
  rdzv::Settings settings;
  std::string host;                      // this host's name (the round's member)
  std::string store_host = "127.0.0.1";  // where the round's store listens; workers' MASTER_ADDR
  std::uint16_t store_port = 0;          // 0: a free port each round
  bool virtual_local_rank = false;
  // The static backend (torchrun's): a fixed number of nodes with fixed ranks, one store at
  // master_addr:master_port hosted by node 0 for the whole job; restarts are per node.
  int node_rank = 0;
  bool static_store = false;  // keep one store (fixed port) for every round
  bool host_store = true;     // false on nodes other than 0: the store is elsewhere
  // Where the hosted store listens when that is not store_host itself: the interface address
  // other nodes reach store_host by ("::", every interface, only when none is known).
  std::string bind_host;
  // One crun per Slurm task (docs/slurm.md): the ranks and sizes come from Slurm, not from
  // node_rank x nproc. Its master_port is filled in from the store.
  std::optional<RoundPlace> fixed_group;
  int first_local_rank = 0;  // a Slurm task's SLURM_LOCALID (its one worker's local rank)
  // --contract with ports (agent/frameworks/contracts.h) on a shared static store: where this
  // crun's workers are reached (--local-addr; empty: the address this host reaches the store from).
  std::string advertise_addr;
  // --health-check (docs/health.md): every crun waits on the store for all the others, with or
  // without ports, before its workers start: a node whose gate kept it out is then named at
  // exchange_timeout rather than leaving the others' workers waiting in their own rendezvous.
  bool wait_for_all = false;
  // With a static store shared by several crun processes (nnodes > 1, or a fixed_group of
  // several tasks), each says on the store when its workers are done, and the store's host
  // keeps serving after its own workers ended until all have said so, for at most this long:
  // workers elsewhere may still be using the store (their last barrier, a late connect).
  std::chrono::milliseconds store_linger{30000};
};

// Runs on `io`'s thread (NextRound starts the store there).
std::unique_ptr<Rendezvous> MakeStaticRendezvous(boost::asio::io_context& io,
                                                 const StaticRendezvousOptions& options);

}  // namespace crun::agent
