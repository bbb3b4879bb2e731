#include "launcher/numa_binding.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "base/numbers.h"
#include "base/text.h"

namespace crun::launcher {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> ReadLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return std::string(TrimEnd(line));
}

// The sysfs topology crun needs, read once.
class Topology {
 public:
  explicit Topology(std::string root) : root_(std::move(root)) {}

  // NVIDIA display-class PCI devices, in bus order.
  std::vector<std::string> Gpus() const {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root_ + "/sys/bus/pci/devices", ec)) {
      const std::string dir = e.path().string();
      const auto vendor = ReadLine(dir + "/vendor");
      const auto cls = ReadLine(dir + "/class");
      if (vendor == "0x10de" && cls && cls->rfind("0x03", 0) == 0) {
        out.push_back(e.path().filename().string());
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  // The PCI address of the GPU whose UUID is `uuid`, from the driver's information files.
  std::optional<std::string> PciOfUuid(const std::string& uuid) const {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root_ + "/proc/driver/nvidia/gpus", ec)) {
      std::ifstream in(e.path().string() + "/information");
      std::string line;
      while (std::getline(in, line)) {
        const auto colon = line.find(':');
        if (colon == std::string::npos ||
            Trim(std::string_view(line).substr(0, colon)) != "GPU UUID")
          continue;
        const std::string value(Trim(std::string_view(line).substr(colon + 1)));
        if (value == uuid || (uuid.size() > 4 && value.rfind(uuid, 0) == 0)) {
          return e.path().filename().string();
        }
      }
    }
    return std::nullopt;
  }

  StatusOr<int> NodeOfPci(const std::string& pci) const {
    const std::string path = root_ + "/sys/bus/pci/devices/" + pci + "/numa_node";
    const auto text = ReadLine(path);
    const auto node = text ? ParseInteger(*text, -1, 1 << 16) : std::nullopt;
    if (!node) return NotFound("cannot read the NUMA node of GPU " + pci + " (" + path + ")");
    return static_cast<int>(std::max<std::int64_t>(*node, 0));  // -1: the only node
  }

  std::vector<int> Nodes() const {
    std::vector<int> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root_ + "/sys/devices/system/node", ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("node", 0) != 0) continue;
      if (auto n = ParseInteger(std::string_view(name).substr(4), 0, 1 << 16)) {
        out.push_back(static_cast<int>(*n));
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  std::set<int> CpusOfNode(int node) const {
    return List(root_ + "/sys/devices/system/node/node" + std::to_string(node) + "/cpulist");
  }

  std::optional<int> SocketOfCpu(int cpu) const {
    const auto text = ReadLine(CpuDir(cpu) + "/topology/physical_package_id");
    const auto n = text ? ParseInteger(*text, -1, 1 << 16) : std::nullopt;
    if (!n) return std::nullopt;
    return static_cast<int>(*n);
  }

  // The CPUs of `cpu`'s physical core (itself when sysfs does not say).
  std::set<int> SiblingsOf(int cpu) const {
    auto s = List(CpuDir(cpu) + "/topology/thread_siblings_list");
    if (s.empty()) s.insert(cpu);
    return s;
  }

  // The CPUs sharing `cpu`'s highest-level data or unified cache (itself when none is known).
  std::set<int> LastCacheOf(int cpu) const {
    int best = -1;
    std::set<int> out{cpu};
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(CpuDir(cpu) + "/cache", ec)) {
      const std::string dir = e.path().string();
      if (e.path().filename().string().rfind("index", 0) != 0) continue;
      const auto type = ReadLine(dir + "/type");
      if (type != "Unified" && type != "Data") continue;
      const auto level_text = ReadLine(dir + "/level");
      const auto level = level_text ? ParseInteger(*level_text, 0, 16) : std::nullopt;
      if (!level || *level <= best) continue;
      auto shared = List(dir + "/shared_cpu_list");
      if (shared.empty()) continue;
      best = static_cast<int>(*level);
      out = std::move(shared);
    }
    return out;
  }

 private:
  std::string CpuDir(int cpu) const {
    return root_ + "/sys/devices/system/cpu/cpu" + std::to_string(cpu);
  }
  static std::set<int> List(const std::string& path) {
    const auto text = ReadLine(path);
    if (!text) return {};
    return ParseCpuList(*text).value_or(std::set<int>{});
  }

  std::string root_;
};

std::set<int> Intersect(const std::set<int>& a, const std::set<int>& b) {
  std::set<int> out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::inserter(out, out.end()));
  return out;
}

