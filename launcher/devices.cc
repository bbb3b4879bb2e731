#include "launcher/devices.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>

#include "base/numbers.h"
#include "base/text.h"

namespace crun::launcher {
namespace {}  // namespace

std::string SystemRoot() {
  const char* root = std::getenv("CRUN_SYSTEM_ROOT");
  return root != nullptr ? root : "";
}

std::vector<int> NvidiaDeviceIndices(const std::string& root) {
  std::vector<int> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root + "/dev", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("nvidia", 0) != 0) continue;
    if (auto n = ParseInteger(std::string_view(name).substr(6), 0, 1 << 20)) {
      out.push_back(static_cast<int>(*n));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

int CountVisibleGpus(const std::vector<int>& present,
                     const std::optional<std::string>& cuda_visible_devices) {
  if (!cuda_visible_devices) return static_cast<int>(present.size());
  std::stringstream in(*cuda_visible_devices);
  std::string item;
  std::set<std::string> seen;
  int count = 0;
  while (std::getline(in, item, ',')) {
    item = std::string(Trim(item));
    const auto index = ParseInteger(item, 0, 1 << 20);
    const bool uuid = item.rfind("GPU-", 0) == 0 || item.rfind("MIG-", 0) == 0;
    // CUDA's index i is the i-th device present, not /dev/nvidia<i>.
    const bool valid = uuid || (index && *index < static_cast<std::int64_t>(present.size()));
    if (!valid || !seen.insert(item).second) break;  // CUDA ignores the rest
    ++count;
  }
  return count;
}

StatusOr<int> ResolveNproc(const std::string& value, const std::string& root,
                           const std::optional<std::string>& cuda_visible_devices, int cpus) {
  auto gpus = [&] { return CountVisibleGpus(NvidiaDeviceIndices(root), cuda_visible_devices); };
  if (value == "cpu") return std::max(1, cpus);
  if (value == "gpu") {
    const int n = gpus();
    if (n > 0) return n;
    if (cuda_visible_devices) {
      return InvalidArgument("--nproc-per-node gpu: CUDA_VISIBLE_DEVICES='" +
                             *cuda_visible_devices + "' leaves no GPU visible");
    }
    return InvalidArgument("--nproc-per-node gpu: no GPU found on this host (no " + root +
                           "/dev/nvidia<N>)");
  }
  if (value == "auto") {
    const int n = gpus();
    return n > 0 ? n : std::max(1, cpus);
  }
  if (auto n = ParseInteger(value, 1, 4096)) return static_cast<int>(*n);
  if (value == "xpu" || value == "hpu" || value == "npu" || value == "mps" || value == "mtia") {
    return InvalidArgument("--nproc-per-node " + value +
                           ": crun counts NVIDIA GPUs (gpu, auto) "
                           "and CPUs (cpu) without PyTorch; for " +
                           value + " devices give the number of workers (e.g. --nproc-per-node 8)");
  }
  return InvalidArgument("--nproc-per-node '" + value +
                         "': expected a number from 1 to 4096, cpu, gpu or auto");
}

}  // namespace crun::launcher
