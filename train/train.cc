// train: CIFAR-10 on libtorch and crun's worker SDK, the reference workload
// (`crun --nproc-per-node 2 train --synthetic 10000`): Training's loop and end, and main. Its
// set-up is training_setup.cc; options, data and progress (no libtorch) live in options.cc,
// cifar.cc and progress.cc. docs/train.md describes it.
#include <torch/torch.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "crun/worker/heartbeat.h"
#include "crun/worker/sampler.h"
#include "train/training.h"

namespace crun::train {
namespace {

// A host batch on `dev`: on a GPU through pinned memory, copied asynchronously (libtorch's
// pinned-memory cache keeps the buffer until the copy is done).
torch::Tensor ToDevice(const torch::Tensor& host, torch::Device dev) {
  if (!dev.is_cuda()) return host;  // used up within the step, before the batch is replaced
  auto pinned = torch::empty(host.sizes(), host.options().pinned_memory(true));
  // One plain copy on this thread: copy_ would wake the intra-op pool for 3 MiB.
  std::memcpy(pinned.data_ptr(), host.data_ptr(), host.nbytes());
  return pinned.to(dev, /*non_blocking=*/true);
}

// Adds the time since the last Lap() (or construction) to `into`.
class Laps {
 public:
  void Lap(double& into) {
    const auto now = std::chrono::steady_clock::now();
    into += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

// Sums int64 counters over the ranks (on the group's device).
std::vector<std::int64_t> SumOverRanks(Job& job, std::vector<std::int64_t> v, torch::Device dev) {
  if (!job.group) return v;
  auto t =
      torch::tensor(at::ArrayRef<std::int64_t>(v), torch::TensorOptions(torch::kInt64)).to(dev);
  Check(job,
        job.group->AllReduce(t.data_ptr(), v.size(), worker::DType::kInt64, worker::ReduceOp::kSum),
        "summing counters");
  t = t.cpu();
  return std::vector<std::int64_t>(t.data_ptr<std::int64_t>(),
                                   t.data_ptr<std::int64_t>() + v.size());
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

}  // namespace

std::vector<std::int64_t> GatherFromRanks(Job& job, std::int64_t x, torch::Device dev) {
  if (!job.group) return {x};
  auto in = torch::full({1}, x, torch::TensorOptions(torch::kInt64)).to(dev);
  auto out = torch::zeros({job.world}, torch::TensorOptions(torch::kInt64).device(dev));
  Check(job, job.group->AllGather(in.data_ptr(), out.data_ptr(), 1, worker::DType::kInt64),
        "gathering parameter hashes");
  out = out.cpu();
  return std::vector<std::int64_t>(out.data_ptr<std::int64_t>(),
                                   out.data_ptr<std::int64_t>() + job.world);
}

int Training::Run() {
  JoinJob();
  Place();
  FormGroup();
  progress_ = Progress(job_.rank == 0, o_.log_every);
  LoadData();
  BuildModel();
  Resume();
  Announce();
  const auto run_start = Clock::now();
  model_->train();
  for (int epoch = start_epoch_; epoch < o_.epochs; ++epoch) RunEpoch(epoch);
  Finish(std::chrono::duration<double>(Clock::now() - run_start).count());
  return 0;
}

void Training::RunEpoch(int epoch) {
  const double epoch_loss = TrainEpoch(epoch);
  last_loss_ = epoch_loss;
  // Batch-norm statistics are per rank: make rank 0's everyone's before evaluating and saving.
  if (job_.group) {
    Check(job_, worker::BroadcastParameters(*job_.group, *model_), "synchronising buffers");
  }
  const bool last = epoch + 1 == o_.epochs;
  if ((epoch + 1) % o_.eval_every == 0 || last) {
    const double acc = Evaluate();
    accuracies_.push_back(acc);
    char line[128];
    std::snprintf(line, sizeof(line), "epoch %d/%d: train loss %.4f, test accuracy %.2f %%",
                  epoch + 1, o_.epochs, epoch_loss, acc * 100);
    progress_.Line(line);
  }
  if (ckpt_ && ((epoch + 1) % o_.checkpoint_every == 0 || last)) {
    Check(job_,
          worker::SaveCheckpoint(job_.rank, *ckpt_, static_cast<std::uint64_t>(epoch + 1), *model_,
                                 optimizer_.get()),
          "saving checkpoint " + std::to_string(epoch + 1));
  }
}

// One pass over this rank's share of the training set; the epoch's mean loss.
double Training::TrainEpoch(int epoch) {
  worker::SamplerOptions so;
  so.seed = o_.seed;
  so.drop_last = true;
  auto made = worker::DistributedSampler::Create(train_.size(), job_.rank, job_.world, so);
  if (!made.ok()) Die(job_, 2, made.status().ToString());
  worker::DistributedSampler& sampler = *made;
  sampler.set_epoch(static_cast<std::uint64_t>(epoch));
  const auto batch_size = static_cast<std::size_t>(o_.batch_size);
  const std::size_t steps = std::max<std::size_t>(1, sampler.size() / batch_size);
  const std::size_t steps_run =
      o_.max_steps > 0 ? std::min<std::size_t>(steps, static_cast<std::size_t>(o_.max_steps))
                       : steps;
  const std::uint64_t seed = o_.seed * 1000003ULL + static_cast<std::uint64_t>(epoch) * 7919ULL +
                             static_cast<std::uint64_t>(job_.rank);
  // A resumed epoch begins after the batches its snapshot had trained.
  const std::size_t first = epoch == start_epoch_ && resumed_ ? start_step_ : 0;
  Prefetcher data(train_, sampler.indices(), batch_size, true, true, seed,
                  static_cast<std::size_t>(2 * loader_threads_ + 2), loader_threads_,
                  /*low_priority=*/!cuda_, first);
  const auto epoch_start = Clock::now();
  torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions(torch::kFloat64).device(dev_));
  std::size_t loss_n = 0;
  if (first > 0) {
    loss_sum.fill_(resumed_->loss_sum);
    loss_n = static_cast<std::size_t>(resumed_->loss_n);
  }
  Batch batch;
  for (std::size_t step = first + 1; step <= steps_run; ++step) {
    const auto asked = Clock::now();
    if (!data.Next(&batch)) break;
    // Time the loop waited for its input: where it is large, the data pipeline is the limit.
    data_wait_seconds_ += std::chrono::duration<double>(Clock::now() - asked).count();
    const double lr =
        LearningRate(o_, epoch + static_cast<double>(step - 1) / static_cast<double>(steps));
    loss_sum += TrainStep(batch, lr);
    crun::worker::Heartbeat();  // a step done: progress for crun's --hang-timeout
    ++loss_n;
    images_trained_ += static_cast<std::int64_t>(batch.size());
    const std::uint64_t global_step = static_cast<std::uint64_t>(epoch) * steps_run + step;
    if (snapshots_ && global_step % static_cast<std::uint64_t>(snapshot_every_) == 0) {
      SaveSnapshot(global_step,
                   Position{epoch, static_cast<std::int64_t>(step), loss_sum.item<double>(),
                            static_cast<std::int64_t>(loss_n), images_trained_, loss_scale_,
                            good_steps_, skipped_steps_});
    }
    if (progress_.WillPrint(step, steps_run)) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - epoch_start).count();
      const double ips =
          static_cast<double>(step * batch_size) / std::max(elapsed, 1e-9) * job_.world;
      const double eta =
          elapsed / static_cast<double>(step) *
          static_cast<double>((steps_run - step) +
                              static_cast<std::size_t>(o_.epochs - epoch - 1) * steps_run);
      progress_.Step(epoch + 1, o_.epochs, step, steps_run,
                     loss_sum.item<double>() / static_cast<double>(loss_n), lr, ips, eta);
    }
  }
  train_seconds_ += std::chrono::duration<double>(Clock::now() - epoch_start).count();
  return loss_sum.item<double>() / static_cast<double>(std::max<std::size_t>(loss_n, 1));
}

// Forward, backward, gradients averaged over the ranks, the optimizer's step (skipped when
// fp16 gradients overflowed); the step's loss, on the device.
torch::Tensor Training::TrainStep(Batch& batch, double lr) {
  for (auto& group : optimizer_->param_groups()) {
    static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr);
  }
  Laps laps;
  const long n = static_cast<long>(batch.size());
  auto x = ToDevice(torch::from_blob(batch.images.data(), {n, 3, kSide, kSide}), dev_);
  if (o_.channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
  auto y = ToDevice(torch::from_blob(batch.labels.data(), {n}, torch::kInt64), dev_);
  optimizer_->zero_grad();
  laps.Lap(host_.input);
  torch::Tensor loss;
  {
    AutocastScope amp(o_.amp != Amp::kOff, AmpType());
    auto logits = model_->forward(x);
    loss = torch::nn::functional::cross_entropy(logits.to(torch::kFloat32), y,
                                                torch::nn::functional::CrossEntropyFuncOptions()
                                                    .label_smoothing(o_.label_smoothing));
  }
  laps.Lap(host_.forward);
  (loss_scale_ != 1.0 ? loss * loss_scale_ : loss).backward();
  laps.Lap(host_.backward);
  if (averager_) Check(job_, averager_->Finish(), "averaging gradients");
  laps.Lap(host_.average);
  if (o_.amp != Amp::kFp16 || UnscaleGradients()) worker::FusedSgdStep(*optimizer_);
  laps.Lap(host_.optimizer);
  return loss.detach().to(torch::kFloat64);
}

// Dynamic loss scaling: unscales the gradients; false when any is inf or NaN (the step is
// skipped and the scale halved). The gradients are already the same on every rank, so
// every rank decides the same.
bool Training::UnscaleGradients() {
  torch::NoGradGuard ng;
  std::vector<torch::Tensor> grads;
  for (auto& p : model_->parameters()) {
    if (p.grad().defined()) grads.push_back(p.mutable_grad());
  }
  // One fused kernel unscales every gradient and flags any inf/NaN; one sync reads it.
  const auto f32 = torch::TensorOptions(torch::kFloat32).device(dev_);
  auto found_inf = torch::zeros({1}, f32);
  auto inv_scale = torch::full({1}, 1.0 / loss_scale_, f32);
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
  if (found_inf.item<float>() == 0.0f) {
    if (++good_steps_ % 1000 == 0) loss_scale_ *= 2;
    return true;
  }
  loss_scale_ /= 2;
  good_steps_ = 0;
  ++skipped_steps_;
  return false;
}

// Test accuracy over every rank's share of the test set.
double Training::Evaluate() {
  torch::NoGradGuard ng;
  model_->eval();
  std::vector<std::size_t> mine;
  for (auto i = static_cast<std::size_t>(job_.rank); i < test_.size();
       i += static_cast<std::size_t>(job_.world)) {
    mine.push_back(i);
  }
  std::int64_t correct = 0;
  const std::size_t eb = 256;
  for (std::size_t b = 0; b < mine.size(); b += eb) {
    const std::size_t n = std::min(eb, mine.size() - b);
    Batch batch = MakeBatch(test_, mine.data() + b, n, false, 0);
    const long ln = static_cast<long>(n);
    auto x = torch::from_blob(batch.images.data(), {ln, 3, kSide, kSide}).to(dev_);
    if (o_.channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
    auto y = torch::from_blob(batch.labels.data(), {ln}, torch::kInt64).to(dev_);
    torch::Tensor out;
    {
      AutocastScope amp(o_.amp != Amp::kOff, AmpType());
      out = model_->forward(x);
    }
    correct += out.argmax(1).eq(y).sum().item<std::int64_t>();
  }
  model_->train();
  const auto sums = SumOverRanks(job_, {correct, static_cast<std::int64_t>(mine.size())}, dev_);
  return static_cast<double>(sums[0]) / static_cast<double>(std::max<std::int64_t>(sums[1], 1));
}

// The ranks must hold the same parameters; rank 0 says so and writes --metrics-json.
void Training::Finish(double wall_seconds) {
  const auto hashes = GatherFromRanks(job_, ParameterHash(*model_), dev_);
  const bool identical =
      std::all_of(hashes.begin(), hashes.end(), [&](std::int64_t h) { return h == hashes[0]; });
  const double ips_worker = static_cast<double>(images_trained_) / std::max(train_seconds_, 1e-9);
  if (job_.rank == 0) {
    const double final_acc = accuracies_.empty() ? -1 : accuracies_.back();
    char line[256];
    std::snprintf(line, sizeof(line),
                  "done: %d epoch(s) from epoch %d in %.1f s; %.1f images/s per worker (%d "
                  "worker(s)); final test accuracy %.2f %%; parameters identical on all "
                  "ranks: %s",
                  o_.epochs - start_epoch_, start_epoch_, wall_seconds, ips_worker, job_.world,
                  final_acc * 100, identical ? "yes" : "NO");
    progress_.Line(line);
    if (!o_.metrics_json.empty()) {
      WriteMetrics(hashes, identical, wall_seconds, ips_worker);
    }
  }
  if (!identical) Die(job_, 1, "parameters differ between ranks after training");
}

void Training::WriteMetrics(const std::vector<std::int64_t>& hashes, bool identical,
                            double wall_seconds, double ips_worker) {
  const nlohmann::json m{{"model", o_.model},
                         {"device", cuda_ ? "cuda" : "cpu"},
                         {"world_size", job_.world},
                         {"batch_size", o_.batch_size},
                         {"epochs", o_.epochs},
                         {"start_epoch", start_epoch_},
                         {"restart_count", job_.restart},
                         {"amp", Name(o_.amp)},
                         {"channels_last", o_.channels_last},
                         {"threads", threads_},
                         {"train_images", train_.size()},
                         {"images_trained", images_trained_},
                         {"train_seconds", train_seconds_},
                         {"data_wait_seconds", data_wait_seconds_},
                         {"host_seconds", host_.Json()},
                         {"images_per_second_per_worker", ips_worker},
                         {"wall_seconds", wall_seconds},
                         {"final_train_loss", last_loss_},
                         {"skipped_steps", skipped_steps_},
                         {"test_accuracy", accuracies_},
                         {"parameter_hashes", hashes},
                         {"parameters_identical", identical}};
  std::ofstream f(o_.metrics_json);
  f << m.dump() << "\n";
  f.close();
  if (!f) Die(job_, 1, "cannot write --metrics-json " + o_.metrics_json);
}

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
  auto o = crun::train::ParseOptions(std::vector<std::string>(argv + 1, argv + argc));
  if (!o.ok()) {
    std::fprintf(stderr, "train: %s\n", o.status().message().c_str());
    return 2;
  }
  if (o->help) {
    std::printf("%s", crun::train::Usage().c_str());
    return 0;
  }
  try {
    return crun::train::Training(*o).Run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train: %s\n", e.what());
    return 1;
  }
}
