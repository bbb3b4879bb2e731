// What the workers of this node can use: GPUs for --nproc-per-node gpu|auto, and where each
// GPU sits for --numa-binding. Read from the file system, never from a GPU library (crun links
// none): /dev/nvidia<N> for the devices present, CUDA_VISIBLE_DEVICES for those the workers
// will see, and sysfs for PCI addresses and NUMA nodes.
//
// Every path is read under a root, "" for the real machine; tests pass a directory of invented
// devices and topologies (CRUN_SYSTEM_ROOT when testing the whole program).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace crun::launcher {

// CRUN_SYSTEM_ROOT, else "": the root under which /dev and /sys are read.
std::string SystemRoot();

// The indices N of root/dev/nvidia<N> (gaps allowed), ascending.
std::vector<int> NvidiaDeviceIndices(const std::string& root);

// How many GPUs a CUDA program started here would see, as CUDA counts them: with
// CUDA_VISIBLE_DEVICES set, its entries up to the first invalid one (an index that is not
// present, a repeat, something neither an index nor a GPU-/MIG- UUID); "" or "-1" hide every
// device. Unset: the devices present.
int CountVisibleGpus(const std::vector<int>& present,
                     const std::optional<std::string>& cuda_visible_devices);

// --nproc-per-node: a positive number, cpu (CPUs online), gpu (visible GPUs; an error if
// none), auto (visible GPUs, else CPUs). xpu and other device types torchrun counts through
// PyTorch are refused with a message naming the value.
StatusOr<int> ResolveNproc(const std::string& value, const std::string& root,
                           const std::optional<std::string>& cuda_visible_devices, int cpus);

}  // namespace crun::launcher
