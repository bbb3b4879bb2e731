// Training (train.cc): one worker's training, declared for its two halves. training_setup.cc
// sets the worker up (its job, device, process group, data, model, and the state it resumes
// from); train.cc runs the loop (epochs, steps, fp16 loss scaling, evaluation) and the end (the
// check that every rank holds the same parameters, --metrics-json). Includes libtorch.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "crun/worker/checkpoint.h"
#include "crun/worker/context.h"
#include "crun/worker/snapshot.h"
#include "crun/worker/torch.h"
#include "train/cifar.h"
#include "train/model.h"
#include "train/options.h"
#include "train/progress.h"

namespace crun::train {

using Clock = std::chrono::steady_clock;
using crun::worker::ProcessGroup;

struct Job {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  int local_world = 1;
  int restart = 0;
  std::unique_ptr<worker::Context> context;  // none when run without a launcher
  std::unique_ptr<ProcessGroup> group;
};

[[noreturn]] inline void Die(const Job& job, int code, const std::string& what) {
  std::fprintf(stderr, "train: rank %d: %s\n", job.rank, what.c_str());
  std::fflush(stderr);
  std::_Exit(code);
}

inline void Check(const Job& job, const Status& s, const std::string& what) {
  if (!s.ok()) Die(job, 1, what + ": " + s.ToString());
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

// Every rank's value of `x` (on the group's device).
std::vector<std::int64_t> GatherFromRanks(Job& job, std::int64_t x, torch::Device dev);

class Training {
 public:
  explicit Training(const Options& o)
      : o_(o), progress_(false, o.log_every), loss_scale_(o.amp == Amp::kFp16 ? 65536.0 : 1.0) {}

  int Run();

 private:
  // ---- a worker set up to train (training_setup.cc) ----
  void JoinJob();
  void Place();
  void FormGroup();
  void LoadData();
  void BuildModel();

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
  bool ResumeFromSnapshot();
  void SaveSnapshot(std::uint64_t global_step, const Position& at);
  void Resume();
  void Announce();
  // ---- the loop and the end (train.cc) ----
  void RunEpoch(int epoch);
  double TrainEpoch(int epoch);
  torch::Tensor TrainStep(Batch& batch, double lr);
  bool UnscaleGradients();
  double Evaluate();
  void Finish(double wall_seconds);

  void WriteMetrics(const std::vector<std::int64_t>& hashes, bool identical, double wall_seconds,
                    double ips_worker);

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

}  // namespace crun::train
