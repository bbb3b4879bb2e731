// Counting the GPUs workers can use from a fake /dev, and --nproc-per-node's values.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "launcher/devices.h"

namespace {

using namespace crun::launcher;
namespace fs = std::filesystem;

// A root with /dev/nvidia<i> for each i (and the control nodes a real driver has).
std::string FakeRoot(std::initializer_list<int> gpus) {
  std::string root = fs::temp_directory_path().string() + "/crun-dev-XXXXXX";
  REQUIRE(::mkdtemp(root.data()) != nullptr);
  fs::create_directories(root + "/dev");
  for (const char* other : {"nvidiactl", "nvidia-uvm", "nvidia-modeset", "null"}) {
    std::ofstream(root + "/dev/" + other);
  }
  for (int i : gpus) std::ofstream(root + "/dev/nvidia" + std::to_string(i));
  return root;
}

}  // namespace

TEST_CASE("the devices present are counted with gaps", "[devices]") {
  const auto root = FakeRoot({0, 1, 3, 7});
  CHECK(NvidiaDeviceIndices(root) == std::vector<int>{0, 1, 3, 7});
  CHECK(CountVisibleGpus(NvidiaDeviceIndices(root), std::nullopt) == 4);
  CHECK(NvidiaDeviceIndices(FakeRoot({})).empty());
  fs::remove_all(root);
}

TEST_CASE("CUDA_VISIBLE_DEVICES is counted as CUDA counts it", "[devices]") {
  const std::vector<int> present{0, 1, 2, 3};
  struct Row {
    const char* value;
    int count;
  };
  for (const Row& row : std::vector<Row>{
           {"0,1", 2},
           {"3", 1},
           {"2,0,1", 3},
           {"", 0},
           {"-1", 0},
           {"0,7,1", 1},  // 7 is not present: CUDA ignores it and everything after
           {"0,0,1", 1},  // a repeat ends the list
           {"1,x,2", 1},
           {"GPU-8f0c1e2a-aaaa-bbbb-cccc-0123456789ab,GPU-11112222-3333", 2},
           {"MIG-4f5e6d7c-1111-2222-3333-444455556666", 1},
           {" 0 , 1 ", 2},
       }) {
    INFO(row.value);
    CHECK(CountVisibleGpus(present, std::string(row.value)) == row.count);
  }
}

TEST_CASE("nproc-per-node takes gpu and auto and cpu and numbers", "[devices]") {
  const auto root = FakeRoot({0, 1, 2, 5});
  CHECK(*ResolveNproc("gpu", root, std::nullopt, 16) == 4);
  CHECK(*ResolveNproc("gpu", root, std::string("1,3"), 16) == 2);
  CHECK(*ResolveNproc("auto", root, std::nullopt, 16) == 4);
  CHECK(*ResolveNproc("auto", root, std::string(""), 16) == 16);
  CHECK(*ResolveNproc("cpu", root, std::nullopt, 16) == 16);
  CHECK(*ResolveNproc("8", root, std::nullopt, 16) == 8);
  const auto hidden = ResolveNproc("gpu", root, std::string("-1"), 16);
  REQUIRE_FALSE(hidden.ok());
  CHECK(hidden.status().message().find("CUDA_VISIBLE_DEVICES='-1' leaves no GPU visible") !=
        std::string::npos);
  const auto none = FakeRoot({});
  CHECK(*ResolveNproc("auto", none, std::nullopt, 3) == 3);
  CHECK(ResolveNproc("gpu", none, std::nullopt, 3).status().message().find("no GPU found") !=
        std::string::npos);
  const auto xpu = ResolveNproc("xpu", root, std::nullopt, 3);
  REQUIRE_FALSE(xpu.ok());
  CHECK(xpu.status().message().find("--nproc-per-node xpu") == 0);
  for (const char* bad : {"0", "-2", "two", "4097", "1.5", ""}) {
    INFO(bad);
    CHECK_FALSE(ResolveNproc(bad, root, std::nullopt, 3).ok());
  }
  fs::remove_all(root);
  fs::remove_all(none);
}
