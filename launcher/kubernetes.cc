#include "launcher/kubernetes.h"

#include "base/numbers.h"
#include "rendezvous/rules/rules.h"

namespace crun::launcher {
namespace {

// A crun started by another launcher's worker: its RANK and MASTER_ADDR are that worker's.
bool InWorker(const Getenv& getenv) {
  return EnvValue(getenv, "TORCHELASTIC_RUN_ID") || EnvValue(getenv, "LOCAL_RANK");
}

}  // namespace

bool InPod(const Getenv& getenv) {
  auto host = EnvValue(getenv, "KUBERNETES_SERVICE_HOST");
  return host && !host->empty();
}

StatusOr<PodPlacement> ReadPodPlacement(const GivenPlacement& given, const Getenv& getenv) {
  PodPlacement pod;
  const bool in_pod = InPod(getenv);
  if (InWorker(getenv) || given.standalone) return pod;
  if (in_pod) {
    if (auto v = EnvValue(getenv, "PET_N_PROC_PER_NODE")) {
      pod.notes.push_back("PET_N_PROC_PER_NODE=" + *v +
                          " is not read (an older PyTorchJob's spelling, which torchrun never "
                          "read either): crun reads PET_NPROC_PER_NODE");
    }
  }
  if (!given.node_rank) {
    std::string from;
    std::optional<std::string> value;
    if (auto index = EnvValue(getenv, "JOB_COMPLETION_INDEX")) {
      from = "JOB_COMPLETION_INDEX";
      value = index;
    } else if (auto rank = in_pod ? EnvValue(getenv, "RANK") : std::nullopt) {
      from = "RANK";
      value = rank;
    }
    if (value) {
      auto rank = ParseInteger(*value, 0, rdzv::kMaxNodes);
      if (!rank) {
        return InvalidArgument(from + "='" + *value + "' is not a node rank (0 to " +
                               std::to_string(rdzv::kMaxNodes) + ")");
      }
      pod.node_rank = static_cast<int>(*rank);
      pod.node_rank_from = from + "=" + *value;
      if (!given.nnodes) {
        return InvalidArgument(pod.node_rank_from +
                               " gives this pod's node rank but not the job's node count: set "
                               "PET_NNODES in the pod's environment (docs/kubernetes.md)");
      }
    }
  }
  // PyTorchJob's MASTER_ADDR and MASTER_PORT (it sets no PET_ spelling of them): node 0's store,
  // for a job of several nodes that names it no other way.
  if (in_pod && given.nnodes && !given.endpoint) {
    if (!given.master_addr) pod.master_addr = EnvValue(getenv, "MASTER_ADDR");
    if (!given.master_port) pod.master_port = EnvValue(getenv, "MASTER_PORT");
  }
  if (!pod.node_rank && !pod.master_addr && !pod.master_port) return pod;
  if (pod.node_rank && !given.endpoint && !given.master_addr && !pod.master_addr) {
    return InvalidArgument(pod.node_rank_from +
                           " gives this pod's node rank but not where node 0 is: set "
                           "PET_MASTER_ADDR (pod 0's name under the job's headless Service) and "
                           "PET_MASTER_PORT, or PET_RDZV_ENDPOINT (docs/kubernetes.md)");
  }
  std::vector<std::string> taken;
  if (pod.node_rank) {
    taken.push_back("node rank " + std::to_string(*pod.node_rank) + " from " + pod.node_rank_from);
  }
  if (pod.master_addr) taken.push_back("node 0's store at MASTER_ADDR=" + *pod.master_addr);
  if (pod.master_port) taken.push_back("MASTER_PORT=" + *pod.master_port);
  std::string note = "from the pod's environment:";
  for (std::size_t i = 0; i < taken.size(); ++i) note += (i ? ", " : " ") + taken[i];
  pod.notes.push_back(note);
  return pod;
}

}  // namespace crun::launcher
