// --numa-binding (torchrun 2.x's modes): each local rank's CPUs and memory near the GPU it
// uses, read from sysfs under a root ("" for the real machine; tests invent topologies).
//
// * GPU of a local rank: entry LOCAL_RANK of CUDA_VISIBLE_DEVICES (an index, or a GPU- UUID
//   found in /proc/driver/nvidia/gpus/*/information), else LOCAL_RANK itself, counted over
//   the NVIDIA PCI devices (vendor 0x10de, display class) in PCI bus order — CUDA's order
//   with CUDA_DEVICE_ORDER=PCI_BUS_ID, and its default on nodes of one GPU model.
// * Its NUMA node: /sys/bus/pci/devices/<address>/numa_node (-1, one node: 0).
// * node: every CPU of that node. socket: every CPU of every node on the same socket
//   (physical_package_id). exclusive: the node's physical cores (thread_siblings_list) split
//   evenly among the node's GPUs, lower GPUs taking the remainder. core-complex: one L3 group
//   (the highest-level data/unified cache's shared_cpu_list) per GPU, the largest first.
// * CPUs are always limited to those crun itself may use; memory is bound (MPOL_BIND) to the
//   node(s) whose CPUs were chosen.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/status.h"

namespace crun::launcher {

enum class NumaMode { kNode, kSocket, kExclusive, kCoreComplex };

StatusOr<NumaMode> ParseNumaMode(const std::string& value);

struct NumaBinding {
  int gpu = 0;            // its PCI-order ordinal
  std::string pci;        // "0000:1b:00.0"
  int node = 0;           // its NUMA node
  std::vector<int> cpus;  // ascending
  std::vector<int> mems;  // ascending
};

// The binding of local ranks first .. first + count - 1. `allowed`: the CPUs crun may use.
StatusOr<std::vector<NumaBinding>> PlanNumaBinding(
    NumaMode mode, const std::string& root, int first, int count,
    const std::optional<std::string>& cuda_visible_devices, const std::set<int>& allowed);

// "0-3,8,10-11" <-> {0,1,2,3,8,10,11}; parsing fails on anything else.
std::optional<std::set<int>> ParseCpuList(const std::string& text);
std::string FormatCpuList(const std::vector<int>& cpus);

}  // namespace crun::launcher
