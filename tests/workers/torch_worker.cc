// A libtorch worker for the SDK's torch glue tests (tests/integration/test_torch_glue.py).
//
//   torch_worker gradcheck OUT_DIR
//     Each rank starts from different random weights; BroadcastParameters makes them rank 0's.
//     Five SGD steps on this rank's shard of a fixed batch with GradientAverager (small buckets,
//     so several) must equal five steps of single-process training on the whole batch, which
//     every rank also computes locally. Writes OUT_DIR/rank<R>.json.
//   torch_worker resume OUT_DIR CKPT_DIR STEPS KILL_AT
//     Trains STEPS steps (momentum SGD, DistributedSampler), rank 0 checkpointing every 2
//     steps, every rank resuming from the newest checkpoint on start. In the first round rank 1
//     SIGKILLs itself before step KILL_AT (-1: never). Writes OUT_DIR/final_rank<R>.json.
//   torch_worker fusedsgd OUT_DIR
//     Twenty steps of three SGD parameter groups (Nesterov with weight decay; momentum with
//     dampening; plain) through FusedSgdStep against the same model trained with the optimizer's
//     own step(). Writes OUT_DIR/fused.json with the largest difference of the parameters and
//     of the momentum buffers, and how many steps were fused (all but the first).
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <torch/torch.h>

#include "crun/worker/context.h"
#include "crun/worker/gloo.h"
#include "crun/worker/sampler.h"
#include "crun/worker/torch.h"
#include "tests/workers/json_report.h"

namespace {

using crun::worker::ProcessGroup;

struct Failure {
  std::string what;
};

void Require(const crun::Status& s, const std::string& what) {
  if (!s.ok()) throw Failure{what + ": " + s.ToString()};
}

torch::nn::Sequential MakeModel() {
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(),
                               torch::nn::Linear(16, 16), torch::nn::ReLU(),
                               torch::nn::Linear(16, 3));
}

// The synthetic dataset: the same on every rank.
std::pair<torch::Tensor, torch::Tensor> Data(std::int64_t n) {
  torch::manual_seed(7);
  auto x = torch::randn({n, 8});
  auto y = (x.sum(1) > 0).to(torch::kLong) + (x.select(1, 0) > 0.5).to(torch::kLong);
  return {x, y};
}

