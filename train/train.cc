// train: CIFAR-10 on libtorch and crun's worker SDK, the reference workload
// (`crun --nproc-per-node 2 train --synthetic 10000`). The one translation unit that includes
// libtorch; options and data live in options.cc and cifar.cc. docs/train.md describes it.
#include <ATen/autocast_mode.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "crun/worker/checkpoint.h"
#include "crun/worker/context.h"
#include "crun/worker/sampler.h"
#include "crun/worker/torch.h"
#include "train/cifar.h"
#include "train/options.h"
#ifdef CRUN_WITH_GLOO
#include "crun/worker/gloo.h"
#endif
#ifdef CRUN_WITH_NCCL
#include "crun/worker/nccl.h"
#endif

namespace crun::train {
namespace {

using Clock = std::chrono::steady_clock;
using crun::worker::ProcessGroup;

// ---------------------------------------------------------------------------------- model

// Two 3x3 convolutions with batch norm and a shortcut (1x1 convolution where the shape changes).
struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(int in, int out, int stride)
      : conv1(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)),
        bn1(out),
        conv2(torch::nn::Conv2dOptions(out, out, 3).stride(1).padding(1).bias(false)),
        bn2(out) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    if (stride != 1 || in != out) {
      shortcut = register_module(
          "shortcut",
          torch::nn::Sequential(
              torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
              torch::nn::BatchNorm2d(out)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    auto y = torch::relu(bn1(conv1(x)));
    y = bn2(conv2(y));
    return torch::relu(y + (shortcut.is_empty() ? x : shortcut->forward(x)));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Sequential shortcut{nullptr};
};
TORCH_MODULE(BasicBlock);

// CIFAR ResNets: a 3x3 stem (no max-pool: the images are 32x32), stages of basic blocks, global
// average pooling, one linear layer. resnet18: widths 64-512, two blocks per stage (11.2 M
// parameters). resnet-small: widths 16-64, one block per stage, for CPUs.
struct ResNetImpl : torch::nn::Module {
  ResNetImpl(const std::vector<int>& widths, int blocks_per_stage)
      : stem(torch::nn::Conv2dOptions(3, widths[0], 3).stride(1).padding(1).bias(false)),
        bn(widths[0]) {
    register_module("stem", stem);
    register_module("bn", bn);
    int in = widths[0];
    for (std::size_t s = 0; s < widths.size(); ++s) {
      for (int b = 0; b < blocks_per_stage; ++b) {
        const int stride = (s > 0 && b == 0) ? 2 : 1;
        blocks->push_back(BasicBlock(in, widths[s], stride));
        in = widths[s];
      }
    }
    register_module("blocks", blocks);
    fc = register_module("fc", torch::nn::Linear(in, kClasses));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn(stem(x)));
    x = blocks->forward(x);
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return fc(x);
  }
  torch::nn::Conv2d stem;
  torch::nn::BatchNorm2d bn;
  torch::nn::Sequential blocks;
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet);

ResNet MakeModel(const std::string& name) {
  if (name == "resnet18") return ResNet(std::vector<int>{64, 128, 256, 512}, 2);
  return ResNet(std::vector<int>{16, 32, 64}, 1);
}

// ------------------------------------------------------------------------------ autocast

// Autocast on the GPU; the C++ API changed in PyTorch 2.4.
class AutocastScope {
 public:
  AutocastScope(bool on, at::ScalarType dtype) : on_(on) {
    if (!on_) return;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, dtype);
#else
    at::autocast::set_enabled(true);
    at::autocast::set_autocast_gpu_dtype(dtype);
#endif
  }
  ~AutocastScope() {
    if (!on_) return;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_enabled(at::kCUDA, false);
#else
    at::autocast::set_enabled(false);
#endif
    at::autocast::clear_cache();
  }

 private:
  bool on_;
};

// ------------------------------------------------------------------------------- helpers

struct Job {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  int local_world = 1;
  int restart = 0;
  std::unique_ptr<worker::Context> context;  // none when run without a launcher
  std::unique_ptr<ProcessGroup> group;
};

[[noreturn]] void Die(const Job& job, int code, const std::string& what) {
  std::fprintf(stderr, "train: rank %d: %s\n", job.rank, what.c_str());
  std::fflush(stderr);
  std::_Exit(code);
}

void Check(const Job& job, const Status& s, const std::string& what) {
  if (!s.ok()) Die(job, 1, what + ": " + s.ToString());
}

// A host batch on `dev`: on a GPU through pinned memory, copied asynchronously (libtorch's
// pinned-memory cache keeps the buffer until the copy is done).
torch::Tensor ToDevice(const torch::Tensor& host, torch::Device dev) {
  if (!dev.is_cuda()) return host;  // used up within the step, before the batch is replaced
  auto pinned = torch::empty(host.sizes(), host.options().pinned_memory(true));
  pinned.copy_(host);
  return pinned.to(dev, /*non_blocking=*/true);
}

// Sums int64 counters over the ranks (on the group's device).
std::vector<std::int64_t> SumOverRanks(Job& job, std::vector<std::int64_t> v, torch::Device dev) {
  if (!job.group) return v;
  auto t = torch::tensor(at::ArrayRef<std::int64_t>(v), torch::TensorOptions(torch::kInt64)).to(dev);
  Check(job, job.group->AllReduce(t.data_ptr(), v.size(), worker::DType::kInt64,
                                  worker::ReduceOp::kSum),
        "summing counters");
  t = t.cpu();
  return std::vector<std::int64_t>(t.data_ptr<std::int64_t>(), t.data_ptr<std::int64_t>() + v.size());
}

// Every rank's value of `x`.
std::vector<std::int64_t> GatherFromRanks(Job& job, std::int64_t x, torch::Device dev) {
  if (!job.group) return {x};
  auto in = torch::full({1}, x, torch::TensorOptions(torch::kInt64)).to(dev);
  auto out = torch::zeros({job.world}, torch::TensorOptions(torch::kInt64).device(dev));
  Check(job, job.group->AllGather(in.data_ptr(), out.data_ptr(), 1, worker::DType::kInt64),
        "gathering parameter hashes");
  out = out.cpu();
  return std::vector<std::int64_t>(out.data_ptr<std::int64_t>(), out.data_ptr<std::int64_t>() + job.world);
}

// FNV-1a over every parameter's bytes (on the CPU, in order): equal on every rank exactly when
// the ranks hold the same parameters.
std::int64_t ParameterHash(torch::nn::Module& m) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const auto& p : m.parameters()) {
    auto c = p.detach().to(torch::kCPU).contiguous();
    const auto* b = static_cast<const std::uint8_t*>(c.data_ptr());
    for (std::size_t i = 0, n = c.numel() * c.element_size(); i < n; ++i) {
      h = (h ^ b[i]) * 1099511628211ULL;
    }
  }
  return static_cast<std::int64_t>(h >> 1);
}

