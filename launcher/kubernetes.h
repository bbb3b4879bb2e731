// What a Kubernetes controller tells a pod in its environment, as crun reads it when it is the
// container's command (docs/kubernetes.md has each controller's variables and their sources):
//   - Kubeflow Trainer's torch runtime and PyTorchJob set torchrun's PET_* variables, which the
//     flags read already (launch_options.cc);
//   - an Indexed Job (and a JobSet, whose child Jobs are Indexed Jobs) gives only the pod's
//     index, JOB_COMPLETION_INDEX: it is the node rank when nothing else gives one;
//   - an older PyTorchJob gives RANK (the pod's node index), MASTER_ADDR and MASTER_PORT, without
//     the PET_ spellings torchrun reads: crun takes them inside a pod.
// The node rank's order: --node-rank (PET_NODE_RANK), then JOB_COMPLETION_INDEX, then RANK
// (only inside a pod). A worker's environment is never read: a crun started by a worker of
// another launcher (TORCHELASTIC_RUN_ID or LOCAL_RANK set) sees that worker's RANK and
// MASTER_ADDR, not its pod's, and its pod's JOB_COMPLETION_INDEX is not its node rank.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "launcher/getenv.h"

namespace crun::launcher {

// What the launch's own flags (and their PET_* variables) already say.
struct GivenPlacement {
  bool node_rank = false;    // --node-rank, PET_NODE_RANK
  bool nnodes = false;       // --nnodes, PET_NNODES
  bool master_addr = false;  // --master-addr, PET_MASTER_ADDR
  bool master_port = false;  // --master-port, PET_MASTER_PORT
  bool endpoint = false;     // --rdzv-endpoint, PET_RDZV_ENDPOINT
  bool standalone = false;   // --standalone: one node, whatever the pod's index
};

struct PodPlacement {
  std::optional<int> node_rank;
  std::string node_rank_from;              // "JOB_COMPLETION_INDEX=1", for messages
  std::optional<std::string> master_addr;  // PyTorchJob's MASTER_ADDR
  std::optional<std::string> master_port;  // PyTorchJob's MASTER_PORT
  // One line each, for the log: what was taken from the pod, and what crun does not use.
  std::vector<std::string> notes;
};

// --shutdown-timeout's default in a pod. The kubelet sends SIGTERM, then SIGKILL once the pod's
// terminationGracePeriodSeconds (30 s unless set) have passed. crun's stop may take its
// workers' grace and, on the node that hosts a static job's store, as long again for the other
// nodes (StaticRendezvousOptions::store_linger): 2 x 14 s, and crun's report, fit in 30 s.
inline constexpr double kPodShutdownSeconds = 14;

// True inside a Kubernetes pod (KUBERNETES_SERVICE_HOST, which the kubelet sets in every one).
bool InPod(const Getenv& getenv = {});

// The placement the pod's environment adds to `given`. An index without the job's node count,
// or without where node 0 is, is refused naming the variable to set; a malformed one names its
// value.
StatusOr<PodPlacement> ReadPodPlacement(const GivenPlacement& given, const Getenv& getenv = {});

}  // namespace crun::launcher