// Groups `cpus` by a key CPU (the lowest of each group), in key order.
template <typename GroupOf>
std::map<int, std::set<int>> GroupBy(const std::set<int>& cpus, GroupOf group_of) {
  std::map<int, std::set<int>> out;
  for (int c : cpus) {
    const auto g = group_of(c);
    out[*g.begin()].insert(c);
  }
  return out;
}

}  // namespace

StatusOr<NumaMode> ParseNumaMode(const std::string& value) {
  if (value == "node") return NumaMode::kNode;
  if (value == "socket") return NumaMode::kSocket;
  if (value == "exclusive") return NumaMode::kExclusive;
  if (value == "core-complex") return NumaMode::kCoreComplex;
  return InvalidArgument("--numa-binding '" + value +
                         "': expected node, socket, exclusive or core-complex");
}

std::optional<std::set<int>> ParseCpuList(const std::string& text) {
  std::set<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    item = std::string(Trim(item));
    if (item.empty()) continue;
    const auto dash = item.find('-');
    const auto lo = ParseInteger(item.substr(0, dash), 0, 1 << 20);
    const auto hi =
        dash == std::string::npos ? lo : ParseInteger(item.substr(dash + 1), 0, 1 << 20);
    if (!lo || !hi || *hi < *lo) return std::nullopt;
    for (auto c = *lo; c <= *hi; ++c) out.insert(static_cast<int>(c));
  }
  return out;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

namespace {

// The PCI address of the GPU each local rank uses: CUDA_VISIBLE_DEVICES's entry (an index or a
// GPU UUID) when set, else the rank's own index, among `gpus` in PCI order.
class RankGpus {
 public:
  RankGpus(const Topology& topo, const std::vector<std::string>& gpus, const std::string& root,
           const std::optional<std::string>& cuda_visible_devices)
      : topo_(topo), gpus_(gpus), root_(root), cvd_(cuda_visible_devices) {
    if (!cvd_) return;
    std::stringstream in(*cvd_);
    std::string item;
    while (std::getline(in, item, ',')) visible_.emplace_back(Trim(item));
  }

  StatusOr<std::string> PciOf(int lr) const {
    std::string entry = std::to_string(lr);
    if (cvd_) {
      if (lr >= static_cast<int>(visible_.size())) {
        return InvalidArgument("--numa-binding: local rank " + std::to_string(lr) +
                               " has no GPU in CUDA_VISIBLE_DEVICES='" + *cvd_ + "'");
      }
      entry = visible_[static_cast<std::size_t>(lr)];
      if (entry.rfind("GPU-", 0) == 0) {
        if (auto pci = topo_.PciOfUuid(entry)) return *pci;
        return NotFound("--numa-binding: no GPU with UUID " + entry + " in " + root_ +
                        "/proc/driver/nvidia/gpus/*/information");
      }
      if (entry.rfind("MIG-", 0) == 0) {
        return InvalidArgument("--numa-binding: CUDA_VISIBLE_DEVICES entry " + entry +
                               " is a MIG instance: give its GPU's index instead");
      }
    }
    const auto index = ParseInteger(entry, 0, static_cast<std::int64_t>(gpus_.size()) - 1);
    if (!index) {
      return InvalidArgument("--numa-binding: local rank " + std::to_string(lr) +
                             " would use GPU " + entry + ", but this node has " +
                             std::to_string(gpus_.size()) + " NVIDIA GPUs");
    }
    return gpus_[static_cast<std::size_t>(*index)];
  }

