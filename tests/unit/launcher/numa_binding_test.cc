// --numa-binding's plans over an invented 2-socket, 4-node, 8-GPU machine (a sysfs tree
// written into a temporary directory).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <unistd.h>

#include "launcher/numa_binding.h"

namespace {

using namespace crun::launcher;
namespace fs = std::filesystem;
using Ints = std::vector<int>;

void Write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text << "\n";
}

// Sockets 0 and 1; nodes 0,1 on socket 0 and 2,3 on socket 1; 8 CPUs per node as 4 cores of
// 2 threads; L3 caches of 4 CPUs, except node 1: one of 6 (8-13) and one of 2 (14-15).
// GPUs 0..7 two per node, at PCI addresses that sort as listed; an Intel NIC and an NVIDIA
// bridge (not a display device) beside them.
struct FakeMachine {
  std::string root;
  static constexpr const char* kGpus[8] = {"0000:07:00.0", "0000:0a:00.0", "0000:1b:00.0",
                                           "0000:1c:00.0", "0000:8a:00.0", "0000:8b:00.0",
                                           "0000:c3:00.0", "0000:c4:00.0"};
  FakeMachine() {
    root = fs::temp_directory_path().string() + "/crun-numa-XXXXXX";
    REQUIRE(::mkdtemp(root.data()) != nullptr);
    const std::string sys = root + "/sys/devices/system";
    for (int node = 0; node < 4; ++node) {
      const int first = node * 8;
      Write(sys + "/node/node" + std::to_string(node) + "/cpulist",
            std::to_string(first) + "-" + std::to_string(first + 7));
      for (int c = first; c < first + 8; ++c) {
        const std::string cpu = sys + "/cpu/cpu" + std::to_string(c);
        Write(cpu + "/topology/physical_package_id", std::to_string(node / 2));
        const int core = c - c % 2;
        Write(cpu + "/topology/thread_siblings_list",
              std::to_string(core) + "-" + std::to_string(core + 1));
        std::string l3 = std::to_string(c - c % 4) + "-" + std::to_string(c - c % 4 + 3);
        if (node == 1) l3 = c < 14 ? "8-13" : "14-15";
        Write(cpu + "/cache/index0/type", "Data");
        Write(cpu + "/cache/index0/level", "1");
        Write(cpu + "/cache/index0/shared_cpu_list",
              std::to_string(core) + "-" + std::to_string(core + 1));
        Write(cpu + "/cache/index1/type", "Instruction");
        Write(cpu + "/cache/index1/level", "1");
        Write(cpu + "/cache/index1/shared_cpu_list", std::to_string(c));
        Write(cpu + "/cache/index3/type", "Unified");
        Write(cpu + "/cache/index3/level", "3");
        Write(cpu + "/cache/index3/shared_cpu_list", l3);
      }
    }
    const std::string pci = root + "/sys/bus/pci/devices/";
    for (int g = 0; g < 8; ++g) {
      Write(pci + kGpus[g] + "/vendor", "0x10de");
      Write(pci + kGpus[g] + "/class", "0x030200");
      Write(pci + kGpus[g] + "/numa_node", std::to_string(g / 2));
      Write(root + "/proc/driver/nvidia/gpus/" + kGpus[g] + "/information",
            "Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t GPU-0000000" + std::to_string(g) +
                "-aaaa-bbbb-cccc-dddddddddddd\nBus Location: \t " + kGpus[g]);
    }
    Write(pci + "0000:05:00.0/vendor", "0x8086");
    Write(pci + "0000:05:00.0/class", "0x020000");
    Write(pci + "0000:05:00.0/numa_node", "0");
    Write(pci + "0000:06:00.0/vendor", "0x10de");
    Write(pci + "0000:06:00.0/class", "0x068000");
    Write(pci + "0000:06:00.0/numa_node", "0");
  }
  ~FakeMachine() { fs::remove_all(root); }
};

std::set<int> AllCpus() {
  std::set<int> s;
  for (int c = 0; c < 32; ++c) s.insert(c);
  return s;
}

std::vector<NumaBinding> Plan(const FakeMachine& m, NumaMode mode,
                              std::optional<std::string> visible = std::nullopt,
                              std::set<int> allowed = AllCpus()) {
  auto p = PlanNumaBinding(mode, m.root, 0, 8, visible, allowed);
  REQUIRE(p.ok());
  return *p;
}

Ints Range(int from, int to) {
  Ints v;
  for (int i = from; i <= to; ++i) v.push_back(i);
  return v;
}

}  // namespace

