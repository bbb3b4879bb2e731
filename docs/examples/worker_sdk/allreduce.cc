// The smallest complete crun worker: read the rank from the environment crun sets, join the
// job's Gloo group, sum one vector across every rank. Run it with
//   crun --nproc-per-node 4 ./build/allreduce
#include <cstdio>
#include <vector>

#include "crun/worker/context.h"
#include "crun/worker/gloo.h"

int main() {
  using namespace crun::worker;
  auto ctx = Context::FromEnvironment();  // RANK, WORLD_SIZE, MASTER_ADDR, ... and the store
  if (!ctx.ok()) {
    std::fprintf(stderr, "allreduce: %s\n", ctx.status().message().c_str());
    return 2;
  }
  auto group = MakeGlooGroup(**ctx);
  if (!group.ok()) {
    std::fprintf(stderr, "allreduce: %s\n", group.status().message().c_str());
    return 1;
  }
  ProcessGroup& g = **group;

  std::vector<float> grad(1000, static_cast<float>(g.rank() + 1));
  crun::Status s = g.AllReduce(grad.data(), grad.size(), DType::kFloat32, ReduceOp::kAvg);
  if (!s.ok()) {
    std::fprintf(stderr, "allreduce: %s\n", s.message().c_str());
    return 1;
  }
  // The average of 1..n is (n + 1) / 2 on every rank.
  const float want = static_cast<float>(g.size() + 1) / 2;
  if (grad.front() != want || grad.back() != want) {
    std::fprintf(stderr, "rank %d: got %g, want %g\n", g.rank(), grad.front(), want);
    return 1;
  }
  if (g.rank() == 0) std::printf("average over %d ranks: %g\n", g.size(), grad.front());
  return 0;
}
