// What crun reads from a Slurm job step (docs/slurm.md): the step's nodes from its hostlist
// expression, expanded here (no `scontrol`, which containers often lack), and the step's and
// task's ids. From them, the settings of the two ways crun runs under srun:
//   - one crun per node (`srun --ntasks-per-node=1 crun --nproc-per-node 4 train`): node
//     ranks in Slurm's node order, the rendezvous on the step's first node;
//   - one crun per worker (`srun --ntasks-per-node=4 crun --slurm-direct train`): each task's
//     RANK, LOCAL_RANK, ... from SLURM_PROCID, SLURM_LOCALID, ..., task 0 hosting the store.
// Global rank 0 is on the first node of the step in both, the host MASTER_ADDR names.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "launcher/getenv.h"

namespace crun::launcher {

// Expands a Slurm hostlist: "node[01-04,07]", "gpu-a[1-2]-ib,cpu7", "r[1-2]-n[1-3]" (several
// bracket groups: the product, first group outermost), zero padding kept ("[08-10]" gives
// 08, 09, 10). A malformed list is an error naming it and what is wrong.
StatusOr<std::vector<std::string>> ExpandHostlist(std::string_view list);

// Expands SLURM_TASKS_PER_NODE's form: "4(x2),3" -> 4, 4, 3.
StatusOr<std::vector<int>> ExpandTasksPerNode(std::string_view value);

// The job step this process belongs to, from SLURM_* variables.
struct SlurmStep {
  std::string job_id;              // SLURM_JOB_ID
  std::string step_id;             // SLURM_STEP_ID
  std::vector<std::string> nodes;  // SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST), expanded
  int node_id = 0;                 // SLURM_NODEID: this node's index in `nodes`
  // Task-level, for one worker per task; -1 when Slurm did not set them.
  int proc_id = -1;                 // SLURM_PROCID
  int local_id = -1;                // SLURM_LOCALID
  int ntasks = -1;                  // SLURM_STEP_NUM_TASKS (or SLURM_NTASKS)
  std::vector<int> tasks_per_node;  // SLURM_STEP_TASKS_PER_NODE (or SLURM_TASKS_PER_NODE)
};

// True when this process runs inside a job step (SLURM_JOB_ID and SLURM_STEP_ID are set).
bool InSlurmStep(const Getenv& getenv = {});

// Reads the step; a missing or malformed variable is an error naming it and its value.
StatusOr<SlurmStep> ReadSlurmStep(const Getenv& getenv = {});

// The port of the step's rendezvous (one crun per node) or store (one per worker) when the
// user gives none: 10000 + (8 * job id + step id) mod 22000, so it is the same on every node
// of the step, differs between the steps of a job, and stays below Linux's ephemeral range.
int SlurmDefaultPort(const SlurmStep& step);

// One crun per node.
struct SlurmNodeSettings {
  int nnodes = 1;
  int node_rank = 0;   // SLURM_NODEID
  std::string run_id;  // "slurm-<job>.<step>"
  std::string host;    // the step's first node: rendezvous host and MASTER_ADDR
  int port = 0;
  bool is_host = false;   // this node hosts the rendezvous
  std::string node_name;  // this node in the step's list: its rendezvous node id
};
SlurmNodeSettings NodeSettings(const SlurmStep& step, int port);

// One crun per worker: the torchrun environment of this task.
struct SlurmTaskSettings {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int group_rank = 0;        // the node
  int group_world_size = 1;  // nodes
  std::string master_addr;   // the step's first node: task 0's host
  int master_port = 0;
  std::string run_id;
};
// Needs the task-level variables; an error names the one missing or inconsistent.
StatusOr<SlurmTaskSettings> TaskSettings(const SlurmStep& step, int port);

}  // namespace crun::launcher
