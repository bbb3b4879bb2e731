// What a rendezvous decides for one node in one round: its place in the job (GroupAssignment)
// and, where the backend exchanges them, the round's other nodes (RoundMember). Every backend
// (agent/rendezvous/rendezvous.h) yields it; the workers' environments are built from it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace crun::agent {

// One node of a round, as the other frameworks' contracts need it (agent/frameworks/contracts.h).
struct RoundMember {
  std::string host;     // its host name (Horovod's local scope)
  std::string address;  // where other nodes' workers reach its workers
  int nproc = 0;        // its workers
  // What it reserved for the round (contracts.h says which port is what).
  std::vector<std::uint16_t> ports;
};

// What the rendezvous decided for this node's group in one attempt.
struct GroupAssignment {
  std::string run_id;
  std::string role = "default";
  int group_rank = 0;        // this node
  int group_world_size = 1;  // nodes
  int local_world_size = 1;  // workers on this node
  int world_size = 1;        // workers in the job
  int base_rank = 0;         // RANK of local rank 0
  int role_world_size = 1;
  int base_role_rank = 0;
  std::string master_addr;  // the attempt's store
  std::uint16_t master_port = 0;
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT
  int max_restarts = 0;
  int round = 0;       // the rendezvous round (logs go to attempt_<round>)
  bool spare = false;  // this node waits outside the round
  // How long the round's gathering waited for enough nodes, where the rendezvous says.
  std::chrono::milliseconds waited_for_nodes{0};
  // Every worker sees LOCAL_RANK=0 and only its own GPU: CUDA_VISIBLE_DEVICES is entry
  // `local_rank` of the parent's list, or `local_rank` itself when the parent set none.
  bool virtual_local_rank = false;
  // Every node of the round in group-rank order, with the ports each reserved; empty where
  // the rendezvous exchanges none (static, one crun per Slurm task).
  std::vector<RoundMember> members;
};

// Who this node is, as every backend's rounds name it.
struct RoundSelf {
  std::string run_id;
  std::string role = "default";
  std::string node_id;
  int nproc = 1;
  int max_restarts = 0;
  bool virtual_local_rank = false;
};

// This node's place in one round, as its backend decided it.
struct RoundPlace {
  int group_rank = 0;  // 0 for a spare
  int group_world_size = 1;
  int world_size = 1;
  int base_rank = 0;  // RANK of local rank 0; 0 for a spare
  int round = 0;
  int restart_count = 0;
  bool spare = false;
  int local_world_size = 0;  // 0: the node's nproc (a Slurm task says its step's)
};

// The one builder of a node's assignment, for every backend: who it is, where the round put it,
// the round's members, and the rule that a job has one role (the role's world is the job's).
// The store's address is the backend's to fill in.
GroupAssignment MakeGroupAssignment(const RoundSelf& self, const RoundPlace& place,
                                    std::vector<RoundMember> members = {});

}  // namespace crun::agent