std::vector<torch::Tensor> Snapshot(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

double MaxDiff(torch::nn::Module& m, const std::vector<torch::Tensor>& ref) {
  double worst = 0;
  auto ps = m.parameters();
  for (std::size_t i = 0; i < ps.size(); ++i) {
    worst = std::max(worst, (ps[i] - ref[i]).abs().max().item<double>());
  }
  return worst;
}

double Checksum(torch::nn::Module& m) {
  double sum = 0;
  for (auto& p : m.parameters()) sum += p.to(torch::kDouble).abs().sum().item<double>();
  return sum;
}

int GradCheck(ProcessGroup& g, const std::string& out) {
  const std::int64_t shard = 6;
  auto [x, y] = Data(shard * g.size());
  torch::manual_seed(100 + g.rank());  // different weights on every rank...
  auto model = MakeModel();
  Require(crun::worker::BroadcastParameters(g, *model), "broadcast");  // ...until now
  auto reference = MakeModel();
  {
    torch::NoGradGuard no_grad;
    auto src = model->parameters(), dst = reference->parameters();
    for (std::size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  const auto initial = Snapshot(*model);
  crun::worker::GradientAverager avg(g, *model, /*bucket_bytes=*/512);
  torch::optim::SGD opt(model->parameters(), 0.1);
  torch::optim::SGD ref_opt(reference->parameters(), 0.1);
  auto mine_x = x.narrow(0, g.rank() * shard, shard), mine_y = y.narrow(0, g.rank() * shard, shard);
  for (int step = 0; step < 5; ++step) {
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model->forward(mine_x), mine_y).backward();
    Require(avg.Finish(), "gradient averaging");
    opt.step();
    ref_opt.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
    ref_opt.step();
  }
  WriteJsonReport(out + "/rank" + std::to_string(g.rank()) + ".json",
                  {{"rank", g.rank()},
                   {"buckets", avg.bucket_count()},
                   {"moved", MaxDiff(*model, initial)},
                   {"max_diff", MaxDiff(*model, Snapshot(*reference))},
                   {"checksum", Checksum(*model)}});
  return 0;
}

int Resume(crun::worker::Context& ctx, ProcessGroup& g, const std::string& out,
           const std::string& ckpt_dir, int steps, int kill_at) {
  auto [x, y] = Data(64);
  torch::manual_seed(1);
  auto model = MakeModel();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  crun::worker::CheckpointDir dir(ckpt_dir, 3);
  auto loaded = crun::worker::LoadNewestCheckpoint(dir, *model, &opt);
  Require(loaded.status(), "load checkpoint");
  const int start = loaded->has_value() ? static_cast<int>(**loaded) : 0;
  if (!loaded->has_value()) Require(crun::worker::BroadcastParameters(g, *model), "broadcast");
  crun::worker::GradientAverager avg(g, *model, 1024);
  auto sampler = crun::worker::DistributedSampler::Create(64, g.rank(), g.size());
  Require(sampler.status(), "sampler");
  const int batch = 4;
  const int per_epoch = static_cast<int>(sampler->size()) / batch;
  for (int step = start; step < steps; ++step) {
    if (ctx.env().restart_count == 0 && step == kill_at && g.rank() == 1) {
      std::fprintf(stderr, "rank 1: killing myself before step %d\n", step);
      raise(SIGKILL);
    }
    sampler->set_epoch(static_cast<std::uint64_t>(step / per_epoch));
    const auto idx = sampler->indices();
    std::vector<std::int64_t> rows;
    for (int k = 0; k < batch; ++k) {
      rows.push_back(
          static_cast<std::int64_t>(idx[static_cast<std::size_t>((step % per_epoch) * batch + k)]));
    }
    auto sel = torch::tensor(rows);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model->forward(x.index_select(0, sel)),
                                         y.index_select(0, sel))
        .backward();
    Require(avg.Finish(), "gradient averaging");
    opt.step();
    if ((step + 1) % 2 == 0) {
      Require(crun::worker::SaveCheckpoint(g, dir, static_cast<std::uint64_t>(step + 1), *model,
                                           &opt),
              "save checkpoint");
      Require(g.Barrier(), "barrier after checkpoint");  // nobody runs ahead of the file
    }
  }
  WriteJsonReport(out + "/final_rank" + std::to_string(g.rank()) + ".json",
                  {{"rank", g.rank()},
                   {"resumed_from", start},
                   {"restart_count", ctx.env().restart_count},
                   {"checksum", Checksum(*model)}});
  return 0;
}

// Two copies of one model, their parameters split into three groups, trained alike but for
// the optimizer step: FusedSgdStep for the first, SGD::step() for the second.
int FusedSgd(const std::string& out) {
  auto Groups = [](torch::nn::Sequential& m) {
    auto ps = m->parameters();  // 3 Linear layers: weight, bias each
    using torch::optim::SGDOptions;
    std::vector<torch::optim::OptimizerParamGroup> g;
    g.emplace_back(std::vector<torch::Tensor>{ps[0], ps[1]},
                   std::make_unique<SGDOptions>(
                       SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(5e-4)));
    g.emplace_back(std::vector<torch::Tensor>{ps[2], ps[3]},
                   std::make_unique<SGDOptions>(SGDOptions(0.03).momentum(0.8).dampening(0.1)));
    g.emplace_back(std::vector<torch::Tensor>{ps[4], ps[5]},
                   std::make_unique<SGDOptions>(SGDOptions(0.1)));
    return g;
  };
  torch::manual_seed(3);
  auto fused = MakeModel();
  auto plain = MakeModel();
  {
    torch::NoGradGuard ng;
    auto a = fused->parameters(), b = plain->parameters();
    for (std::size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
  }
  torch::optim::SGD fused_opt(Groups(fused), torch::optim::SGDOptions(0.1));
  torch::optim::SGD plain_opt(Groups(plain), torch::optim::SGDOptions(0.1));
  auto [x, y] = Data(64);
  int fused_steps = 0;
  for (int step = 0; step < 20; ++step) {
    for (auto [m, opt] : {std::pair{&fused, &fused_opt}, std::pair{&plain, &plain_opt}}) {
      opt->zero_grad();
      torch::nn::functional::cross_entropy((*m)->forward(x), y).backward();
    }
    fused_steps += crun::worker::FusedSgdStep(fused_opt) ? 1 : 0;
    plain_opt.step();
  }
  // The momentum buffers, as snapshots see them ("sgd.momentum/I", float32).
  auto Buffers = [](torch::nn::Module& m, torch::optim::SGD& opt) {
    auto items = crun::worker::SnapshotItemsOf(m, &opt);
    Require(items.status(), "snapshot items");
    std::map<std::string, std::vector<float>> bufs;
    for (auto& item : *items) {
      if (item.name.rfind("sgd.momentum/", 0) != 0) continue;
      std::vector<float> v(item.bytes / sizeof(float));
      item.fill(reinterpret_cast<unsigned char*>(v.data()));
      bufs[item.name] = std::move(v);
    }
    return bufs;
  };
  const auto fb = Buffers(*fused, fused_opt), pb = Buffers(*plain, plain_opt);
  double buffers = fb.size() == pb.size() && fb.size() == 4 ? 0 : 1e9;
  for (const auto& [name, v] : fb) {
    const auto it = pb.find(name);
    if (it == pb.end() || it->second.size() != v.size()) {
      buffers = 1e9;
      continue;
    }
    for (std::size_t i = 0; i < v.size(); ++i) {
      buffers = std::max(buffers, static_cast<double>(std::abs(v[i] - it->second[i])));
    }
  }
  torch::manual_seed(3);
  auto start = MakeModel();
  WriteJsonReport(out + "/fused.json", {{"max_diff", MaxDiff(*fused, Snapshot(*plain))},
                                        {"moved", MaxDiff(*fused, Snapshot(*start))},
                                        {"buffers_diff", buffers},
                                        {"fused_steps", fused_steps}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 2 && args[0] == "fusedsgd") {  // no group: one process
    try {
      return FusedSgd(args[1]);
    } catch (const Failure& f) {
      std::fprintf(stderr, "torch_worker: %s\n", f.what.c_str());
      return 1;
    }
  }
  auto ctx = crun::worker::Context::FromEnvironment();
  if (!ctx.ok()) {
    std::fprintf(stderr, "torch_worker: %s\n", ctx.status().message().c_str());
    return 2;
  }
  try {
    auto group = crun::worker::MakeGlooGroup(**ctx);
    Require(group.status(), "gloo group");
    if (args.size() == 2 && args[0] == "gradcheck") return GradCheck(**group, args[1]);
    if (args.size() == 5 && args[0] == "resume") {
      return Resume(**ctx, **group, args[1], args[2], std::stoi(args[3]), std::stoi(args[4]));
    }
  } catch (const Failure& f) {
    std::fprintf(stderr, "torch_worker rank %d: %s\n", (*ctx)->env().rank, f.what.c_str());
    return 1;
  }
  std::fprintf(stderr,
               "usage: torch_worker gradcheck OUT_DIR | resume OUT_DIR CKPT STEPS KILL_AT | "
               "fusedsgd OUT_DIR\n");
  return 2;
}
