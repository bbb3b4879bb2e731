// train: CIFAR-10 on libtorch and crun's worker SDK, the reference workload
// (`crun --nproc-per-node 2 train --synthetic 10000`). The one translation unit that includes
// libtorch; options and data live in options.cc and cifar.cc. docs/train.md describes it.
#include <torch/cuda.h>
#include <torch/torch.h>
#include <unistd.h>
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
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "crun/worker/checkpoint.h"
#include "crun/worker/context.h"
#include "crun/worker/heartbeat.h"
#include "crun/worker/sampler.h"
#include "crun/worker/snapshot.h"
#include "crun/worker/torch.h"
#include "train/cifar.h"
#include "train/model.h"
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
  // One plain copy on this thread: copy_ would wake the intra-op pool for 3 MiB.
  std::memcpy(pinned.data_ptr(), host.data_ptr(), host.nbytes());
  return pinned.to(dev, /*non_blocking=*/true);
}

// Host time of each part of a training step, summed over the run: on a GPU, where the host
// only queues work, a part that stands out is where a CPU-bound loop spends its time.
struct HostTimes {
  double input = 0, forward = 0, backward = 0, average = 0, optimizer = 0;
  nlohmann::json Json() const {
    return {{"input", input},
            {"forward", forward},
            {"backward", backward},
            {"average", average},
            {"optimizer", optimizer}};
  }
};

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

// Every rank's value of `x`.
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
      const int filled =
          static_cast<int>(width * static_cast<double>(step) / static_cast<double>(steps));
      std::printf("\repoch %d/%d [%s%s] %zu/%zu loss %.4f lr %.4f %.0f img/s ETA %s ", epoch,
                  epochs, std::string(static_cast<std::size_t>(filled), '#').c_str(),
                  std::string(static_cast<std::size_t>(width - filled), '.').c_str(), step, steps,
                  loss, lr, images_per_s, Hms(eta_s).c_str());
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

// One worker's training, step by step: join the job, place it on a device, form the process
// group, load the data, build (or resume) the model, run the epochs, check and report.
class Training {
 public:
  explicit Training(const Options& o)
      : o_(o), progress_(false, o.log_every), loss_scale_(o.amp == Amp::kFp16 ? 65536.0 : 1.0) {}

