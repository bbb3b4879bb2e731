// Which samples this rank trains on in an epoch, torch's DistributedSampler semantics without
// the tensor library: every epoch one permutation of the dataset, the same on every rank
// (seeded by seed + epoch), dealt out rank by rank so that the shards are disjoint and equal
// in size. With drop_last the tail that does not divide evenly is dropped; without it the
// permutation is padded by repeating its start.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "crun/base/status.h"

namespace crun::worker {

struct SamplerOptions {
  bool shuffle = true;
  std::uint64_t seed = 0;
  bool drop_last = false;
};

class DistributedSampler {
 public:
  // kInvalidArgument naming them when rank is not in [0, world_size).
  static StatusOr<DistributedSampler> Create(std::size_t dataset_size, int rank, int world_size,
                                             SamplerOptions options = {});

  void set_epoch(std::uint64_t epoch) { epoch_ = epoch; }
  // Samples per rank and epoch.
  std::size_t size() const { return per_rank_; }
  // This rank's sample indices for the current epoch, in training order.
  std::vector<std::size_t> indices() const;

 private:
  DistributedSampler(std::size_t dataset_size, int rank, int world_size, SamplerOptions options);

  std::size_t dataset_size_;
  int rank_;
  int world_size_;
  SamplerOptions options_;
  std::size_t per_rank_;
  std::uint64_t epoch_ = 0;
};

}  // namespace crun::worker