TEST_CASE("cpu lists parse and format as sysfs writes them", "[numa]") {
  CHECK(*ParseCpuList("0-3,8,10-11\n") == std::set<int>{0, 1, 2, 3, 8, 10, 11});
  CHECK(FormatCpuList({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11");
  CHECK_FALSE(ParseCpuList("3-1").has_value());
  CHECK_FALSE(ParseCpuList("a").has_value());
}

TEST_CASE("node: every CPU and the memory of the GPU's node", "[numa]") {
  FakeMachine m;
  const auto p = Plan(m, NumaMode::kNode);
  for (int lr = 0; lr < 8; ++lr) {
    INFO(lr);
    CHECK(p[static_cast<std::size_t>(lr)].pci == FakeMachine::kGpus[lr]);
    CHECK(p[static_cast<std::size_t>(lr)].node == lr / 2);
    CHECK(p[static_cast<std::size_t>(lr)].cpus == Range(lr / 2 * 8, lr / 2 * 8 + 7));
    CHECK(p[static_cast<std::size_t>(lr)].mems == Ints{lr / 2});
  }
}

TEST_CASE("socket: every node of the GPU's socket", "[numa]") {
  FakeMachine m;
  const auto p = Plan(m, NumaMode::kSocket);
  CHECK(p[3].cpus == Range(0, 15));
  CHECK(p[3].mems == Ints{0, 1});
  CHECK(p[6].cpus == Range(16, 31));
  CHECK(p[6].mems == Ints{2, 3});
}

TEST_CASE("exclusive: the node's physical cores split among its GPUs", "[numa]") {
  FakeMachine m;
  const auto p = Plan(m, NumaMode::kExclusive);
  CHECK(p[2].cpus == Range(8, 11));
  CHECK(p[3].cpus == Range(12, 15));
  CHECK(p[3].mems == Ints{1});
  // Three cores left to two GPUs: the lower GPU takes the extra one.
  std::set<int> allowed = AllCpus();
  allowed.erase(8);
  allowed.erase(9);
  const auto q = Plan(m, NumaMode::kExclusive, std::nullopt, allowed);
  CHECK(q[2].cpus == Range(10, 13));
  CHECK(q[3].cpus == Range(14, 15));
  // Fewer cores than GPUs on a node: refused, naming it.
  std::set<int> two;
  for (int c : {0, 1, 8, 9, 16, 17, 24, 25}) two.insert(c);
  const auto r = PlanNumaBinding(NumaMode::kExclusive, m.root, 0, 8, std::nullopt, two);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() ==
        "--numa-binding exclusive: NUMA node 0 has 1 physical cores for 2 GPUs");
}

TEST_CASE("core-complex: one L3 group per GPU with the largest first", "[numa]") {
  FakeMachine m;
  const auto p = Plan(m, NumaMode::kCoreComplex);
  CHECK(p[0].cpus == Range(0, 3));
  CHECK(p[1].cpus == Range(4, 7));
  CHECK(p[2].cpus == Range(8, 13));
  CHECK(p[3].cpus == Range(14, 15));
}

TEST_CASE("CUDA_VISIBLE_DEVICES picks each local rank's GPU by index or UUID", "[numa]") {
  FakeMachine m;
  auto p = PlanNumaBinding(NumaMode::kNode, m.root, 0, 2, std::string("6,2"), AllCpus());
  REQUIRE(p.ok());
  CHECK((*p)[0].cpus == Range(24, 31));
  CHECK((*p)[1].cpus == Range(8, 15));
  p = PlanNumaBinding(NumaMode::kNode, m.root, 0, 1,
                      std::string("GPU-00000005-aaaa-bbbb-cccc-dddddddddddd"), AllCpus());
  REQUIRE(p.ok());
  CHECK((*p)[0].pci == "0000:8b:00.0");
  CHECK((*p)[0].mems == Ints{2});
  const auto short_list =
      PlanNumaBinding(NumaMode::kNode, m.root, 0, 3, std::string("0,1"), AllCpus());
  REQUIRE_FALSE(short_list.ok());
  CHECK(short_list.status().message().find("local rank 2 has no GPU in CUDA_VISIBLE_DEVICES") !=
        std::string::npos);
  // Local ranks beyond the GPUs present are refused.
  const auto many = PlanNumaBinding(NumaMode::kNode, m.root, 0, 9, std::nullopt, AllCpus());
  REQUIRE_FALSE(many.ok());
  CHECK(many.status().message().find("local rank 8 would use GPU 8") != std::string::npos);
}

TEST_CASE("a machine without NVIDIA GPUs is refused", "[numa]") {
  std::string root = fs::temp_directory_path().string() + "/crun-numa-XXXXXX";
  REQUIRE(::mkdtemp(root.data()) != nullptr);
  const auto p = PlanNumaBinding(NumaMode::kNode, root, 0, 1, std::nullopt, AllCpus());
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message().find("no NVIDIA GPU") != std::string::npos);
  fs::remove_all(root);
}
