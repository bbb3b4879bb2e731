// Builds each worker's environment: the one place where the contract of env_names.h is
// written (docs/environment.md). Pure: no I/O, the parent environment is passed in.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace crun::agent {

using Environment = std::map<std::string, std::string>;

// This process's environment as a map.
Environment CurrentEnvironment();

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
  // Every worker sees LOCAL_RANK=0 and only its own GPU: CUDA_VISIBLE_DEVICES is entry
  // `local_rank` of the parent's list, or `local_rank` itself when the parent set none.
  bool virtual_local_rank = false;
  // Every node of the round in group-rank order, with the ports each reserved; empty where
  // the rendezvous exchanges none (static, one crun per Slurm task).
  std::vector<RoundMember> members;
};

// `base` updated with the contract for `local_rank`; `error_file` may be empty (then
// TORCHELASTIC_ERROR_FILE is set empty, as torchrun does without a log directory).
Environment BuildWorkerEnvironment(const GroupAssignment& group, int local_rank,
                                   const std::string& error_file,
                                   const std::string& attempt_log_dir, const Environment& base);

// What crun gives a worker for hang detection and stack reading (docs/hangs.md); -1 or empty:
// not given.
struct HangChannels {
  int heartbeat_fd = -1;  // CRUN_HEARTBEAT_FD
  int stacks_fd = -1;     // CRUN_STACKS_FD, with CRUN_STACKS_SAFE_SIGNAL and CRUN_STACKS_SIGNAL
  int stacks_safe_signal = 0;
  int stacks_signal = 0;
  std::string python_dir;  // put first on PYTHONPATH (the hook's sitecustomize.py)
  std::string timer_file;  // TORCHELASTIC_TIMER_FILE
};
void AddHangChannels(const HangChannels& channels, Environment& env);

// "KEY=VALUE" strings for execve.
std::vector<std::string> ToEnvp(const Environment& env);

}  // namespace crun::agent
