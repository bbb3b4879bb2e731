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
  // The next delay (microsecond resolution, so that a 5 ms start keeps its jitter).
  std::chrono::microseconds Next();
  // Back to `initial`, after a success.
  void Reset() { base_ms_ = initial_ms_; }

 private:
  double initial_ms_;
  double base_ms_;
  double max_ms_;
  double multiplier_;
  double jitter_;
  std::mt19937_64 rng_;
};

}  // namespace crun
