// The SDK's libtorch glue from an installed SDK (find_package(crun_worker COMPONENTS torch)):
// every rank starts from rank 0's weights, trains a few steps on its own data with gradients
// averaged across the ranks, and checks that all ranks end with the same weights. Run it with
//   crun --nproc-per-node 2 ./build/ddp_step
#include <torch/torch.h>

#include <cstdio>

#include "crun/worker/context.h"
#include "crun/worker/gloo.h"
#include "crun/worker/torch.h"

int main() {
  using namespace crun::worker;
  auto ctx = Context::FromEnvironment();
  if (!ctx.ok()) {
    std::fprintf(stderr, "ddp_step: %s\n", ctx.status().message().c_str());
    return 2;
  }
  auto group = MakeGlooGroup(**ctx);
  if (!group.ok()) {
    std::fprintf(stderr, "ddp_step: %s\n", group.status().message().c_str());
    return 1;
  }
  ProcessGroup& g = **group;

  torch::manual_seed(1000 + g.rank());  // different initial weights on every rank...
  torch::nn::Linear model(16, 4);
  if (!BroadcastParameters(g, *model).ok()) return 1;  // ...until rank 0's are everyone's
  torch::optim::SGD opt(model->parameters(), 0.1);
  GradientAverager averager(g, *model);
  for (int step = 0; step < 5; ++step) {
    auto x = torch::randn({8, 16});  // this rank's own batch
    opt.zero_grad();
    model->forward(x).pow(2).mean().backward();
    if (!averager.Finish().ok()) return 1;
    opt.step();
  }
  // Every rank's sum of weights, gathered: equal everywhere when training stayed in step.
  float mine = model->weight.sum().item<float>();
  std::vector<float> all(static_cast<std::size_t>(g.size()));
  if (!g.AllGather(&mine, all.data(), 1, DType::kFloat32).ok()) return 1;
  for (float v : all) {
    if (v != all[0]) {
      std::fprintf(stderr, "ddp_step: rank %d: weights differ between ranks\n", g.rank());
      return 1;
    }
  }
  if (g.rank() == 0)
    std::printf("weights identical on %d ranks after 5 averaged steps\n", g.size());
  return 0;
}
