// The NCCL backend, world size 1 over an in-process store. On a machine with a GPU: every
// collective on device memory, async work, abort. Without one (CI): the named error, so the
// binary always checks something real about the backend it was built with. A case that cannot
// run on this machine is reported as skipped (tests/unit/skip.h), never as passed.
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "crun/worker/nccl.h"
#include "rendezvous/store/memory_store.h"
#include "tests/unit/skip.h"
#include "tests/unit/worker/test_env.h"

namespace {

using namespace std::chrono_literals;
using crun::testing::Skip;
using crun::worker::DType;
using crun::worker::ReduceOp;

crun::worker::WorkerEnv EnvFor(int rank, int world) {
  return TestWorkerEnv(rank, world, "nccl-test");
}

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Device memory holding `host`, copied back by Read().
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : n_(host.size()) {
    REQUIRE(cudaMalloc(&ptr_, n_ * sizeof(T)) == cudaSuccess);
    REQUIRE(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  T* get() { return static_cast<T*>(ptr_); }
  std::vector<T> Read() const {
    std::vector<T> out(n_);
    REQUIRE(cudaMemcpy(out.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return out;
  }

 private:
  void* ptr_ = nullptr;
  std::size_t n_;
};

}  // namespace

TEST_CASE("nccl: the library is the one linked", "[nccl]") {
  const std::string v = crun::worker::NcclVersion();
  INFO(v);
  CHECK(v.rfind("2.", 0) == 0);
}

TEST_CASE("nccl: without a visible GPU, creating a group fails naming rank and cause",
          "[nccl][may-skip]") {
  // Hiding every device from this process's CUDA runtime is not possible after it started;
  // the GPU case below covers such a machine.
  if (HaveGpu()) Skip("a GPU is visible: the world-size-1 case covers this machine");
  auto store = std::make_shared<crun::MemoryStore>();
  crun::worker::Context ctx(EnvFor(0, 1), store);
  auto g = crun::worker::MakeNcclGroup(ctx);
  REQUIRE_FALSE(g.ok());
  INFO(g.status().message());
  CHECK(g.status().code() == crun::StatusCode::kUnavailable);
  CHECK_THAT(g.status().message(),
             Catch::StartsWith("nccl group 'default', rank 0 of 1: no CUDA device visible"));
}

// A group of one rank on this machine's GPU (the test skips where there is none).
class OneRankGroup {
 public:
  OneRankGroup() : ctx_(EnvFor(0, 1), std::make_shared<crun::MemoryStore>()) {
    if (!HaveGpu()) Skip("no GPU here: the named-error case covers this machine");
    crun::worker::NcclOptions o;
    o.timeout = 60s;
    auto made = crun::worker::MakeNcclGroup(ctx_, o);
    INFO(made.status().message());
    REQUIRE(made.ok());
    group_ = std::move(*made);
  }
  crun::worker::ProcessGroup& operator*() { return *group_; }

 private:
  crun::worker::Context ctx_;
  std::unique_ptr<crun::worker::ProcessGroup> group_;
};

TEST_CASE("nccl: world size 1 on this machine's GPU", "[nccl][gpu][may-skip]") {
  OneRankGroup one;
  auto& g = *one;
  CHECK(g.backend() == "nccl");

  const std::size_t n = 1 << 20;
  std::vector<float> host(n);
  for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 97);
  DeviceBuffer<float> x(host);
  REQUIRE(g.AllReduce(x.get(), n, DType::kFloat32, ReduceOp::kSum).ok());
  CHECK(x.Read() == host);  // one rank: the sum is itself
  REQUIRE(g.AllReduce(x.get(), n, DType::kFloat32, ReduceOp::kAvg).ok());
  CHECK(x.Read() == host);

  DeviceBuffer<std::int64_t> gathered(std::vector<std::int64_t>(4, -1));
  DeviceBuffer<std::int64_t> mine(std::vector<std::int64_t>{7, 8, 9, 10});
  REQUIRE(g.AllGather(mine.get(), gathered.get(), 4, DType::kInt64).ok());
  CHECK(gathered.Read() == std::vector<std::int64_t>{7, 8, 9, 10});
  DeviceBuffer<std::int64_t> scattered(std::vector<std::int64_t>(4, 0));
  REQUIRE(g.ReduceScatter(mine.get(), scattered.get(), 4, DType::kInt64, ReduceOp::kMax).ok());
  CHECK(scattered.Read() == std::vector<std::int64_t>{7, 8, 9, 10});
  REQUIRE(g.Broadcast(x.get(), n, DType::kFloat32, 0).ok());
  REQUIRE(g.Barrier().ok());
  CHECK(g.AllReduce(mine.get(), 4, DType::kInt64, ReduceOp::kAvg).code() ==
        crun::StatusCode::kInvalidArgument);

  auto w = g.AllReduceAsync(x.get(), n, DType::kFloat32, ReduceOp::kMax, 60s);
  REQUIRE(w->Wait().ok());
  CHECK(w->Test());

  g.Abort("test is done");
  auto after = g.Barrier();
  CHECK(after.code() == crun::StatusCode::kAborted);
  CHECK_THAT(after.message(), Catch::Contains("aborted: test is done"));
}

TEST_CASE("nccl: collectives ordered after torch's stream on the device, host not waiting",
          "[nccl][gpu][may-skip]") {
  OneRankGroup one;
  auto& g = *one;
  // 64 MiB copied to the GPU on the legacy default stream (milliseconds of work queued), the
  // group told to follow that stream, an out-of-place allgather queued at once, the default
  // stream told to wait for it, and the result copied back on the default stream. Unordered,
  // the allgather would read the buffer before the upload lands, or the copy back would read
  // the output before the allgather wrote it.
  const std::size_t n = 16u << 20;
  std::int32_t* pinned = nullptr;
  std::int32_t* back = nullptr;
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&pinned), n * sizeof(std::int32_t)) ==
          cudaSuccess);
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&back), n * sizeof(std::int32_t)) == cudaSuccess);
  for (int round = 1; round <= 5; ++round) {
    for (std::size_t i = 0; i < n; ++i) pinned[i] = static_cast<std::int32_t>(i) * round;
    DeviceBuffer<std::int32_t> in(std::vector<std::int32_t>(n, 0));
    DeviceBuffer<std::int32_t> out(std::vector<std::int32_t>(n, -1));
    REQUIRE(cudaMemcpyAsync(in.get(), pinned, n * sizeof(std::int32_t), cudaMemcpyHostToDevice,
                            nullptr) == cudaSuccess);
    REQUIRE(g.FollowStream(nullptr));
    auto w = g.AllGatherAsync(in.get(), out.get(), n, DType::kInt32, 60s);
    REQUIRE(w->BlockStream(nullptr));
    std::fill(back, back + n, 0);
    REQUIRE(cudaMemcpyAsync(back, out.get(), n * sizeof(std::int32_t), cudaMemcpyDeviceToHost,
                            nullptr) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
    REQUIRE(w->Test());
    REQUIRE(w->Wait().ok());
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += back[i] != static_cast<std::int32_t>(i) * round;
    INFO("round " << round);
    CHECK(wrong == 0);
  }
  cudaFreeHost(pinned);
  cudaFreeHost(back);
}