// Learning rate at `t` epochs into training: linear warm-up to the peak, then cosine to zero;
// or one-cycle (up for 30 %, then cosine down to 1/1000 of the peak).
double LearningRate(const Options& o, double t) {
  const double total = o.epochs;
  if (o.schedule == Schedule::kOneCycle) {
    const double up = 0.3 * total;
    if (t < up) return o.lr * (0.04 + 0.96 * t / up);
    const double f = (t - up) / std::max(total - up, 1e-9);
    return o.lr * (0.001 + 0.999 * 0.5 * (1 + std::cos(M_PI * std::min(f, 1.0))));
  }
  if (t < o.warmup_epochs) return o.lr * (t + 1e-3) / o.warmup_epochs;
  const double f = (t - o.warmup_epochs) / std::max(total - o.warmup_epochs, 1e-9);
  return o.lr * 0.5 * (1 + std::cos(M_PI * std::min(f, 1.0)));
}

std::string Hms(double seconds) {
  const long s = std::lround(std::max(seconds, 0.0));
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

// Rank 0's progress: a bar redrawn in place on a terminal, plain lines every `log_every`
// steps otherwise.
class Progress {
 public:
  Progress(bool enabled, int log_every)
      : enabled_(enabled), tty_(enabled && ::isatty(STDOUT_FILENO)), log_every_(log_every) {}
  // Whether Step() would print this step: the caller reads the loss (a GPU sync) only then.
  bool WillPrint(std::size_t step, std::size_t steps) const {
    if (!enabled_) return false;
    if (step == steps) return true;
    if (tty_) return Clock::now() - last_draw_ >= std::chrono::milliseconds(250);
    return step % static_cast<std::size_t>(log_every_) == 0;
  }
  void Step(int epoch, int epochs, std::size_t step, std::size_t steps, double loss, double lr,
            double images_per_s, double eta_s) {
    if (!WillPrint(step, steps)) return;
    last_draw_ = Clock::now();
    const bool last = step == steps;
    if (tty_) {
      const int width = 24;
      const int filled = static_cast<int>(width * static_cast<double>(step) / static_cast<double>(steps));
      std::printf("\repoch %d/%d [%s%s] %zu/%zu loss %.4f lr %.4f %.0f img/s ETA %s ", epoch, epochs,
                  std::string(static_cast<std::size_t>(filled), '#').c_str(),
                  std::string(static_cast<std::size_t>(width - filled), '.').c_str(), step, steps, loss,
                  lr, images_per_s, Hms(eta_s).c_str());
      if (last) std::printf("\n");
      std::fflush(stdout);
    } else {
      std::printf("epoch %d/%d step %zu/%zu loss %.4f lr %.4f %.0f img/s eta %s\n", epoch, epochs,
                  step, steps, loss, lr, images_per_s, Hms(eta_s).c_str());
      std::fflush(stdout);
    }
  }
  void Line(const std::string& s) {
    if (!enabled_) return;
    std::printf("%s\n", s.c_str());
    std::fflush(stdout);
  }

 private:
  bool enabled_, tty_;
  int log_every_;
  Clock::time_point last_draw_{};
};

// ------------------------------------------------------------------------------------ main

int Run(const Options& o) {
  Job job;
  // Under crun or torchrun the environment names the job; a broken one is an error. Run by
  // hand (no WORLD_SIZE at all) it trains alone.
  if (std::getenv("WORLD_SIZE") != nullptr) {
    auto ctx = worker::Context::FromEnvironment();
    if (!ctx.ok()) Die(job, 2, ctx.status().ToString());
    job.context = std::move(*ctx);
    const auto& env = job.context->env();
    job.rank = env.rank;
    job.world = env.world_size;
    job.local_rank = env.local_rank;
    job.local_world = env.local_world_size;
    job.restart = env.restart_count;
  }

  // Device.
  const bool have_cuda = torch::cuda::is_available();
  if (o.device == Device::kCuda && !have_cuda) {
    Die(job, 2, "--device cuda: no CUDA device visible to this libtorch (torch::cuda::device_count() = " +
                    std::to_string(torch::cuda::device_count()) + ")");
  }
  const bool cuda = o.device == Device::kCuda || (o.device == Device::kAuto && have_cuda);
  if (o.amp != Amp::kOff && !cuda) Die(job, 2, "--amp " + std::string(Name(o.amp)) + " needs a CUDA device");
  const torch::Device dev = cuda ? torch::Device(torch::kCUDA, static_cast<int>(job.local_rank % std::max<std::int64_t>(torch::cuda::device_count(), 1)))
                                 : torch::Device(torch::kCPU);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = o.threads > 0 ? o.threads : std::max(1, cores / std::max(1, job.local_world));
  const int loader_threads =
      o.loader_threads > 0 ? o.loader_threads : (cuda ? std::clamp(cores / std::max(1, job.local_world) - 1, 1, 8) : 1);
  torch::set_num_threads(threads);
  torch::manual_seed(o.seed);

  // Process group: NCCL for GPUs, Gloo for CPUs.
  if (job.context) {
    StatusOr<std::unique_ptr<ProcessGroup>> made =
        InvalidArgument(std::string("--device ") + (cuda ? "cuda" : "cpu") + " under a launcher needs a build with the " +
                        (cuda ? "NCCL backend (CRUN_WITH_NCCL)" : "Gloo backend (CRUN_WITH_GLOO)"));
    if (cuda) {
#ifdef CRUN_WITH_NCCL
      worker::NcclOptions no;
      no.name = "train";
      no.device = dev.index();
      made = worker::MakeNcclGroup(*job.context, no);
#endif
    } else {
#ifdef CRUN_WITH_GLOO
      worker::GlooOptions go;
      go.name = "train";
      made = worker::MakeGlooGroup(*job.context, go);
#endif
    }
    if (!made.ok()) Die(job, made.status().code() == StatusCode::kInvalidArgument ? 2 : 1, made.status().ToString());
    job.group = std::move(*made);
  }
  Progress progress(job.rank == 0, o.log_every);

  // Data: the binary files, generated first with --synthetic.
  std::string data_dir = o.data_dir;
  if (o.synthetic > 0) {
    if (data_dir.empty()) {
      data_dir = (std::filesystem::temp_directory_path() /
                  ("crun-train-synthetic-" + std::to_string(o.synthetic) + "-" + std::to_string(o.seed)))
                     .string();
    }
    const auto t0 = Clock::now();
    Check(job, WriteSyntheticCifar(data_dir, static_cast<std::size_t>(o.synthetic),
                                   static_cast<std::size_t>(std::max<std::int64_t>(o.synthetic / 5, 10)), o.seed),
          "generating synthetic CIFAR-10");
    std::ostringstream s;
    s << "synthetic CIFAR-10: " << o.synthetic << " training images in " << data_dir << " ("
      << std::chrono::duration<double>(Clock::now() - t0).count() << " s)";
    progress.Line(s.str());
  }
  auto train_set = LoadCifar(data_dir, true);
  if (!train_set.ok()) Die(job, 2, train_set.status().ToString());
  auto test_set = LoadCifar(data_dir, false);
  if (!test_set.ok()) Die(job, 2, test_set.status().ToString());
  const std::size_t global_batch = static_cast<std::size_t>(o.batch_size) * static_cast<std::size_t>(job.world);
  if (train_set->size() < global_batch) {
    Die(job, 2, "--batch-size " + std::to_string(o.batch_size) + " x " + std::to_string(job.world) +
                    " workers is more than the " + std::to_string(train_set->size()) + " training images");
  }

  // Model and optimizer; rank 0's initial weights everywhere.
  ResNet model = MakeModel(o.model);
  model->to(dev);
  if (o.channels_last) {
    torch::NoGradGuard ng;
    for (auto& p : model->parameters()) {
      if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
    }
  }
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(o.lr)
                                                       .momentum(o.momentum)
                                                       .nesterov(o.momentum > 0)
                                                       .weight_decay(o.weight_decay));
  int start_epoch = 0;
  std::optional<worker::CheckpointDir> ckpt;
  if (!o.checkpoint_dir.empty()) {
    ckpt.emplace(o.checkpoint_dir, 2);
    auto loaded = worker::LoadNewestCheckpoint(*ckpt, *model, &optimizer, dev);
    if (!loaded.ok()) Die(job, 1, loaded.status().ToString());
    if (loaded->has_value()) start_epoch = static_cast<int>(**loaded);
  }
  // Every rank must resume from the same epoch (a checkpoint directory not shared by all
  // nodes would break this): compare, then take rank 0's weights.
  if (job.group) {
    const auto epochs = GatherFromRanks(job, start_epoch, dev);
    for (int r = 0; r < job.world; ++r) {
      if (epochs[static_cast<std::size_t>(r)] != start_epoch) {
        Die(job, 1, "rank " + std::to_string(r) + " resumes from epoch " +
                        std::to_string(epochs[static_cast<std::size_t>(r)]) + ", this rank from " +
                        std::to_string(start_epoch) + ": is --checkpoint-dir shared by every node?");
      }
    }
    Check(job, worker::BroadcastParameters(*job.group, *model), "broadcasting parameters");
  }
  std::size_t params = 0;
  for (const auto& p : model->parameters()) params += static_cast<std::size_t>(p.numel());
  {
    std::ostringstream s;
    s << "train: " << o.model << " (" << params << " parameters) on " << (cuda ? "cuda" : "cpu")
      << ", " << job.world << " worker(s) x batch " << o.batch_size << ", " << threads
      << " thread(s) each (+" << loader_threads << " loading), backend " << (job.group ? job.group->backend() : "none")
      << ", amp " << Name(o.amp) << (o.channels_last ? ", channels-last" : "") << "; "
      << train_set->size() << " training / " << test_set->size() << " test images";
    if (start_epoch > 0) s << "; resuming after epoch " << start_epoch << " (restart " << job.restart << ")";
    progress.Line(s.str());
  }
  std::unique_ptr<worker::GradientAverager> averager;
  // One worker has nothing to average with.
  if (job.group && job.world > 1) averager = std::make_unique<worker::GradientAverager>(*job.group, *model);

  worker::SamplerOptions so;
  so.seed = o.seed;
  so.drop_last = true;
  worker::DistributedSampler sampler(train_set->size(), job.rank, job.world, so);
  const std::size_t steps = std::max<std::size_t>(1, sampler.size() / static_cast<std::size_t>(o.batch_size));
  const std::size_t steps_run = o.max_steps > 0 ? std::min<std::size_t>(steps, static_cast<std::size_t>(o.max_steps)) : steps;
  const at::ScalarType amp_dtype = o.amp == Amp::kFp16 ? at::kHalf : at::kBFloat16;
  double loss_scale = o.amp == Amp::kFp16 ? 65536.0 : 1.0;
  int good_steps = 0;
  std::int64_t skipped_steps = 0;

  std::vector<double> accuracies;
  double last_loss = 0, train_seconds = 0;
  std::int64_t images_trained = 0;
  const auto run_start = Clock::now();

  auto evaluate = [&]() {
    torch::NoGradGuard ng;
    model->eval();
    std::vector<std::size_t> mine;
    for (std::size_t i = static_cast<std::size_t>(job.rank); i < test_set->size(); i += static_cast<std::size_t>(job.world)) mine.push_back(i);
    std::int64_t correct = 0;
    const std::size_t eb = 256;
    for (std::size_t b = 0; b < mine.size(); b += eb) {
      const std::size_t n = std::min(eb, mine.size() - b);
      Batch batch = MakeBatch(*test_set, mine.data() + b, n, false, 0);
      auto x = torch::from_blob(batch.images.data(), {static_cast<long>(n), 3, kSide, kSide}).to(dev);
      if (o.channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
      auto y = torch::from_blob(batch.labels.data(), {static_cast<long>(n)}, torch::kInt64).to(dev);
      torch::Tensor out;
      {
        AutocastScope amp(o.amp != Amp::kOff, amp_dtype);
        out = model->forward(x);
      }
      correct += out.argmax(1).eq(y).sum().item<std::int64_t>();
    }
    model->train();
    const auto sums = SumOverRanks(job, {correct, static_cast<std::int64_t>(mine.size())}, dev);
    return static_cast<double>(sums[0]) / static_cast<double>(std::max<std::int64_t>(sums[1], 1));
  };

  model->train();
  for (int epoch = start_epoch; epoch < o.epochs; ++epoch) {
    sampler.set_epoch(static_cast<std::uint64_t>(epoch));
    Prefetcher data(*train_set, sampler.indices(), static_cast<std::size_t>(o.batch_size), true, true,
                    o.seed * 1000003ULL + static_cast<std::uint64_t>(epoch) * 7919ULL + static_cast<std::uint64_t>(job.rank),
                    static_cast<std::size_t>(2 * loader_threads + 2), loader_threads, /*low_priority=*/!cuda);
    const auto epoch_start = Clock::now();
    torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions(torch::kFloat64).device(dev));
    std::size_t loss_n = 0;
    Batch batch;
    for (std::size_t step = 1; step <= steps_run && data.Next(&batch); ++step) {
      const double lr = LearningRate(o, epoch + static_cast<double>(step - 1) / static_cast<double>(steps));
      for (auto& group : optimizer.param_groups()) {
        static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr);
      }
      const long n = static_cast<long>(batch.size());
      auto x = ToDevice(torch::from_blob(batch.images.data(), {n, 3, kSide, kSide}), dev);
      if (o.channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
      auto y = ToDevice(torch::from_blob(batch.labels.data(), {n}, torch::kInt64), dev);
      optimizer.zero_grad();
      torch::Tensor loss;
      {
        AutocastScope amp(o.amp != Amp::kOff, amp_dtype);
        auto logits = model->forward(x);
        loss = torch::nn::functional::cross_entropy(
            logits.to(torch::kFloat32), y,
            torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(o.label_smoothing));
      }
      (loss_scale != 1.0 ? loss * loss_scale : loss).backward();
      if (averager) Check(job, averager->Finish(), "averaging gradients");
      bool apply = true;
      if (o.amp == Amp::kFp16) {
        // Dynamic loss scaling: the gradients are already the same on every rank, so every
        // rank takes the same decision.
        torch::NoGradGuard ng;
        std::vector<torch::Tensor> grads;
        for (auto& p : model->parameters()) {
          if (p.grad().defined()) grads.push_back(p.mutable_grad());
        }
        // One fused kernel unscales every gradient and flags any inf/NaN; one sync reads it.
        auto found_inf = torch::zeros({1}, torch::TensorOptions(torch::kFloat32).device(dev));
        auto inv_scale = torch::full({1}, 1.0 / loss_scale, torch::TensorOptions(torch::kFloat32).device(dev));
        at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
        if (found_inf.item<float>() == 0.0f) {
          if (++good_steps % 1000 == 0) loss_scale *= 2;
        } else {
          loss_scale /= 2;
          good_steps = 0;
          ++skipped_steps;
          apply = false;
        }
      }
      if (apply) optimizer.step();
      loss_sum += loss.detach().to(torch::kFloat64);
      ++loss_n;
      images_trained += n;
      const double elapsed = std::chrono::duration<double>(Clock::now() - epoch_start).count();
      const double ips = static_cast<double>(step) * static_cast<double>(o.batch_size) / std::max(elapsed, 1e-9);
      const double eta = elapsed / static_cast<double>(step) *
                         static_cast<double>((steps_run - step) + (o.epochs - epoch - 1) * steps_run);
      if (progress.WillPrint(step, steps_run)) {
        progress.Step(epoch + 1, o.epochs, step, steps_run, loss_sum.item<double>() / static_cast<double>(loss_n),
                      lr, ips * job.world, eta);
      }
    }
    const double epoch_loss = loss_sum.item<double>() / static_cast<double>(std::max<std::size_t>(loss_n, 1));
    last_loss = epoch_loss;
    train_seconds += std::chrono::duration<double>(Clock::now() - epoch_start).count();
    // Batch-norm statistics are per rank: make rank 0's everyone's before evaluating and saving.
    if (job.group) Check(job, worker::BroadcastParameters(*job.group, *model), "synchronising buffers");
    const bool last = epoch + 1 == o.epochs;
    if ((epoch + 1) % o.eval_every == 0 || last) {
      const double acc = evaluate();
      accuracies.push_back(acc);
      char line[128];
      std::snprintf(line, sizeof(line), "epoch %d/%d: train loss %.4f, test accuracy %.2f %%", epoch + 1, o.epochs,
                    epoch_loss, acc * 100);
      progress.Line(line);
    }
    if (ckpt && ((epoch + 1) % o.checkpoint_every == 0 || last)) {
      Check(job, worker::SaveCheckpoint(job.rank, *ckpt, static_cast<std::uint64_t>(epoch + 1), *model,
                                        &optimizer),
            "saving checkpoint " + std::to_string(epoch + 1));
    }
  }

  const auto hashes = GatherFromRanks(job, ParameterHash(*model), dev);
  const bool identical = std::all_of(hashes.begin(), hashes.end(), [&](std::int64_t h) { return h == hashes[0]; });
  const double wall = std::chrono::duration<double>(Clock::now() - run_start).count();
  const double ips_worker = static_cast<double>(images_trained) / std::max(train_seconds, 1e-9);
  if (job.rank == 0) {
    const double final_acc = accuracies.empty() ? -1 : accuracies.back();
    char line[256];
    std::snprintf(line, sizeof(line),
                  "done: %d epoch(s) from epoch %d in %.1f s; %.1f images/s per worker (%d worker(s)); "
                  "final test accuracy %.2f %%; parameters identical on all ranks: %s",
                  o.epochs - start_epoch, start_epoch, wall, ips_worker, job.world, final_acc * 100,
                  identical ? "yes" : "NO");
    progress.Line(line);
    if (!o.metrics_json.empty()) {
      std::ofstream f(o.metrics_json);
      f << "{\"model\": \"" << o.model << "\", \"device\": \"" << (cuda ? "cuda" : "cpu")
        << "\", \"world_size\": " << job.world << ", \"batch_size\": " << o.batch_size
        << ", \"epochs\": " << o.epochs << ", \"start_epoch\": " << start_epoch
        << ", \"restart_count\": " << job.restart << ", \"amp\": \"" << Name(o.amp)
        << "\", \"channels_last\": " << (o.channels_last ? "true" : "false")
        << ", \"threads\": " << threads << ", \"train_images\": " << train_set->size()
        << ", \"images_trained\": " << images_trained << ", \"train_seconds\": " << train_seconds
        << ", \"images_per_second_per_worker\": " << ips_worker << ", \"wall_seconds\": " << wall
        << ", \"final_train_loss\": " << last_loss << ", \"skipped_steps\": " << skipped_steps
        << ", \"test_accuracy\": [";
      for (std::size_t i = 0; i < accuracies.size(); ++i) f << (i ? ", " : "") << accuracies[i];
      f << "], \"parameter_hashes\": [";
      for (std::size_t i = 0; i < hashes.size(); ++i) f << (i ? ", " : "") << hashes[i];
      f << "], \"parameters_identical\": " << (identical ? "true" : "false") << "}\n";
      if (!f) Die(job, 1, "cannot write --metrics-json " + o.metrics_json);
    }
  }
  if (!identical) Die(job, 1, "parameters differ between ranks after training");
  return 0;
}

}  // namespace
}  // namespace crun::train

int main(int argc, char** argv) {
#if defined(__GLIBC__)
  // A training step frees and reallocates the same large buffers (activations, gradients)
  // every time. By default glibc hands big blocks back to the kernel on free (mmap'd ones
  // are unmapped, a heap top over the trim threshold is trimmed), so every step page-faults
  // and zeroes them again. Keep them instead. Measured on 2 vCPUs, resnet-small, 1 worker:
  // 953-1013 images/s before, 1162-1219 after.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest: blocks below it come from the heap
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
  std::string error;
  auto o = crun::train::ParseOptions(std::vector<std::string>(argv + 1, argv + argc), &error);
  if (!o) {
    std::fprintf(stderr, "train: %s\n", error.c_str());
    return 2;
  }
  if (o->help) {
    std::printf("%s", crun::train::Usage().c_str());
    return 0;
  }
  try {
    return crun::train::Run(*o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train: %s\n", e.what());
    return 1;
  }
}
