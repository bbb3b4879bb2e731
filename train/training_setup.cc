// Training (training.h), set up to train: its job, device, process group, data, model, and the
// state it resumes from (crun's snapshots, --checkpoint-dir).
#include <torch/cuda.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "crun/worker/heartbeat.h"
#include "crun/worker/sampler.h"
#include "train/training.h"
#ifdef CRUN_WITH_GLOO
#include "crun/worker/gloo.h"
#endif
#ifdef CRUN_WITH_NCCL
#include "crun/worker/nccl.h"
#endif

namespace crun::train {

// Under crun or torchrun the environment names the job; a broken one is an error. Run by
// hand (no WORLD_SIZE at all) it trains alone.
void Training::JoinJob() {
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
void Training::Place() {
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
void Training::FormGroup() {
  if (!job_.context) return;
  StatusOr<std::unique_ptr<ProcessGroup>> made =
      InvalidArgument(std::string("--device ") + (cuda_ ? "cuda" : "cpu") +
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
void Training::LoadData() {
  std::string dir = o_.data_dir;
  if (o_.synthetic > 0) {
    if (dir.empty()) {
      dir =
          (std::filesystem::temp_directory_path() /
           ("crun-train-synthetic-" + std::to_string(o_.synthetic) + "-" + std::to_string(o_.seed)))
              .string();
    }
    const auto t0 = Clock::now();
    const auto test_images = static_cast<std::size_t>(std::max<std::int64_t>(o_.synthetic / 5, 10));
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

void Training::BuildModel() {
  model_ = MakeModel(o_.model);
  model_->to(dev_);
  if (o_.channels_last) {
    torch::NoGradGuard ng;
    for (auto& p : model_->parameters()) {
      if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
    }
  }
  optimizer_ =
      std::make_unique<torch::optim::SGD>(model_->parameters(), torch::optim::SGDOptions(o_.lr)
                                                                    .momentum(o_.momentum)
                                                                    .nesterov(o_.momentum > 0)
                                                                    .weight_decay(o_.weight_decay));
}

// The newest snapshot every rank holds in crun's node memory (docs/checkpoints.md): each
// rank gets its own state back (batch-norm statistics differ between ranks until an epoch
// ends). False when there is none, or no store.
bool Training::ResumeFromSnapshot() {
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
    Die(job_, 1, "the snapshot at step " + std::to_string(snap.step) + " has no " + kPositionItem);
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

void Training::SaveSnapshot(std::uint64_t global_step, const Position& at) {
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
void Training::Resume() {
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

void Training::Announce() {
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

}  // namespace crun::train
