// A native worker on the SDK (Gloo) that hangs on purpose in its first attempt, for crun's hang
// detection (tests/integration/test_hangs.py, docs/hangs.md). It prints nothing while it works:
// its only progress signal is crun::worker::Heartbeat() after every step.
//
//   hang_native STEPS
// In the first attempt (TORCHELASTIC_RESTART_COUNT 0) the last rank, at step 3, blocks in
// StuckInLoadBatch while the others wait in their allreduce; the restarted attempt runs STEPS
// steps and exits 0.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "crun/worker/context.h"
#include "crun/worker/gloo.h"
#include "crun/worker/heartbeat.h"

namespace {

// Named so that a stack shows where this rank is; never inlined, so that it is in the stack.
__attribute__((noinline)) void StuckInLoadBatch() {
  for (;;) ::pause();
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 5;
  auto ctx = crun::worker::Context::FromEnvironment();
  if (!ctx.ok()) {
    std::fprintf(stderr, "hang_native: %s\n", ctx.status().ToString().c_str());
    return 1;
  }
  auto group = crun::worker::MakeGlooGroup(**ctx);
  if (!group.ok()) {
    std::fprintf(stderr, "hang_native: %s\n", group.status().ToString().c_str());
    return 1;
  }
  const auto& env = (*ctx)->env();
  const bool hangs_here = env.restart_count == 0 && env.rank == env.world_size - 1;
  std::vector<float> data(1024, 1.0F);
  for (int step = 1; step <= steps; ++step) {
    if (hangs_here && step == 3) StuckInLoadBatch();
    const auto s = (*group)->AllReduce(data.data(), data.size(), crun::worker::DType::kFloat32,
                                       crun::worker::ReduceOp::kSum);
    if (!s.ok()) {
      std::fprintf(stderr, "hang_native: rank %d step %d: %s\n", env.rank, step,
                   s.ToString().c_str());
      return 1;
    }
    crun::worker::Heartbeat();
  }
  std::printf("rank %d attempt %d done\n", env.rank, env.restart_count);
  return 0;
}