 private:
  const Topology& topo_;
  const std::vector<std::string>& gpus_;
  const std::string& root_;
  const std::optional<std::string>& cvd_;
  std::vector<std::string> visible_;  // CUDA_VISIBLE_DEVICES entries, if set
};

// --numa-binding socket: add the CPUs and memory of every node on the socket of `node_cpus`.
Status WidenToSocket(const Topology& topo, const std::set<int>& node_cpus,
                     const std::set<int>& allowed, std::set<int>& cpus, std::set<int>& mems) {
  const auto socket = topo.SocketOfCpu(*node_cpus.begin());
  if (!socket) {
    return NotFound("--numa-binding socket: cannot read the socket of CPU " +
                    std::to_string(*node_cpus.begin()));
  }
  for (int n : topo.Nodes()) {
    const auto other = Intersect(topo.CpusOfNode(n), allowed);
    if (other.empty() || topo.SocketOfCpu(*other.begin()) != socket) continue;
    cpus.insert(other.begin(), other.end());
    mems.insert(n);
  }
  return Status::Ok();
}

// --numa-binding exclusive: share `share` of the node's physical cores, dealt out evenly among
// its `gpus` GPUs.
StatusOr<std::set<int>> ExclusiveCores(const Topology& topo, const std::set<int>& node_cpus,
                                       int node, std::size_t share, std::size_t gpus) {
  const auto cores = GroupBy(node_cpus, [&](int c) { return topo.SiblingsOf(c); });
  const std::size_t per = cores.size() / gpus;
  const std::size_t extra = cores.size() % gpus;
  if (per == 0) {
    return InvalidArgument("--numa-binding exclusive: NUMA node " + std::to_string(node) + " has " +
                           std::to_string(cores.size()) + " physical cores for " +
                           std::to_string(gpus) + " GPUs");
  }
  const std::size_t start = share * per + std::min(share, extra);
  const std::size_t end = start + per + (share < extra ? 1 : 0);
  std::set<int> cpus;
  std::size_t i = 0;
  for (const auto& [key, group] : cores) {
    if (i >= start && i < end) cpus.insert(group.begin(), group.end());
    ++i;
  }
  return cpus;
}

// --numa-binding core-complex: the CPUs sharing a last-level cache, the largest complexes
// going to the node's first GPUs.
std::set<int> CoreComplex(const Topology& topo, const std::set<int>& node_cpus, std::size_t share) {
  const auto groups = GroupBy(node_cpus, [&](int c) { return topo.LastCacheOf(c); });
  std::vector<std::pair<int, std::set<int>>> ordered(groups.begin(), groups.end());
  std::stable_sort(ordered.begin(), ordered.end(), [](const auto& x, const auto& y) {
    return x.second.size() > y.second.size();  // the largest complexes first
  });
  return ordered[share % ordered.size()].second;
}

}  // namespace

StatusOr<std::vector<NumaBinding>> PlanNumaBinding(
    NumaMode mode, const std::string& root, int first, int count,
    const std::optional<std::string>& cuda_visible_devices, const std::set<int>& allowed) {
  const Topology topo(root);
  const auto gpus = topo.Gpus();
  if (gpus.empty()) {
    return NotFound("--numa-binding: no NVIDIA GPU among the PCI devices (" + root +
                    "/sys/bus/pci/devices)");
  }
  const RankGpus rank_gpus(topo, gpus, root, cuda_visible_devices);
  // The GPUs of each node, in GPU order (for exclusive and core-complex shares).
  std::map<int, std::vector<int>> gpus_of_node;
  std::vector<int> node_of_gpu(gpus.size());
  for (std::size_t g = 0; g < gpus.size(); ++g) {
    CRUN_ASSIGN_OR_RETURN(node_of_gpu[g], topo.NodeOfPci(gpus[g]));
    gpus_of_node[node_of_gpu[g]].push_back(static_cast<int>(g));
  }
  std::vector<NumaBinding> out;
  for (int lr = first; lr < first + count; ++lr) {
    NumaBinding b;
    CRUN_ASSIGN_OR_RETURN(b.pci, rank_gpus.PciOf(lr));
    b.gpu = static_cast<int>(std::find(gpus.begin(), gpus.end(), b.pci) - gpus.begin());
    b.node = node_of_gpu[static_cast<std::size_t>(b.gpu)];
    const std::set<int> node_cpus = Intersect(topo.CpusOfNode(b.node), allowed);
    if (node_cpus.empty()) {
      return InvalidArgument("--numa-binding: NUMA node " + std::to_string(b.node) + " of GPU " +
                             b.pci + " has no CPU that crun may use");
    }
    std::set<int> cpus = node_cpus;
    std::set<int> mems{b.node};
    const auto& peers = gpus_of_node[b.node];
    const std::size_t share =
        static_cast<std::size_t>(std::find(peers.begin(), peers.end(), b.gpu) - peers.begin());
    if (mode == NumaMode::kSocket) {
      CRUN_RETURN_IF_ERROR(WidenToSocket(topo, node_cpus, allowed, cpus, mems));
    } else if (mode == NumaMode::kExclusive) {
      CRUN_ASSIGN_OR_RETURN(cpus, ExclusiveCores(topo, node_cpus, b.node, share, peers.size()));
    } else if (mode == NumaMode::kCoreComplex) {
      cpus = CoreComplex(topo, node_cpus, share);
    }
    b.cpus.assign(cpus.begin(), cpus.end());
    b.mems.assign(mems.begin(), mems.end());
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace crun::launcher
