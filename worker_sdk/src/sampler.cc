#include "crun/worker/sampler.h"

#include <numeric>
#include <random>
#include <string>

namespace crun::worker {

StatusOr<DistributedSampler> DistributedSampler::Create(std::size_t dataset_size, int rank,
                                                        int world_size, SamplerOptions options) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return InvalidArgument("DistributedSampler: rank " + std::to_string(rank) +
                           " is not in a world of " + std::to_string(world_size));
  }
  return DistributedSampler(dataset_size, rank, world_size, options);
}

DistributedSampler::DistributedSampler(std::size_t dataset_size, int rank, int world_size,
                                       SamplerOptions options)
    : dataset_size_(dataset_size), rank_(rank), world_size_(world_size), options_(options) {
  const auto w = static_cast<std::size_t>(world_size);
  per_rank_ = options.drop_last ? dataset_size / w : (dataset_size + w - 1) / w;
}

std::vector<std::size_t> DistributedSampler::indices() const {
  std::vector<std::size_t> order(dataset_size_);
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (options_.shuffle) {
    // Fisher-Yates driven by mt19937_64, whose output the standard fixes: every rank, on
    // every platform, draws the same permutation. (std::shuffle's is unspecified.)
    std::mt19937_64 rng(options_.seed + epoch_);
    for (std::size_t i = order.size(); i > 1; --i) {
      const std::size_t j = static_cast<std::size_t>(rng() % i);
      std::swap(order[i - 1], order[j]);
    }
  }
  const auto w = static_cast<std::size_t>(world_size_);
  const std::size_t total = per_rank_ * w;
  // Pad by repeating the start (possibly more than once for tiny datasets), or truncate.
  for (std::size_t i = 0; order.size() < total && dataset_size_ > 0; ++i) {
    order.push_back(order[i]);
  }
  order.resize(dataset_size_ == 0 ? 0 : total);
  std::vector<std::size_t> mine;
  mine.reserve(per_rank_);
  for (std::size_t i = static_cast<std::size_t>(rank_); i < order.size(); i += w) {
    mine.push_back(order[i]);
  }
  return mine;
}

}  // namespace crun::worker
