// Exponential backoff with jitter for connection retries: many workers started together must
// not knock on the store in lock step. Each delay is base * (1 +- jitter), base growing by
// `multiplier` from `initial` up to `max`. Not thread-safe; one per retry loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <random>

namespace crun {

class Backoff {
 public:
  Backoff(std::chrono::milliseconds initial, std::chrono::milliseconds max, double multiplier,
          double jitter, std::uint64_t seed);
  std::chrono::milliseconds Next();

 private:
  double base_ms_;
  double max_ms_;
  double multiplier_;
  double jitter_;
  std::mt19937_64 rng_;
};

}  // namespace crun
