// GPU collective timer for tests/bench/nccl_bench.py: a crun worker (or a torchrun one: it
// reads the same environment) on the SDK's NCCL backend. For each size, float32:
//   allreduce  in place, sum;
//   allgather  out of place, size / world bytes from each rank.
// Each figure is the median over repetitions of the slowest rank's time for one blocking call
// (queued, then waited for on the host), the same statistic as tests/bench/torch_nccl.py.
// Rank 0 writes OUT_JSON. Without a usable GPU it exits 1 with the SDK's named error.
//
//   nccl_allreduce OUT_JSON SIZES_BYTES
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "crun/worker/context.h"
#include "crun/worker/nccl.h"

namespace {

using crun::worker::DType;
using crun::worker::ProcessGroup;
using crun::worker::ReduceOp;
using Clock = std::chrono::steady_clock;

int Fail(const std::string& what) {
  std::fprintf(stderr, "nccl_allreduce: %s\n", what.c_str());
  return 1;
}

int Repetitions(std::size_t bytes) {
  const std::size_t budget = std::size_t{8} << 30;  // about 8 GiB moved per size
  return static_cast<int>(
      std::clamp<std::size_t>(budget / std::max<std::size_t>(bytes, 1), 20, 1000));
}

// Times `op` `reps` times after one warm-up; returns the median of the slowest rank's times.
template <typename Op>
double Time(ProcessGroup& g, double* device_times, int reps, Op op, std::string* error) {
  crun::Status s = op();
  if (!s.ok()) {
    *error = s.ToString();
    return 0;
  }
  std::vector<double> seconds(static_cast<std::size_t>(reps));
  for (double& t : seconds) {
    const auto t0 = Clock::now();
    s = op();
    t = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!s.ok()) {
      *error = s.ToString();
      return 0;
    }
  }
  // The slowest rank's time per repetition: a max-allreduce of the timings themselves.
  cudaMemcpy(device_times, seconds.data(), seconds.size() * sizeof(double), cudaMemcpyHostToDevice);
  s = g.AllReduce(device_times, seconds.size(), DType::kFloat64, ReduceOp::kMax);
  if (!s.ok()) {
    *error = s.ToString();
    return 0;
  }
  cudaMemcpy(seconds.data(), device_times, seconds.size() * sizeof(double), cudaMemcpyDeviceToHost);
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return Fail("usage: nccl_allreduce OUT_JSON SIZES_BYTES");
  std::vector<std::size_t> sizes;
  for (std::string rest = argv[2]; !rest.empty();) {
    const auto comma = rest.find(',');
    const std::string item = rest.substr(0, comma);
    char* end = nullptr;
    const unsigned long long v = std::strtoull(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 4)
      return Fail("size '" + item + "' is not a byte count >= 4");
    sizes.push_back(static_cast<std::size_t>(v));
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
  }

  auto ctx = crun::worker::Context::FromEnvironment();
  if (!ctx.ok()) return Fail(ctx.status().ToString());
  auto made = crun::worker::MakeNcclGroup(**ctx);
  if (!made.ok()) return Fail(made.status().ToString());
  ProcessGroup& g = **made;
  const int world = g.size();

  int device = 0;
  cudaGetDevice(&device);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, device);

  const std::size_t largest = *std::max_element(sizes.begin(), sizes.end());
  void* buffer = nullptr;
  void* gathered = nullptr;
  double* times = nullptr;
  if (cudaMalloc(&buffer, largest) != cudaSuccess ||
      cudaMalloc(&gathered, largest) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&times), 1000 * sizeof(double)) != cudaSuccess) {
    return Fail("cudaMalloc of " + std::to_string(largest) + " bytes failed on device " +
                std::to_string(device));
  }
  cudaMemset(buffer, 0, largest);

  std::string rows;
  for (const std::size_t bytes : sizes) {
    const std::size_t count = bytes / sizeof(float);
    const std::size_t per_rank = count / static_cast<std::size_t>(world);
    const int reps = Repetitions(bytes);
    std::string error;
    const double reduce = Time(
        g, times, reps, [&] { return g.AllReduce(buffer, count, DType::kFloat32, ReduceOp::kSum); },
        &error);
    const double gather =
        error.empty() && per_rank > 0
            ? Time(
                  g, times, reps,
                  [&] { return g.AllGather(buffer, gathered, per_rank, DType::kFloat32); }, &error)
            : 0.0;
    if (!error.empty()) return Fail(std::to_string(bytes) + " bytes: " + error);
    char row[256];
    std::snprintf(row, sizeof(row),
                  "%s{\"bytes\": %zu, \"repetitions\": %d, \"allreduce_seconds\": %.9g, "
                  "\"allgather_seconds\": %.9g}",
                  rows.empty() ? "" : ", ", bytes, reps, reduce, gather);
    rows += row;
  }
  cudaFree(buffer);
  cudaFree(gathered);
  cudaFree(times);

  if (g.rank() == 0) {
    std::FILE* f = std::fopen(argv[1], "w");
    if (f == nullptr) return Fail(std::string("cannot write ") + argv[1]);
    std::fprintf(f, "{\"world\": %d, \"nccl\": \"%s\", \"device\": \"%s\", \"results\": [%s]}\n",
                 world, crun::worker::NcclVersion().c_str(), prop.name, rows.c_str());
    std::fclose(f);
  }
  return 0;
}