  int Run() {
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

 private:
  // Under crun or torchrun the environment names the job; a broken one is an error. Run by
  // hand (no WORLD_SIZE at all) it trains alone.
  void JoinJob() {
    if (std::getenv("WORLD_SIZE") == nullptr) return;
    auto ctx = worker::Context::FromEnvironment();
    if (!ctx.ok()) Die(job_, 2, ctx.status().ToString());
    job_.context = std::move(*ctx);
    const auto& env = job_.context->env();
    job_.rank = env.rank;
    job_.world = env.world_size;
    job_.local_rank = env.local_rank;
    job_.local_world = env.local_world_size;
    job_.restart = env.restart_count;
  }

  // The device (local rank's GPU, or the CPU) and the threads for compute and loading.
  void Place() {
    const bool have_cuda = torch::cuda::is_available();
    if (o_.device == Device::kCuda && !have_cuda) {
      Die(job_, 2,
          "--device cuda: no CUDA device visible to this libtorch "
          "(torch::cuda::device_count() = " +
              std::to_string(torch::cuda::device_count()) + ")");
    }
    cuda_ = o_.device == Device::kCuda || (o_.device == Device::kAuto && have_cuda);
    if (o_.amp != Amp::kOff && !cuda_) {
      Die(job_, 2, "--amp " + std::string(Name(o_.amp)) + " needs a CUDA device");
    }
    if (cuda_) {
      const auto gpus = std::max<std::int64_t>(torch::cuda::device_count(), 1);
      dev_ = torch::Device(torch::kCUDA, static_cast<int>(job_.local_rank % gpus));
    }
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const int per_worker = cores / std::max(1, job_.local_world);
    threads_ = o_.threads > 0 ? o_.threads : std::max(1, per_worker);
    loader_threads_ =
        o_.loader_threads > 0 ? o_.loader_threads : (cuda_ ? std::clamp(per_worker - 1, 1, 8) : 1);
    torch::set_num_threads(threads_);
    torch::manual_seed(o_.seed);
  }

  // The process group: NCCL for GPUs, Gloo for CPUs.
  void FormGroup() {
    if (!job_.context) return;
    StatusOr<std::unique_ptr<ProcessGroup>> made = InvalidArgument(
        std::string("--device ") + (cuda_ ? "cuda" : "cpu") +
        " under a launcher needs a build with the " +
        (cuda_ ? "NCCL backend (CRUN_WITH_NCCL)" : "Gloo backend (CRUN_WITH_GLOO)"));
    if (cuda_) {
#ifdef CRUN_WITH_NCCL
      worker::NcclOptions no;
      no.name = "train";
      no.device = dev_.index();
      made = worker::MakeNcclGroup(*job_.context, no);
#endif
    } else {
#ifdef CRUN_WITH_GLOO
      worker::GlooOptions go;
      go.name = "train";
      made = worker::MakeGlooGroup(*job_.context, go);
#endif
    }
    if (!made.ok()) {
      Die(job_, made.status().code() == StatusCode::kInvalidArgument ? 2 : 1,
          made.status().ToString());
    }
    job_.group = std::move(*made);
  }

  // The binary files, generated first with --synthetic.
  void LoadData() {
    std::string dir = o_.data_dir;
    if (o_.synthetic > 0) {
      if (dir.empty()) {
        dir = (std::filesystem::temp_directory_path() /
               ("crun-train-synthetic-" + std::to_string(o_.synthetic) + "-" +
                std::to_string(o_.seed)))
                  .string();
      }
      const auto t0 = Clock::now();
      const auto test_images =
          static_cast<std::size_t>(std::max<std::int64_t>(o_.synthetic / 5, 10));
      Check(job_,
            WriteSyntheticCifar(dir, static_cast<std::size_t>(o_.synthetic), test_images, o_.seed),
            "generating synthetic CIFAR-10");
      std::ostringstream s;
      s << "synthetic CIFAR-10: " << o_.synthetic << " training images in " << dir << " ("
        << std::chrono::duration<double>(Clock::now() - t0).count() << " s)";
      progress_.Line(s.str());
    }
    auto train_set = LoadCifar(dir, true);
    if (!train_set.ok()) Die(job_, 2, train_set.status().ToString());
    auto test_set = LoadCifar(dir, false);
    if (!test_set.ok()) Die(job_, 2, test_set.status().ToString());
    train_ = std::move(*train_set);
    test_ = std::move(*test_set);
    const auto global_batch =
        static_cast<std::size_t>(o_.batch_size) * static_cast<std::size_t>(job_.world);
    if (train_.size() < global_batch) {
      Die(job_, 2,
          "--batch-size " + std::to_string(o_.batch_size) + " x " + std::to_string(job_.world) +
              " workers is more than the " + std::to_string(train_.size()) + " training images");
    }
  }

  void BuildModel() {
    model_ = MakeModel(o_.model);
    model_->to(dev_);
    if (o_.channels_last) {
      torch::NoGradGuard ng;
      for (auto& p : model_->parameters()) {
        if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
      }
    }
    optimizer_ = std::make_unique<torch::optim::SGD>(model_->parameters(),
                                                     torch::optim::SGDOptions(o_.lr)
                                                         .momentum(o_.momentum)
                                                         .nesterov(o_.momentum > 0)
                                                         .weight_decay(o_.weight_decay));
  }

  // Where training stands, saved with each snapshot so that a resumed run goes on exactly
  // where the saved one was: the batch (the sampler and the augmentation follow from the
  // epoch and the batch number), the epoch's running loss, fp16's loss scale.
  struct Position {
    std::int64_t epoch = 0, step = 0;  // `step` batches of `epoch` done
    double loss_sum = 0;
    std::int64_t loss_n = 0, images_trained = 0;
    double loss_scale = 1;
    std::int64_t good_steps = 0, skipped_steps = 0;
  };
  static constexpr char kPositionItem[] = "train.position";

  // The newest snapshot every rank holds in crun's node memory (docs/checkpoints.md): each
  // rank gets its own state back (batch-norm statistics differ between ranks until an epoch
  // ends). False when there is none, or no store.
  bool ResumeFromSnapshot() {
    snapshot_every_ = o_.snapshot_every < 0 ? (cuda_ ? 50 : 1) : o_.snapshot_every;
    if (snapshot_every_ == 0 || !job_.context) return false;
    auto store = worker::SnapshotStore::Connect(job_.context->env());
    if (!store.ok()) {
      if (store.status().code() != StatusCode::kNotFound) Die(job_, 1, store.status().ToString());
      progress_.Line("train: no snapshots: " + store.status().message());
      return false;
    }
    snapshots_ = std::move(*store);
    auto got = snapshots_->Load(*job_.context);
    if (!got.ok()) Die(job_, 1, "loading the snapshot: " + got.status().ToString());
    if (!got->has_value()) return false;
    const worker::LoadedSnapshot& snap = **got;
    Check(job_, worker::RestoreSnapshot(snap, *model_, optimizer_.get()), "restoring the snapshot");
    const snapshot::Item* item = snap.Find(kPositionItem);
    if (item == nullptr || item->bytes != sizeof(Position)) {
      Die(job_, 1,
          "the snapshot at step " + std::to_string(snap.step) + " has no " + kPositionItem);
    }
    Position at;
    std::memcpy(&at, snap.DataOf(kPositionItem), sizeof at);
    start_epoch_ = static_cast<int>(at.epoch);
    start_step_ = static_cast<std::size_t>(at.step);
    resumed_ = at;
    images_trained_ = at.images_trained;
    loss_scale_ = at.loss_scale;
    good_steps_ = static_cast<int>(at.good_steps);
    skipped_steps_ = at.skipped_steps;
    snapshot_step_ = snap.step;
    return true;
  }

  void SaveSnapshot(std::uint64_t global_step, const Position& at) {
    auto items = worker::SnapshotItemsOf(*model_, optimizer_.get());
    if (!items.ok()) Die(job_, 1, items.status().ToString());
    worker::SnapshotItem position;
    position.name = kPositionItem;
    position.dtype = "bytes";
    position.shape = {static_cast<std::int64_t>(sizeof(Position))};
    position.bytes = sizeof(Position);
    position.fill = [at](unsigned char* dst) { std::memcpy(dst, &at, sizeof at); };
    items->push_back(std::move(position));
    Check(job_, snapshots_->Save(global_step, *items),
          "saving the snapshot of step " + std::to_string(global_step));
  }

  // The state to begin with: the newest snapshot in crun's node memory, else the newest
  // checkpoint on disk, if any; then rank 0's weights everywhere. Every rank must resume
  // from the same epoch (a checkpoint directory not shared by all nodes would break this).
  void Resume() {
    if (ResumeFromSnapshot()) {
      // Every rank has its own state back, at the step they agreed on.
      if (job_.world > 1) {
        averager_ = std::make_unique<worker::GradientAverager>(*job_.group, *model_);
      }
      return;
    }
    if (!o_.checkpoint_dir.empty()) {
      ckpt_.emplace(o_.checkpoint_dir, 2);
      auto loaded = worker::LoadNewestCheckpoint(*ckpt_, *model_, optimizer_.get(), dev_);
      if (!loaded.ok()) Die(job_, 1, loaded.status().ToString());
      if (loaded->has_value()) start_epoch_ = static_cast<int>(**loaded);
    }
    if (!job_.group) return;
    const auto epochs = GatherFromRanks(job_, start_epoch_, dev_);
    for (int r = 0; r < job_.world; ++r) {
      const auto theirs = epochs[static_cast<std::size_t>(r)];
      if (theirs != start_epoch_) {
        Die(job_, 1,
            "rank " + std::to_string(r) + " resumes from epoch " + std::to_string(theirs) +
                ", this rank from " + std::to_string(start_epoch_) +
                ": is --checkpoint-dir shared by every node?");
      }
    }
    Check(job_, worker::BroadcastParameters(*job_.group, *model_), "broadcasting parameters");
    // Gradients are averaged from the first step on, over the parameters as resumed; one
    // worker has nothing to average with.
    if (job_.world > 1) {
      averager_ = std::make_unique<worker::GradientAverager>(*job_.group, *model_);
    }
  }

  void Announce() {
    std::size_t params = 0;
    for (const auto& p : model_->parameters()) params += static_cast<std::size_t>(p.numel());
    std::ostringstream s;
    s << "train: " << o_.model << " (" << params << " parameters) on " << (cuda_ ? "cuda" : "cpu")
      << ", " << job_.world << " worker(s) x batch " << o_.batch_size << ", " << threads_
      << " thread(s) each (+" << loader_threads_ << " loading), backend "
      << (job_.group ? job_.group->backend() : "none") << ", amp " << Name(o_.amp)
      << (o_.channels_last ? ", channels-last" : "") << "; " << train_.size() << " training / "
      << test_.size() << " test images";
    if (resumed_) {
      s << "; resuming at epoch " << start_epoch_ + 1 << " after batch " << start_step_ << " (step "
        << snapshot_step_ << ") from crun's node memory (restart " << job_.restart << ")";
    } else if (start_epoch_ > 0) {
      s << "; resuming after epoch " << start_epoch_ << " (restart " << job_.restart << ")";
    }
    progress_.Line(s.str());
  }

  void RunEpoch(int epoch) {
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
            worker::SaveCheckpoint(job_.rank, *ckpt_, static_cast<std::uint64_t>(epoch + 1),
                                   *model_, optimizer_.get()),
            "saving checkpoint " + std::to_string(epoch + 1));
    }
  }

  // One pass over this rank's share of the training set; the epoch's mean loss.
  double TrainEpoch(int epoch) {
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
  torch::Tensor TrainStep(Batch& batch, double lr) {
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
  bool UnscaleGradients() {
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
  double Evaluate() {
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
  void Finish(double wall_seconds) {
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

  void WriteMetrics(const std::vector<std::int64_t>& hashes, bool identical, double wall_seconds,
                    double ips_worker) {
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

  at::ScalarType AmpType() const { return o_.amp == Amp::kFp16 ? at::kHalf : at::kBFloat16; }

  const Options& o_;
  Job job_;
  Progress progress_;
  bool cuda_ = false;
  torch::Device dev_{torch::kCPU};
  int threads_ = 1, loader_threads_ = 1;
  Dataset train_, test_;
  ResNet model_{nullptr};
  std::unique_ptr<torch::optim::SGD> optimizer_;
  std::unique_ptr<worker::GradientAverager> averager_;
  std::optional<worker::CheckpointDir> ckpt_;
  std::unique_ptr<worker::SnapshotStore> snapshots_;  // none: no snapshots
  int snapshot_every_ = 0;
  std::uint64_t snapshot_step_ = 0;  // the step resumed from
  std::optional<Position> resumed_;  // where the snapshot resumed from left off
  int start_epoch_ = 0;
  std::size_t start_step_ = 0;
  double loss_scale_;  // fp16: dynamic loss scaling; 1 otherwise
  int good_steps_ = 0;
  std::int64_t skipped_steps_ = 0;
  std::vector<double> accuracies_;
  double last_loss_ = 0, train_seconds_ = 0, data_wait_seconds_ = 0;
  HostTimes host_;
  std::int64_t images_trained_ = 0;
};

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
