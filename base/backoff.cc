#include "base/backoff.h"

#include <algorithm>

namespace crun {

Backoff::Backoff(std::chrono::milliseconds initial, std::chrono::milliseconds max,
                 double multiplier, double jitter, std::uint64_t seed)
    : initial_ms_(static_cast<double>(initial.count())),
      base_ms_(initial_ms_),
      max_ms_(static_cast<double>(max.count())),
      multiplier_(multiplier),
      jitter_(std::clamp(jitter, 0.0, 1.0)),
      rng_(seed) {}

std::chrono::microseconds Backoff::Next() {
  std::uniform_real_distribution<double> spread(1.0 - jitter_, 1.0 + jitter_);
  const double delay = std::min(base_ms_, max_ms_) * spread(rng_);
  base_ms_ = std::min(base_ms_ * multiplier_, max_ms_);
  return std::chrono::microseconds(static_cast<std::int64_t>(delay * 1000));
}

}  // namespace crun
