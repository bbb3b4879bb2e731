// libtorch glue (CRUN_WITH_TORCH): data-parallel training of a torch::nn::Module over any
// ProcessGroup.
//
//   BroadcastParameters(group, model);        // every rank starts from rank 0's weights
//   GradientAverager avg(group, model);       // hooks the parameters once
//   for (...) {
//     optimizer.zero_grad();
//     loss.backward();                        // buckets are averaged while backward runs
//     avg.Finish();                           // waits; .grad() now holds the average
//     optimizer.step();
//   }
//
// Gradients are averaged in flat buckets of about `bucket_bytes`. A bucket starts its
// asynchronous allreduce as soon as backward has produced all of its gradients, and buckets
// start in one fixed order on every rank, so communication overlaps the rest of backward.
// One backward per Finish() (a second one makes Finish() return an error); a parameter that
// got no gradient on a rank counts as zero there.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include "crun/worker/checkpoint.h"
#include "crun/worker/process_group.h"
#include "crun/worker/snapshot.h"

namespace crun::worker {

// Copies rank `root`'s parameters and buffers to every rank.
Status BroadcastParameters(ProcessGroup& group, torch::nn::Module& module, int root = 0);

class GradientAverager {
 public:
  GradientAverager(ProcessGroup& group, torch::nn::Module& module,
                   std::size_t bucket_bytes = 25u << 20);
  ~GradientAverager();
  GradientAverager(const GradientAverager&) = delete;
  GradientAverager& operator=(const GradientAverager&) = delete;

  // After backward: starts what has not started, waits for every bucket, and writes the
  // averages into the parameters' .grad(). The first error (naming the bucket) is returned.
  Status Finish();

  std::size_t bucket_count() const;

 private:
  struct State;
  std::shared_ptr<State> state_;  // shared with the autograd hooks
};

// One step of `optimizer` (its momentum, dampening, Nesterov and weight decay, per parameter
// group) as a handful of multi-tensor kernels (torch's _foreach ops) instead of several
// kernels per parameter: on a GPU the host queues ~5 launches, not ~5 per parameter. The
// arithmetic and the state (its momentum buffers) are the optimizer's own, so snapshots and
// checkpoints are unchanged; a step that must create momentum buffers (the first) is the
// optimizer's own step(), and returns false.
bool FusedSgdStep(torch::optim::SGD& optimizer);

// Rank 0 saves `module` (and `optimizer`, if given) as checkpoint `step`, atomically; other
// ranks do nothing.
Status SaveCheckpoint(ProcessGroup& group, CheckpointDir& dir, std::uint64_t step,
                      torch::nn::Module& module, torch::optim::Optimizer* optimizer = nullptr);
// The same, for a program that knows its rank without a group (rank 0 writes).
Status SaveCheckpoint(int rank, CheckpointDir& dir, std::uint64_t step, torch::nn::Module& module,
                      torch::optim::Optimizer* optimizer = nullptr);

// Every rank loads the newest checkpoint, if there is one, and returns its step.
// `device`: where the saved tensors are loaded to (the module's device; default: where they
// were saved from).
StatusOr<std::optional<std::uint64_t>> LoadNewestCheckpoint(
    CheckpointDir& dir, torch::nn::Module& module, torch::optim::Optimizer* optimizer = nullptr,
    std::optional<torch::Device> device = std::nullopt);

// Snapshots in the node's memory (crun/worker/snapshot.h). The items of a training state:
// `module`'s parameters ("param/NAME") and buffers ("buffer/NAME"), each as its raw bytes, and
// the optimizer's state: SGD's momentum buffers as raw tensors ("sgd.momentum/I", in the order
// of the optimizer's parameters), any other optimizer as its serialised archive (one item).
// The tensors must not change until SnapshotStore::Save returns.
StatusOr<std::vector<SnapshotItem>> SnapshotItemsOf(torch::nn::Module& module,
                                                    torch::optim::Optimizer* optimizer = nullptr);
// Puts a loaded snapshot's items back into `module` and `optimizer`; an error names the item
// that is missing or does not fit (its dtype or size).
Status RestoreSnapshot(const LoadedSnapshot& snapshot, torch::nn::Module& module,
                       torch::optim::Optimizer* optimizer = nullptr);

}  // namespace crun::worker
